"""A model of how FlashInfer 0.6.15's decode plan cuts each row's KV into chunks (read from
``include/flashinfer/attention/scheduler.cuh`` of the wheel; not FlashInfer's code): which pages of a
(request, KV head) row each work item attends, whose partial results are then merged. Two rows whose
chunks are equal are computed by the same work items in the same merge order; a row whose chunks move
with its neighbours' lengths rounds differently in another batch.

- CUDA-core decode (``DecodePlan``, ``BatchDecodeWithPagedKVCacheWorkEstimationDispatched``): no split
  when the rows fill the grid; else the smallest chunk (at least 128 tokens) that keeps the whole batch's
  work items within the grid (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``), always split
  under CUDA graphs.
- Tensor-core decode (``PrefillPlan`` / ``PrefillSplitQOKVIndptr``): no split with ``disable_split_kv``,
  ``fixed_split_size`` pages per chunk when given, else the smallest chunk that keeps the batch's work
  items within two CTAs per SM per KV head (``PrefillBinarySearchKVChunkSize``).

The grid of the CUDA-core kernel is its occupancy times the SM count, which only the GPU knows:
``decode_blocks_per_sm`` stands in for it (any value shows the dependence on the batch).
"""
from __future__ import annotations

from typing import Sequence

NUM_SM = 132  # H100 / H200


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _search(lo: int, hi: int, too_many) -> int:
    """Smallest chunk in [lo, hi] whose work-item count is not ``too_many`` (FlashInfer's binary search)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if too_many(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _chunks(pages: int, chunk: int | None) -> tuple[tuple[int, int], ...]:
    pages = max(pages, 1)
    if chunk is None:
        return ((0, pages),)
    return tuple((s, min(s + chunk, pages)) for s in range(0, pages, chunk))


def row_chunks(row_pages: Sequence[int], *, use_tensor_cores: bool, graph: bool, fixed_split_size: int | None,
               disable_split_kv: bool, group: int = 2, page_size: int = 16, num_sm: int = NUM_SM,
               decode_blocks_per_sm: int = 8) -> list[tuple[tuple[int, int], ...]]:
    """Per row (one KV head, ``group`` query heads each), its chunks as (first page, end page) pairs."""
    rows = [int(p) for p in row_pages]
    min_chunk = max(128 // page_size, 1)
    if not use_tensor_cores:  # FlashInfer ignores both split arguments here
        grid = decode_blocks_per_sm * num_sm
        if len(rows) >= grid:
            return [_chunks(p, None) for p in rows]
        chunk = _search(min_chunk, max(rows), lambda mid: sum(_cdiv(p, mid) for p in rows) > grid)
        if sum(_cdiv(max(p, 1), chunk) for p in rows) == len(rows) and not graph:
            return [_chunks(p, None) for p in rows]
        return [_chunks(p, chunk) for p in rows]
    if disable_split_kv:
        return [_chunks(p, None) for p in rows]
    if fixed_split_size is not None and fixed_split_size > 0:
        return [_chunks(p, fixed_split_size) for p in rows]
    cta_tile_q = 16 if group <= 16 else 64 if group <= 64 else 128  # FA2DetermineCtaTileQ (sm >= 80, D < 256)
    q_tiles = _cdiv(group, cta_tile_q)
    budget = 2 * num_sm  # max_batch_size_if_split: 2 CTAs per SM over one KV head per row
    work = lambda mid: sum(q_tiles * _cdiv(max(p, 1), mid) for p in rows)
    chunk = _search(min_chunk, max(max(rows), 1), lambda mid: work(mid) > budget)
    return [_chunks(p, chunk) for p in rows]


__all__ = ["row_chunks", "NUM_SM"]
