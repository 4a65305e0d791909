"""The query copy the sparse backend asks of the selection's launch is the same at every batch size: one request's
slice of the QKV output reads as contiguous (PyTorch ignores a size-1 dimension's stride), and deciding by
``is_contiguous`` made batch 1's graph a launch without the copy, another compile of the kernel (the ~20 s compile
pause of batch 1's graph capture in call 45, gone in call 46). The copying launch reads that slice and copies it
exactly: the interpreter case ``test_query_copy_reads_a_strided_query_and_copies_it`` in ``sparse_kernel_cases.py``."""
from __future__ import annotations

import pytest
import torch

from sparrow_server.kernels import sparse_decode as K

HQ, H, D = 16, 8, 128


def _query_slice(batch: int) -> torch.Tensor:
    """SGLang's decode query: the first HQ * D of each token's QKV row, as the backend reshapes it."""
    qkv = torch.randn(batch, (HQ + 2 * H) * D)
    return qkv[:, :HQ * D].reshape(-1, HQ, D)


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_a_copying_variant_copies_at_every_batch_size(batch):
    q = _query_slice(batch)
    assert q.is_contiguous() == (batch == 1)  # why a decision by contiguity split batch 1 from the others
    q_out = K.query_copy(q, K.copies_query("fused_kvstore_narrow"))
    assert q_out is not None and q_out.shape == q.shape and q_out.dtype == q.dtype and q_out.is_contiguous()
    K._check_query_copy(q, q_out)  # the launch's own check of the pair


def test_a_variant_that_does_not_copy_gets_no_buffer():
    assert not K.copies_query("fused_hoisted_narrow")
    assert K.query_copy(_query_slice(2), K.copies_query("fused_hoisted_narrow")) is None
