"""Batch-invariant sparse decode under SGLang's deterministic inference (``--enable-deterministic-inference``,
also forced by ``--rl-on-policy-target``; issue 23). Pure functions, no SGLang or GPU import.

In that mode SGLang makes GEMMs, norms and log-softmax batch-invariant, samples with the pytorch
backend and per-request seeds, and plans its FlashInfer backend so that a request's attention does not
depend on the batch (SGLang 0.5.17 ``layers/attention/flashinfer_backend.py:398-416``): tensor-core
decode (FlashInfer's prefill kernel, whose plan takes a split size), with a fixed KV split of
``SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE`` tokens (default 2048) eagerly (``:912-923``) and no KV
split under CUDA graphs (``:720-730``), where FlashInfer's plan must fit the grid fixed at capture.
The sparrow backend inherits all of that for prefill and the server's dense layers; ``decode_split``
gives its block-sparse decode the same policy (FlashInfer's units are pages of 16 tokens there).

Outside that mode FlashInfer chooses each row's KV chunks from the whole batch (its decode plan's
binary search over every row's page count: ``attention/scheduler.cuh``,
``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch`` / ``PrefillBinarySearchKVChunkSize``), so
a request's partial softmax states, and the order they are merged in, depend on its neighbours. The
kernel there is SGLang's own choice for its dense decode (``decode_use_tensor_cores``:
``should_use_tensor_core``, tensor cores from a GQA group of 4 in bf16, or
``SGLANG_FLASHINFER_USE_TENSOR_CORE``): each sparse row is one KV head and its group of query heads,
the shape that choice is made for. On an H200 at 16K x 48, Qwen3-4B (group 4), the CUDA-core kernel read
the selected KV at 2.1 TB/s where SGLang's tensor-core decode read the dense KV at 4.2
(``benchmarks/results/speed/call21/profile_4b/``).

``truncation_align_size``: SGLang aligns a chunked prefill's cut to FlashInfer's prefill split tile
only when ``--attention-backend flashinfer`` (``managers/scheduler.py:1479-1494``); sparrow's prefill
is FlashInfer's, so the plug-in sets the same alignment for it (``install``: an AFTER hook on
``Scheduler.init_deterministic_inference_config``).

SGLang applies that alignment in ``PrefillAdder.add_one_req`` only: a request with ``ignore_eos`` and
the radix cache off (as deterministic inference leaves it for sparrow) is admitted by
``add_one_req_ignore_eos`` (``managers/schedule_policy.py:1071``), which cuts it wherever the batch's
chunk budget ends. The cut then moves with the batch, and with it the request's prefill: on the GPU
the 2,600-token prompt cut at 1,872 tokens in one batch and whole in another gave first-token
logprobs 0.17 apart (``tests/gpu/test_deterministic.py``). ``around_add_one_req`` gives that path the
same rule as the other: a cut at a multiple of the alignment, or the request waits for the next batch.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

from sparrow_server.sglang_plugin.config import BACKEND_NAME

ENV_DECODE_SPLIT_TILE = "SGLANG_FLASHINFER_DECODE_SPLIT_TILE_SIZE"    # SGLang's, read by its backend
ENV_PREFILL_SPLIT_TILE = "SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE"  # SGLang's, read by its scheduler
DEFAULT_DECODE_SPLIT_TOKENS = 2048   # SGLang 0.5.17's defaults of the two
DEFAULT_PREFILL_SPLIT_TOKENS = 4096
CONFIG_TARGET = "sglang.srt.managers.scheduler.Scheduler.init_deterministic_inference_config"
ADD_REQ_TARGET = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
IGNORE_EOS_LINE = "sparrow: deterministic inference: ignore_eos prefill cuts aligned to %d tokens"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeSplit:
    """How the sparse decode's FlashInfer plan splits each (request, KV head) row's KV.

    ``use_tensor_cores``: FlashInfer's tensor-core decode (its prefill kernel; the one whose plan takes
    a split size). ``fixed_split_size``: pages per KV chunk of every row, or None (FlashInfer's choice,
    or no split with ``disable_split_kv``)."""

    use_tensor_cores: bool
    fixed_split_size: int | None
    disable_split_kv: bool

    @property
    def batch_invariant(self) -> bool:
        """Each row's chunks follow from its own length only (FlashInfer does not search the batch)."""
        return self.use_tensor_cores and (self.disable_split_kv or self.fixed_split_size is not None)

    def plan_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of FlashInfer's ``plan`` / ``fast_decode_plan``."""
        return {"fixed_split_size": self.fixed_split_size, "disable_split_kv": self.disable_split_kv}


FLASHINFER_CHOICE = DecodeSplit(use_tensor_cores=False, fixed_split_size=None, disable_split_kv=False)
NO_SPLIT = DecodeSplit(use_tensor_cores=True, fixed_split_size=None, disable_split_kv=True)


def decode_split(deterministic: bool, graph: bool, split_tile_tokens: int | None, page_size: int,
                 tensor_cores: bool = False) -> DecodeSplit:
    """The split of one decode step's sparse plan. Depends on the mode (and, eagerly, the tile), never
    on the batch: outside deterministic inference FlashInfer's own split, on the kernel SGLang chose for
    its dense decode (``tensor_cores``); in it, SGLang's FlashInfer policy: tensor cores, no KV split
    under CUDA graphs, chunks of ``split_tile_tokens`` (SGLang's decode tile, rounded up to pages) eagerly."""
    if page_size < 1:
        raise ValueError(f"page_size={page_size}: must be >= 1")
    if not deterministic:
        return replace(FLASHINFER_CHOICE, use_tensor_cores=bool(tensor_cores))
    if graph:
        return NO_SPLIT
    tokens = DEFAULT_DECODE_SPLIT_TOKENS if split_tile_tokens is None else int(split_tile_tokens)
    if tokens < 1:
        raise ValueError(f"decode split tile of {tokens} tokens: must be >= 1")
    return DecodeSplit(use_tensor_cores=True, fixed_split_size=math.ceil(tokens / page_size), disable_split_kv=False)


def backend_splits(backend: Any, page_size: int) -> tuple[DecodeSplit, DecodeSplit]:
    """(eager, graph) splits of a backend built on SGLang's ``FlashInferAttnBackend``, from what its
    ``__init__`` set: ``enable_deterministic``, ``decode_split_tile_size`` (absent: not deterministic) and
    ``decode_use_tensor_cores`` (absent: CUDA-core decode)."""
    deterministic = bool(getattr(backend, "enable_deterministic", False))
    tile = getattr(backend, "decode_split_tile_size", None)
    cores = bool(getattr(backend, "decode_use_tensor_cores", False))
    return tuple(decode_split(deterministic, graph, tile, page_size, cores) for graph in (False, True))


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    """As SGLang's ``get_int_env_var``: unset, blank or not an integer gives the default."""
    text = (env.get(name) or "").strip()
    try:
        return int(text) if text else default
    except ValueError:
        return default


def truncation_align_size(attention_backend: str | None, deterministic: bool, env: Mapping[str, str]) -> int | None:
    """Chunked-prefill truncation alignment of a deterministic sparrow server: what SGLang sets for
    ``flashinfer`` (its prefill split tile), None otherwise."""
    if not deterministic or attention_backend != BACKEND_NAME:
        return None
    return _int_env(env, ENV_PREFILL_SPLIT_TILE, DEFAULT_PREFILL_SPLIT_TOKENS)


def after_init_deterministic_config(result, scheduler, *args, **kwargs):
    """AFTER ``Scheduler.init_deterministic_inference_config``: align a sparrow server's chunked
    prefill as SGLang aligns a flashinfer one (left alone when SGLang set an alignment itself)."""
    import os

    server_args = getattr(scheduler, "server_args", None)
    if server_args is None or getattr(scheduler, "truncation_align_size", None) is not None:
        return None
    size = truncation_align_size(getattr(server_args, "attention_backend", None),
                                 bool(getattr(server_args, "enable_deterministic_inference", False)), os.environ)
    if size is not None:
        scheduler.truncation_align_size = size
        # The GPU test looks for this line: without the alignment a chunked prefill's cut moves with the batch.
        logger.info("sparrow: deterministic inference: chunked prefill aligned to %d tokens", size)
    return None


def aligned_cut(rem_chunk_tokens: int | None, extend_tokens: int, align: int | None) -> int | None:
    """Tokens of a request the batch may prefill when its admission would cut it: None when nothing
    changes (no alignment, no chunked prefill, the request fits whole), else the batch's chunk budget
    rounded down to the alignment (0: the request waits for the next batch)."""
    if align is None or rem_chunk_tokens is None or extend_tokens <= rem_chunk_tokens:
        return None
    return align * (max(rem_chunk_tokens, 0) // align)


def _admitted_as_ignore_eos(adder, req) -> bool:
    """SGLang 0.5.17's own test for ``add_one_req_ignore_eos`` (``schedule_policy.py:1071``)."""
    return bool(req.sampling_params.ignore_eos) and getattr(adder.tree_cache, "disable", True)


_logged_ignore_eos = False  # each line once per scheduler process
_warned_unaligned = False


def _warn_unaligned(budget: int, align: int) -> None:
    global _warned_unaligned
    if not _warned_unaligned:
        _warned_unaligned = True
        logger.warning("sparrow: deterministic inference: a prefill batch of %d tokens holds less than one %d-token "
                       "tile; ignore_eos requests longer than it are cut unaligned and depend on their batch "
                       "(raise --chunked-prefill-size to a multiple of %d)", budget, align, align)


def around_add_one_req(original, adder, req, has_chunked_req, truncation_align_size=None):
    """AROUND ``PrefillAdder.add_one_req``: an ignore_eos request's cut aligned as any other's."""
    global _logged_ignore_eos
    if not _admitted_as_ignore_eos(adder, req):
        return original(adder, req, has_chunked_req, truncation_align_size)
    cut = aligned_cut(adder.rem_chunk_tokens, len(req.full_untruncated_fill_ids) - len(req.prefix_indices),
                      truncation_align_size)
    if cut is None:
        return original(adder, req, has_chunked_req, truncation_align_size)
    if cut == 0 and not adder.can_run_list:  # an empty batch takes it unaligned rather than stall
        _warn_unaligned(adder.rem_chunk_tokens, truncation_align_size)
        return original(adder, req, has_chunked_req, truncation_align_size)
    if not _logged_ignore_eos:
        _logged_ignore_eos = True
        logger.info(IGNORE_EOS_LINE, truncation_align_size)
    if cut == 0:
        from sglang.srt.managers.schedule_policy import AddReqResult

        return AddReqResult.OTHER
    budget = adder.rem_chunk_tokens
    adder.rem_chunk_tokens = cut
    try:
        return original(adder, req, has_chunked_req, truncation_align_size)
    finally:
        adder.rem_chunk_tokens += budget - cut  # what the cut used comes off the batch's real budget


def install(hook_registry, hook_type) -> None:
    hook_registry.register(CONFIG_TARGET, after_init_deterministic_config, hook_type.AFTER)
    hook_registry.register(ADD_REQ_TARGET, around_add_one_req, hook_type.AROUND)


__all__ = ["DecodeSplit", "FLASHINFER_CHOICE", "decode_split", "backend_splits", "truncation_align_size",
           "after_init_deterministic_config", "aligned_cut", "around_add_one_req", "install", "CONFIG_TARGET",
           "ADD_REQ_TARGET"]
