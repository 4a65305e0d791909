"""Per-step decode planning on the host: budgets -> page counts, CSR row pointers, last-page lengths.

Pure numpy, no SGLang or GPU. One FlashInfer row per (request, KV head): row ``r = b * Hkv + h``
attends ``count[b]`` pages. The row's logical page list (written on the GPU per layer) is

    [0, sink)  +  top-k[:k]  +  [n - (count - sink - k), n)

so the current (possibly partial) page is last. A dense row (``n <= budget``) is written as
``sink = n, k = 0``: pages ``0..n-1`` in order. Candidates for top-k are pages
``[cand_lo, cand_hi)``; empty for dense rows (no landmark reads).

Under tensor parallelism each rank plans only its own KV heads (``Hkv`` = the rank's count,
``kv_heads_per_rank``); the per-request fields depend on no rank, so every rank plans the same
budgets, and its rows are the one-rank plan's rows of the heads it holds (``rank_kv_heads``,
``rank_plan``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from sparrow_server.sparsity.schedule import Schedule, attended_pages, budget_pages, kv_budget_tokens

logger = logging.getLogger(__name__)

# Order of the per-request int32 fields in the packed metadata (host and device share it).
REQUEST_FIELDS = ("n_pages", "count", "sink", "k", "cand_lo", "cand_hi")


@dataclass(frozen=True)
class StepPlan:
    """Host-side plan of one decode step. Arrays are int32 unless noted.

    Per request [B]: ``n_pages``, ``count`` (pages attended), ``sink`` (leading pages kept in
    order), ``k`` (top-k pages), ``cand_lo``/``cand_hi`` (top-k candidate range), ``budget_tokens``
    (int64, attended tokens, for accounting). Per row [B * Hkv]: ``row_indptr`` [B*Hkv+1],
    ``last_page_len``. ``clamped`` counts requests whose top-k exceeded the cap.
    """

    num_kv_heads: int
    n_pages: np.ndarray
    count: np.ndarray
    sink: np.ndarray
    k: np.ndarray
    cand_lo: np.ndarray
    cand_hi: np.ndarray
    budget_tokens: np.ndarray
    row_indptr: np.ndarray
    last_page_len: np.ndarray
    clamped: int

    @property
    def batch_size(self) -> int:
        return int(self.n_pages.shape[0])

    @property
    def total_pages(self) -> int:
        return int(self.row_indptr[-1])

    def request_fields(self) -> np.ndarray:
        """[len(REQUEST_FIELDS), B] int32, rows in ``REQUEST_FIELDS`` order."""
        return np.stack([getattr(self, f) for f in REQUEST_FIELDS]).astype(np.int32)


def plan_request(schedule: Schedule, length: int, prompt_len: int, page_size: int, topk_cap_pages: int):
    """(n_pages, count, sink, k, cand_lo, cand_hi, clamped) for one request at ``length`` tokens."""
    n = max(math.ceil(length / page_size), 1)
    count = attended_pages(schedule, length, prompt_len, topk_cap_pages)
    if count == n:
        return n, n, n, 0, 0, 0, False
    sink, recent = schedule.sink_pages, schedule.recent_pages
    clamped = budget_pages(schedule, length, prompt_len) > count  # the top-k cap cut it
    k = count - sink - recent  # >= 1: schedules keep budgets above the reserved pages
    return n, count, sink, k, sink, n - recent, clamped


def _plan_one(schedule: Schedule, length: int, prompt_len: int, page_size: int, topk_cap_pages: int):
    """(plan_request fields, kv_budget_tokens) of one request. A schedule that fails to evaluate
    plans that request dense (every page: always executable, exact) instead of failing the batch:
    the step is shared, so one request's schedule must not raise for its neighbours."""
    try:
        return (plan_request(schedule, length, prompt_len, page_size, topk_cap_pages),
                kv_budget_tokens(schedule, length, prompt_len, topk_cap_pages))
    except Exception:
        logger.exception("sparrow: schedule %s failed to plan at length %d; this request attends densely",
                         getattr(schedule, "id", "?"), length)
        n = max(math.ceil(length / page_size), 1)
        return (n, n, n, 0, 0, 0, False), max(length, 1)


def plan_step(
    schedules: list[Schedule],
    lengths: np.ndarray,
    prompt_lens: np.ndarray,
    num_kv_heads: int,
    page_size: int,
    topk_cap_pages: int,
) -> StepPlan:
    """Plan a decode step. ``lengths[b]``: KV tokens attended by request ``b`` (current included)."""
    if page_size < 1 or num_kv_heads < 1 or topk_cap_pages < 1:
        raise ValueError(f"page_size={page_size}, num_kv_heads={num_kv_heads}, topk_cap_pages={topk_cap_pages}: must be >= 1")
    planned = [_plan_one(s, int(length), int(p), page_size, topk_cap_pages)
               for s, length, p in zip(schedules, lengths, prompt_lens)]
    per_req = [fields for fields, _ in planned]
    budget_tok = np.asarray([tokens for _, tokens in planned], dtype=np.int64)
    cols = list(zip(*per_req)) if per_req else [()] * 7
    n_pages, count, sink, k, lo, hi = (np.asarray(c, dtype=np.int32) for c in cols[:6])
    clamped = int(sum(cols[6]))
    lengths = np.asarray(lengths, dtype=np.int64)
    row_count = np.repeat(count.astype(np.int64), num_kv_heads)
    row_indptr = np.concatenate([[0], np.cumsum(row_count)]).astype(np.int32)
    last = ((np.maximum(lengths, 1) - 1) % page_size + 1).astype(np.int32)
    return StepPlan(
        num_kv_heads=num_kv_heads, n_pages=n_pages, count=count, sink=sink, k=k, cand_lo=lo, cand_hi=hi,
        budget_tokens=budget_tok, row_indptr=row_indptr,
        last_page_len=np.repeat(last, num_kv_heads), clamped=clamped,
    )


def _check_tp(total_kv_heads: int, tp_size: int) -> None:
    if total_kv_heads < 1 or tp_size < 1:
        raise ValueError(f"num_kv_heads={total_kv_heads}, tp_size={tp_size}: must be >= 1")
    if total_kv_heads % tp_size and tp_size % total_kv_heads:
        raise ValueError(f"tp_size={tp_size}: must divide num_kv_heads={total_kv_heads} or be a multiple of it")


def kv_heads_per_rank(total_kv_heads: int, tp_size: int) -> int:
    """KV heads each attention-TP rank holds, as SGLang's ``ModelConfig.get_num_kv_heads``: an even
    split, or one (replicated) head per rank when ranks outnumber heads."""
    _check_tp(total_kv_heads, tp_size)
    return max(1, total_kv_heads // tp_size)


def rank_kv_heads(total_kv_heads: int, tp_size: int, rank: int) -> tuple[int, ...]:
    """Global KV heads of ``rank``, in its local order, as SGLang's ``QKVParallelLinear`` shards them:
    ``[rank * n, (rank + 1) * n)``, or head ``rank // (tp_size // total_kv_heads)`` when replicated."""
    n = kv_heads_per_rank(total_kv_heads, tp_size)
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank={rank}: must be in [0, {tp_size})")
    if tp_size <= total_kv_heads:
        return tuple(range(rank * n, (rank + 1) * n))
    return (rank // (tp_size // total_kv_heads),)


def rank_plan(plan: StepPlan, heads: Sequence[int]) -> StepPlan:
    """The rows of ``plan`` (planned for all KV heads) that a rank holding global KV ``heads`` runs:
    rows ``b * Hkv + h`` for each request ``b`` and ``h`` in ``heads``; per-request fields unchanged."""
    heads = np.asarray(heads, dtype=np.int64)
    if heads.size == 0 or (heads < 0).any() or (heads >= plan.num_kv_heads).any():
        raise ValueError(f"heads={heads.tolist()}: must be a non-empty subset of [0, {plan.num_kv_heads})")
    rows = (np.arange(plan.batch_size)[:, None] * plan.num_kv_heads + heads[None, :]).ravel()
    row_count = np.diff(plan.row_indptr.astype(np.int64))[rows]
    row_indptr = np.concatenate([[0], np.cumsum(row_count)]).astype(np.int32)
    return replace(plan, num_kv_heads=int(heads.size), row_indptr=row_indptr, last_page_len=plan.last_page_len[rows])


EMPTY_ROWS = 1  # rows before the sub-rows of a ``sub_row_plan``


def split_rows(row_indptr: np.ndarray, last_page_len: np.ndarray, parts: int,
               page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's pages as ``parts`` sub-rows of the same index buffer, for a decode that attends the sub-rows on
    their own and merges them (``kernels.merge``): (sub-row pointers [rows * parts + 1], last-page lengths
    [rows * parts]). Sub-row ``r * parts + c`` holds pages ``[c * n // parts, (c + 1) * n // parts)`` of row ``r``'s
    ``n``: even loads, and the last sub-row always ends on the row's last page, so the lengths depend on the
    rows' lengths only, not on their counts. A sub-row with no page (``n < parts``) gets a full last page: 0 tokens."""
    if parts < 1:
        raise ValueError(f"parts={parts}: must be >= 1")
    start = row_indptr[:-1].astype(np.int64)[:, None]
    n = np.diff(row_indptr.astype(np.int64))[:, None]
    bounds = start + (np.arange(parts + 1)[None, :] * n) // parts  # [rows, parts + 1]
    sub_indptr = np.concatenate([bounds[:, :-1].ravel(), row_indptr[-1:]]).astype(np.int32)
    sub_last = np.full((len(n), parts), page_size, dtype=np.int32)
    sub_last[:, -1] = last_page_len
    return sub_indptr, sub_last.ravel()


def sub_row_plan(row_indptr: np.ndarray, last_page_len: np.ndarray, parts: int,
                 page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows a sub-row decode hands FlashInfer: ``EMPTY_ROWS`` empty row(s), then ``split_rows``'s sub-rows
    (pointers [EMPTY_ROWS + rows * parts + 1], last-page lengths [EMPTY_ROWS + rows * parts]).

    Why the empty row: under CUDA graphs FlashInfer's tensor-core plan pads its work list (to the larger of two CTAs
    an SM and an eighth more than the rows: ``PrefillSplitQOKVIndptr``) with entries the kernel runs (no validity mask
    without a KV split), each of which ``layer_plans`` leaves at row 0. Row 0 empty, they read no page; a sub-row
    there, they reread its pages: at 33 x 32K in 2 sub-rows 65 extra CTAs of 128 pages each beside the 528."""
    indptr, last = split_rows(row_indptr, last_page_len, parts, page_size)
    return (np.concatenate([np.zeros(EMPTY_ROWS, np.int32), indptr]),
            np.concatenate([np.zeros(EMPTY_ROWS, np.int32), last]))


def logical_page_lists(plan: StepPlan, topk_pages: np.ndarray) -> list[list[int]]:
    """Reference of what the GPU index writer produces, per row, as logical page numbers.

    topk_pages: [B * Hkv, >= max k] candidate pages ordered best first.
    """
    out = []
    for r in range(plan.batch_size * plan.num_kv_heads):
        b = r // plan.num_kv_heads
        cnt, s, k, n = int(plan.count[b]), int(plan.sink[b]), int(plan.k[b]), int(plan.n_pages[b])
        out.append([t if t < s else int(topk_pages[r, t - s]) if t < s + k else n - (cnt - t) for t in range(cnt)])
    return out


def packed_layout(max_bs: int, num_kv_heads: int, max_parts: int = 1) -> dict[str, tuple[int, int]]:
    """Offsets (start, length) in the flat int32 metadata buffer copied host -> device each step; with
    ``max_parts`` > 1 also the sub-rows' pointers and last-page lengths (``sub_row_plan``, up to that many a row)."""
    layout, off = {}, 0
    rows = max_bs * num_kv_heads
    regions = [(name, max_bs) for name in REQUEST_FIELDS] + [("row_indptr", rows + 1), ("last_page_len", rows)]
    if max_parts > 1:
        sub = EMPTY_ROWS + rows * max_parts
        regions += [("sub_indptr", sub + 1), ("sub_last_page_len", sub)]
    for name, n in regions:
        layout[name] = (off, n)
        off += n
    layout["_total"] = (0, off)
    return layout


def pack(plan: StepPlan, layout: dict[str, tuple[int, int]],
         sub_rows: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Flat int32 host buffer in ``layout`` order; entries past the batch are zero. ``sub_rows``: the plan's
    ``sub_row_plan``, packed into the layout's sub-row regions."""
    buf = np.zeros(layout["_total"][1], dtype=np.int32)
    arrays = {name: getattr(plan, name) for name in REQUEST_FIELDS}
    arrays.update(row_indptr=plan.row_indptr, last_page_len=plan.last_page_len)
    if sub_rows is not None:
        arrays.update(sub_indptr=sub_rows[0], sub_last_page_len=sub_rows[1])
    for name, values in arrays.items():
        start, n = layout[name]
        assert values.shape[0] <= n, (name, values.shape, n)
        buf[start:start + values.shape[0]] = values
    return buf
