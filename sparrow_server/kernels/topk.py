"""Triton kernels of the exact top-k of ``select_and_write`` (the selection's second half, after
``sparse_decode.page_scores``): per (request, KV head) row, the k best candidate pages by a radix search on
order-preserving integer keys, the row held in registers at the smallest tier that fits it (ties to the earlier
page, as ``select_pages``), and the FlashInfer page ids of sink + top-k + recent pages into the decode
wrapper's index buffer; how each selection variant builds them is ``variants``'. ``sparse_decode`` re-exports
what is public here.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparrow_server.kernels.radix import (BINS_PER_ROW, atomic_histogram, bucket_histogram, count_at_least,
                                          histogram_round, histogram_round_packed, radix_round, read_bins,
                                          top_digits_round, ukey, write_row_packed, write_taken, zero_bins)
from sparrow_server.kernels.variants import (  # noqa: F401  (re-export: the variants' data)
    SELECT_CHUNK, SELECT_FINE, SELECT_ROWS, SELECT_TAILS, SELECT_WARPS, TOPK_VARIANTS, WIDE_FROM_ROWS, TopKVariant,
    resolve_variant,
)


@triton.jit
def _select_kernel(scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, k_ptr, lo_ptr, hi_ptr,
                   indptr_ptr, out_ptr, bins_ptr, r2t_stride, H: tl.constexpr, PS: tl.constexpr,
                   SMALL: tl.constexpr, MEDIUM: tl.constexpr, LARGE: tl.constexpr, CHUNK: tl.constexpr,
                   TAIL_A: tl.constexpr, TAIL_B: tl.constexpr, TAIL_C: tl.constexpr, TAILS: tl.constexpr,
                   BITS: tl.constexpr, FINE: tl.constexpr, FINE_ROW: tl.constexpr, FINE_TAIL: tl.constexpr,
                   EXIT: tl.constexpr, PACKED: tl.constexpr, ROLLED: tl.constexpr, ATOMIC: tl.constexpr,
                   PART: tl.constexpr):
    """PART 0: every row. A two-launch variant (``TopKVariant.short_warps``): PART 1 the rows of at most
    FINE_ROW + FINE_TAIL candidates and the rows with nothing to choose, PART 2 the longer rows; each
    launch compiles only its tiers, so the short rows' kernel takes the registers of those alone."""
    b = tl.program_id(0) // H
    k = tl.load(k_ptr + b)
    lo = tl.load(lo_ptr + b)
    hi = tl.load(hi_ptr + b)
    if PART == 1:
        mine = (k == 0) | (hi - lo <= FINE_ROW + FINE_TAIL)
    elif PART == 2:
        mine = (k > 0) & (hi - lo > FINE_ROW + FINE_TAIL)
    else:
        mine = k >= 0  # every row
    if mine:
        select_row(tl.program_id(0), scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr,
                   bins_ptr, r2t_stride, k, lo, hi, H, PS, SMALL, MEDIUM, LARGE, CHUNK, TAIL_A, TAIL_B, TAIL_C, TAILS,
                   BITS, FINE, FINE_ROW, FINE_TAIL, EXIT, PACKED, ROLLED, ATOMIC, PART != 2, PART != 1, True)


@triton.jit
def select_row(r, scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, bins_ptr,
               r2t_stride, k, lo, hi, H: tl.constexpr, PS: tl.constexpr, SMALL: tl.constexpr, MEDIUM: tl.constexpr,
               LARGE: tl.constexpr, CHUNK: tl.constexpr, TAIL_A: tl.constexpr, TAIL_B: tl.constexpr,
               TAIL_C: tl.constexpr, TAILS: tl.constexpr, BITS: tl.constexpr, FINE: tl.constexpr,
               FINE_ROW: tl.constexpr, FINE_TAIL: tl.constexpr, EXIT: tl.constexpr, PACKED: tl.constexpr,
               ROLLED: tl.constexpr, ATOMIC: tl.constexpr, SHORT: tl.constexpr, LONG: tl.constexpr,
               RESERVED: tl.constexpr):
    """Row ``r``'s pages: the reserved ones (RESERVED; else written already), then its
    top-k by the tiers compiled in (SHORT: SMALL and, with FINE, FINE's; LONG: MEDIUM and past); EXIT, PACKED,
    ROLLED, ATOMIC: ``TopKVariant.exit_early``, ``.packed``, ``.rolled``, ``.atomic`` (its histogram bins:
    ``bins_ptr``'s BINS_PER_ROW of this row)."""
    b = r // H
    h = r % H
    if RESERVED:
        write_reserved(r, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, r2t_stride, k, H, PS, SMALL)
    s = tl.load(sink_ptr + b)
    row = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    out = out_ptr + tl.load(indptr_ptr + r)
    scores = scores_ptr + r.to(tl.int64) * pcap
    bins = bins_ptr + r.to(tl.int64) * BINS_PER_ROW
    if k > 0:
        if not SHORT:
            _topk_long(scores, lo, hi, k, row, out + s, bins, h, H, PS, MEDIUM, LARGE, CHUNK, TAIL_A, TAIL_B,
                       TAIL_C, TAILS, BITS, EXIT, PACKED, ROLLED, ATOMIC)
        elif hi - lo <= SMALL:
            _topk_in_registers(scores, lo, hi, k, row, out + s, bins, h, H, PS, SMALL, 0, BITS, EXIT, PACKED, ROLLED,
                               ATOMIC)
        elif FINE and hi - lo <= FINE_ROW:
            _topk_in_registers(scores, lo, hi, k, row, out + s, bins, h, H, PS, FINE_ROW, 0, BITS, EXIT, PACKED,
                               ROLLED, ATOMIC)
        elif FINE and hi - lo <= FINE_ROW + FINE_TAIL:
            _topk_in_registers(scores, lo, hi, k, row, out + s, bins, h, H, PS, FINE_ROW, FINE_TAIL, BITS, EXIT, PACKED,
                               ROLLED, ATOMIC)
        elif LONG:
            _topk_long(scores, lo, hi, k, row, out + s, bins, h, H, PS, MEDIUM, LARGE, CHUNK, TAIL_A, TAIL_B,
                       TAIL_C, TAILS, BITS, EXIT, PACKED, ROLLED, ATOMIC)


@triton.jit
def write_reserved(r, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, r2t_stride, k, H: tl.constexpr,
                   PS: tl.constexpr, BLOCK: tl.constexpr):
    """The page ids of row ``r``'s reserved pages: sink pages first, recent pages last (current page
    last); a dense row (k 0) is all sink. The top-k's ``k`` slots between them are the top-k's to write."""
    b = r // H
    h = r % H
    cnt = tl.load(cnt_ptr + b)
    n = tl.load(n_ptr + b)
    s = tl.load(sink_ptr + b)
    row = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    out = out_ptr + tl.load(indptr_ptr + r)
    write_reserved_from(row, out, n, cnt, s, k, h, 0, H, PS, BLOCK)


@triton.jit
def reserved_ids(row, n, cnt, s, k, u0, PS: tl.constexpr, BLOCK: tl.constexpr):
    """Reserved pages ``u0`` to ``u0 + BLOCK - 1`` of a row of ``n`` pages, ``cnt`` selected, ``s`` sink, ``k`` by
    top-k (``row``: its request's req_to_token row): (their positions in the row's index list, their first slots,
    which of them exist)."""
    u = u0 + tl.arange(0, BLOCK)
    m = u < cnt - k
    t = tl.where(u < s, u, u + k)
    page = tl.where(u < s, u, n - (cnt - t))
    return t, tl.load(row + page.to(tl.int64) * PS, mask=m, other=0), m


@triton.jit
def write_reserved_from(row, out, n, cnt, s, k, h, start, H: tl.constexpr, PS: tl.constexpr, BLOCK: tl.constexpr):
    """``write_reserved``'s page ids from reserved page ``start`` on, BLOCK at a time."""
    for u0 in range(start, cnt - k, BLOCK):
        t, slot, m = reserved_ids(row, n, cnt, s, k, u0, PS, BLOCK)
        tl.store(out + t, slot * H + h, mask=m)


@triton.jit
def _topk_long(scores, lo, hi, k, row, out, bins, h, H: tl.constexpr, PS: tl.constexpr, MEDIUM: tl.constexpr,
               LARGE: tl.constexpr, CHUNK: tl.constexpr, TAIL_A: tl.constexpr, TAIL_B: tl.constexpr,
               TAIL_C: tl.constexpr, TAILS: tl.constexpr, BITS: tl.constexpr, EXIT: tl.constexpr,
               PACKED: tl.constexpr, ROLLED: tl.constexpr, ATOMIC: tl.constexpr):
    """Rows past the short tiers: MEDIUM, then ``even``'s tails (TAILS) or LARGE, then streamed."""
    if hi - lo <= MEDIUM:
        _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H, PS, MEDIUM, 0, BITS, EXIT, PACKED, ROLLED, ATOMIC)
    elif TAILS:
        _topk_past_medium(scores, lo, hi, k, row, out, bins, h, H, PS, MEDIUM, LARGE, CHUNK, TAIL_A, TAIL_B,
                          TAIL_C, BITS, EXIT, PACKED, ROLLED, ATOMIC)
    elif hi - lo <= LARGE:
        _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H, PS, LARGE, 0, BITS, EXIT, PACKED, ROLLED, ATOMIC)
    else:
        _topk_streamed(scores, lo, hi, k, row, out, h, H, PS, CHUNK)


@triton.jit
def _topk_past_medium(scores, lo, hi, k, row, out, bins, h, H: tl.constexpr, PS: tl.constexpr,
                      MEDIUM: tl.constexpr, LARGE: tl.constexpr, CHUNK: tl.constexpr, TAIL_A: tl.constexpr,
                      TAIL_B: tl.constexpr, TAIL_C: tl.constexpr, BITS: tl.constexpr, EXIT: tl.constexpr,
                      PACKED: tl.constexpr, ROLLED: tl.constexpr, ATOMIC: tl.constexpr):
    """``even``'s rows past MEDIUM: MEDIUM + the smallest TAIL that fits, in registers (cost grows by
    the tail, not a step to LARGE), then LARGE, then streamed."""
    if hi - lo <= MEDIUM + TAIL_A:
        _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H, PS, MEDIUM, TAIL_A, BITS, EXIT, PACKED, ROLLED,
                           ATOMIC)
    elif hi - lo <= MEDIUM + TAIL_B:
        _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H, PS, MEDIUM, TAIL_B, BITS, EXIT, PACKED, ROLLED,
                           ATOMIC)
    elif hi - lo <= MEDIUM + TAIL_C:
        _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H, PS, MEDIUM, TAIL_C, BITS, EXIT, PACKED, ROLLED,
                           ATOMIC)
    elif hi - lo <= LARGE:
        _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H, PS, LARGE, 0, BITS, EXIT, PACKED, ROLLED, ATOMIC)
    else:
        _topk_streamed(scores, lo, hi, k, row, out, h, H, PS, CHUNK)


@triton.jit
def _topk_in_registers(scores, lo, hi, k, row, out, bins, h, H: tl.constexpr, PS: tl.constexpr, ROW: tl.constexpr,
                       TAIL: tl.constexpr, BITS: tl.constexpr, EXIT: tl.constexpr, PACKED: tl.constexpr,
                       ROLLED: tl.constexpr, ATOMIC: tl.constexpr):
    """Top-k of a row of at most ROW + TAIL candidates (TAIL 0 or a power of two: a second register
    block, so a row just past ROW costs ROW + TAIL lanes, not 2 * ROW), its keys loaded once; BITS
    per round: 2 (16 rounds of lanes x 4 compares, one reduction each: few registers) or 8 (4
    rounds of a 256-bin histogram of the keys still in the running; EXIT: none after a round whose bucket
    holds exactly the keys still needed; PACKED: each round and each block's write in fewer block-wide steps (2:
    and with TAIL, both blocks ranked before either gathers, ``TopKVariant.joint_write``; 3: that with the gathers
    before the ranks, ``TopKVariant.hoisted``);
    ATOMIC: ``TopKVariant.atomic``'s histograms, into ``bins``)."""
    if ATOMIC:  # the rounds' bins zeroed, every thread's zeros stored before any atomic
        zero_bins(bins)
    j = lo + tl.arange(0, ROW)
    key = ukey(scores, j, j < hi)
    if TAIL > 0:
        j2 = lo + ROW + tl.arange(0, TAIL)
        key2 = ukey(scores, j2, j2 < hi)
    else:  # not read (TAIL 0): named for ``_round_histogram``'s and ``write_row_packed``'s arguments
        j2, key2 = j, key
    c = tl.arange(0, 1 << BITS).to(tl.int64)
    prefix = tl.zeros([], tl.int64)
    n_gt = tl.zeros([], tl.int32)
    exact = tl.zeros([], tl.int32)  # the last round's bucket holds exactly the keys still needed
    if ROLLED:  # TopKVariant.rolled: one copy of a round's code, run until the early exit's bucket
        shift = tl.full([], 32 - BITS, tl.int32)
        if ATOMIC == 1:  # the first round, where every key is live, by Triton's histogram
            hist = _round_histogram(key, key2, prefix, shift, bins, TAIL, False)
            prefix, n_gt, exact = histogram_round_packed(hist, k, n_gt, prefix, shift)
            shift -= BITS
        elif ATOMIC == 2:  # against the top digits; Triton's histogram where the k-th key lies below them
            prefix, n_gt, exact, found = top_digits_round(key, key2, k, TAIL)
            if found == 0:
                hist = _round_histogram(key, key2, tl.zeros([], tl.int64), shift, bins, TAIL, False)
                prefix, n_gt, exact = histogram_round_packed(hist, k, tl.zeros([], tl.int32), tl.zeros([], tl.int64),
                                                             shift)
            shift -= BITS
        while (exact == 0) & (shift >= 0):
            hist = _round_histogram(key, key2, prefix, shift, bins, TAIL, ATOMIC)
            prefix, n_gt, exact = histogram_round_packed(hist, k, n_gt, prefix, shift)
            shift -= BITS
    else:
        for rnd in tl.static_range(32 // BITS):
            shift = 32 - BITS * (rnd + 1)
            if BITS == 8:
                if exact == 0:  # else the bucket is taken whole: its keys' lower bits decide nothing
                    hist = bucket_histogram(key, prefix, shift)
                    if TAIL > 0:
                        hist += bucket_histogram(key2, prefix, shift)
                    if PACKED:
                        prefix, n_gt, exact = histogram_round_packed(hist, k, n_gt, prefix, shift)
                    else:
                        prefix, n_gt, exact = histogram_round(hist, k, n_gt, prefix, shift)
                    if not EXIT:
                        exact = tl.zeros([], tl.int32)
            else:
                thr = prefix + ((c + 1) << shift)
                counts = count_at_least(key, thr)
                if TAIL > 0:
                    counts += count_at_least(key2, thr)
                prefix, n_gt = radix_round(counts, k, prefix, shift, 1 << BITS)
    # k - n_gt keys from ``prefix`` on: the k-th key and the earliest of its equals, or (an early exit) the whole
    # bucket, every key of it from its lower edge ``prefix`` up (at least those equal to it, so no tie is cut)
    if PACKED:  # 2: TopKVariant.joint_write, 3: .hoisted (TopKVariant.write_code)
        write_row_packed(key, j, key2, j2, prefix, k - n_gt, row, out, h, H, PS, TAIL, PACKED - 1)
    else:
        zero = tl.zeros([], tl.int32)
        n_eq, n_taken = write_taken(key, j, prefix, k - n_gt, zero, zero, row, out, h, H, PS)
        if TAIL > 0:
            write_taken(key2, j2, prefix, k - n_gt, n_eq, n_taken, row, out, h, H, PS)


@triton.jit
def _round_histogram(key, key2, prefix, shift, bins, TAIL: tl.constexpr, ATOMIC: tl.constexpr):
    """The 256 digit counts of a round (``shift`` 24, 16, 8 or 0) over the row's keys (and ``key2`` with TAIL): by
    Triton's histogram, or (ATOMIC, a round after the first) by global atomics into the round's own zeroed bins."""
    if ATOMIC:
        round_bins = bins + (16 - shift) * 32  # rounds 2-4 (shift 16, 8, 0): bins 0, 256, 512
        atomic_histogram(key, prefix, shift, round_bins)
        if TAIL > 0:
            atomic_histogram(key2, prefix, shift, round_bins)
        hist = read_bins(round_bins)
    else:
        hist = bucket_histogram(key, prefix, shift)
        if TAIL > 0:
            hist += bucket_histogram(key2, prefix, shift)
    return hist


@triton.jit
def _topk_streamed(scores, lo, hi, k, row, out, h, H: tl.constexpr, PS: tl.constexpr, CHUNK: tl.constexpr):
    """Top-k of a longer row: each round streams the row's keys in CHUNK tiles."""
    offs = tl.arange(0, CHUNK)
    c16 = tl.arange(0, 16).to(tl.int64)
    prefix = tl.zeros([], tl.int64)
    n_gt = tl.zeros([], tl.int32)
    for rnd in tl.static_range(8):
        shift = 28 - 4 * rnd
        thr = prefix + ((c16 + 1) << shift)
        counts = tl.zeros([16], tl.int32)
        for j0 in range(lo, hi, CHUNK):
            counts += count_at_least(ukey(scores, j0 + offs, j0 + offs < hi), thr)
        prefix, n_gt = radix_round(counts, k, prefix, shift, 16)
    # keys above the threshold, then the earliest equal ones; output in page order
    n_eq = tl.zeros([], tl.int32)
    n_taken = tl.zeros([], tl.int32)
    for j0 in range(lo, hi, CHUNK):
        j = j0 + offs
        n_eq, n_taken = write_taken(ukey(scores, j, j < hi), j, prefix, k - n_gt, n_eq, n_taken, row, out,
                                     h, H, PS)


def tier_launch(variant: str | None = None) -> tuple[dict, dict]:
    """A variant's top-k in one launch of every row: ``select_row``'s compile-time constants (its register
    tiers) and the launch options (warps, register cap)."""
    v = TOPK_VARIANTS[resolve_variant(variant)]
    consts = dict(SMALL=SELECT_ROWS[0], MEDIUM=SELECT_ROWS[1], LARGE=SELECT_ROWS[2], CHUNK=SELECT_CHUNK,
                  TAIL_A=SELECT_TAILS[0], TAIL_B=SELECT_TAILS[1], TAIL_C=SELECT_TAILS[2], TAILS=v.tails,
                  BITS=v.bits, FINE=v.fine, FINE_ROW=SELECT_FINE[0], FINE_TAIL=SELECT_FINE[1], EXIT=v.exit_early,
                  PACKED=v.packed_code, ROLLED=v.rolled, ATOMIC=v.atomic_code)
    return consts, {"num_warps": SELECT_WARPS, **({"maxnreg": v.maxnreg} if v.maxnreg else {})}


def select_launches(variant: str | None = None, rows: int | None = None) -> list[tuple[dict, dict]]:
    """``_select_kernel``'s launches for a selection variant over ``rows`` rows (None: as many as it splits
    at), each (compile-time constants: its register tiers and PART; launch options: warps and register cap):
    one, or two for a ``short_warps`` variant at ``short_from_rows`` rows or more."""
    v = TOPK_VARIANTS[resolve_variant(variant)]
    consts, options = tier_launch(variant)
    if v.short_warps is None or (rows is not None and rows < v.short_from_rows):
        return [({**consts, "PART": 0}, options)]
    short = {"num_warps": v.short_warps, **({"maxnreg": v.short_maxnreg} if v.short_maxnreg else {})}
    return [({**consts, "PART": 1}, short), ({**consts, "PART": 2}, options)]


def radix_bins(variant: str | None, rows: int, out: Tensor) -> Tensor:
    """The bins of an ``atomic`` variant's histograms for ``rows`` rows (a workspace each launch zeroes first:
    allocated per call, so under a CUDA graph from the graph's pool), else ``out``, as a pointer never read."""
    if TOPK_VARIANTS[resolve_variant(variant)].atomic:
        return torch.empty(rows * BINS_PER_ROW, dtype=torch.int32, device=out.device)
    return out


def select_and_write(scores: Tensor, req_to_token: Tensor, req_pool_indices: Tensor, n_pages: Tensor,
                     count: Tensor, sink: Tensor, k: Tensor, cand_lo: Tensor, cand_hi: Tensor, row_indptr: Tensor,
                     num_kv_heads: int, page_size: int, out: Tensor, variant: str | None = None) -> None:
    """Exact top-k + index writing, one program per (request, KV head) row.

    scores: [rows, Pcap] float32, read on ``[cand_lo, cand_hi)`` only. Each row gets sink pages,
    its ``k`` best candidate pages (ties -> earlier page, as ``select_pages``) in ascending page
    order, then the recent pages. No static top-k width, so any budget up to the sequence fits.
    ``variant``: one of SELECT_VARIANTS (default DEFAULT_SELECT_VARIANT).
    """
    rows, pcap = scores.shape
    bins = radix_bins(variant, rows, out)
    for consts, options in select_launches(variant, rows):
        _select_kernel[(rows,)](scores, pcap, req_to_token, req_pool_indices, n_pages, count, sink, k, cand_lo,
                                cand_hi, row_indptr, out, bins, req_to_token.stride(0), H=num_kv_heads, PS=page_size,
                                **consts, **options)
