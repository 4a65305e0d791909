"""Trainer-side statistics on returned logprobs (lists in, lists out; wraps ``sparrow_server.stats``)."""
from __future__ import annotations

from typing import Sequence


def _tensors(dense: Sequence[float], sparse: Sequence[float]):
    import torch

    if len(dense) != len(sparse):
        raise ValueError(f"dense_logprobs has {len(dense)} values, sparse_logprobs {len(sparse)}")
    return torch.tensor(list(dense), dtype=torch.float64), torch.tensor(list(sparse), dtype=torch.float64)


def truncated_importance_weights(dense_logprobs: Sequence[float], sparse_logprobs: Sequence[float], cap: float) -> list[float]:
    """TIS weights ``min(exp(dense - sparse), cap)`` per token (paper Eq. 1)."""
    from sparrow_server.stats.acceptance import truncated_importance_weights as tis

    return tis(*_tensors(dense_logprobs, sparse_logprobs), cap).tolist()


def sampled_acceptance(dense_logprobs: Sequence[float], sparse_logprobs: Sequence[float]) -> list[float]:
    """Per-token ``min(1, p_dense / p_sparse)`` of the sampled tokens (tokens drawn from the sparse policy)."""
    from sparrow_server.stats.acceptance import sampled_acceptance as acc

    return acc(*_tensors(dense_logprobs, sparse_logprobs)).tolist()


def acceptance_estimate(dense_logprobs: Sequence[float], sparse_logprobs: Sequence[float]) -> float:
    """Unbiased estimate of the mean acceptance from sampled tokens (mean of ``sampled_acceptance``)."""
    values = sampled_acceptance(dense_logprobs, sparse_logprobs)
    if not values:
        raise ValueError("no tokens")
    return sum(values) / len(values)
