"""Triton kernels of the exact top-k of ``select_and_write`` (the selection's second half, after
``sparse_decode.page_scores``): per (request, KV head) row, the k best candidate pages by a radix search on
order-preserving integer keys, the row held in registers at the smallest tier that fits it (ties to the earlier
page, as ``select_pages``), and the FlashInfer page ids of sink + top-k + recent pages into the decode
wrapper's index buffer. ``sparse_decode`` re-exports what is public here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparrow_server.kernels import DEFAULT_SELECT_VARIANT, SELECT_VARIANTS
from sparrow_server.kernels.radix import (BINS_PER_ROW, atomic_histogram, bucket_histogram, count_at_least,
                                          histogram_round, histogram_round_packed, radix_round, read_bins,
                                          top_digits_round, ukey, write_taken, write_taken_packed, zero_bins)

SELECT_ROWS = (512, 2048, 4096)  # candidate counts up to which a row's scores are held in registers
SELECT_TAILS = (256, 512, 1024)  # ``even``: rows of 2048 + TAIL candidates, held as two register blocks
SELECT_FINE = (1024, 512)  # ``fine``: rows of up to 1024, then 1024 + 512 candidates, before the 2048 tier
SELECT_WARPS = 16     # warps of a ``select_and_write`` program
# ``fine_hist64`` runs 2 rows per SM, so on the 132 SMs of an H100 or H200 up to 264 rows in one wave; below that a
# second launch for the short rows buys no SM and costs its launch (call 24's kernel bench at batch 16).
WIDE_FROM_ROWS = 264


@dataclass(frozen=True)
class TopKVariant:
    """How a selection variant's top-k kernel is built: ``tails``, ``even``'s tiers past 2048 (SELECT_TAILS);
    ``fine``, the tiers of SELECT_FINE below 2048; ``bits`` per radix round (2: compares, 8: histogram);
    ``maxnreg``, a register cap. Uncapped (offline sm_90 compile, ``benchmarks/selection_kernel_resources.py``)
    every variant's kernel takes 128 registers (histogram rounds 88), so one 16-warp program fills an SM's
    65,536 and at batch 64 (512 rows on 132 SMs) the rows run four deep. The compare rounds spill 808 bytes of
    stack at a cap of 64, the histogram rounds 40 (64 registers: 2 programs per SM) or 80 (40 registers: 3)."""

    tails: bool = False
    fine: bool = False
    bits: int = 2
    maxnreg: int | None = None
    # Two launches: the rows of up to 1024 + 512 candidates (SELECT_FINE; with ``fine`` only) in a kernel of
    # ``short_warps`` warps that compiles only those tiers, under ``short_maxnreg``; the longer rows as above.
    short_warps: int | None = None
    short_maxnreg: int | None = None
    # the two launches only from this many rows (request x KV head) on; fewer run as one launch of every row
    short_from_rows: int = 0
    # One launch scores and selects (``sparse_decode.score_and_select``): a program per row streams its own
    # landmarks (a pipelined loop), then runs this top-k on the scores it just wrote (still in L1/L2), with every
    # tier in one kernel under ``maxnreg``. Up to ``fused_max_rows`` rows (None: any); more run the split scoring
    # grid and the launches above. Call 25's bench: fused, selection at batch 16 falls 6-10% (one row per SM:
    # no launch between scoring and top-k, no second read of the scores from L2) and at a GQA group of 4 at 48
    # requests 3.7-8%, but past one wave of row programs (2 per SM) at a group of 2 it rises 1.5-15% (batch 40, 64).
    fused: bool = False
    fused_max_rows: int | None = None
    # Histogram rounds (bits 8) stop at the first round whose digit's bucket holds exactly the keys still needed:
    # then every key from the bucket's lower edge up is taken, whatever the lower bits (at 2K random-like scores
    # a bucket of 24 bits holds one key, so the fourth round almost never runs, the third often not).
    # Call 26's bench: selection at batch 16 falls 1.3-2.9 us a layer, at batch 64 3.4-6.7 us (the top-k by 11-22%).
    # (Building the first round's histogram in the fused row loop instead, from the scores in registers, made that
    # loop 1.6-2.6x slower at batch 16: a histogram per tile stalls the stream. Not offered.)
    exit_early: bool = False
    # The histogram rounds and the index write in fewer block-wide steps: a round's suffix counts by one reverse
    # scan (not a sum and a scan) and its digit, exactness and keys above in one packed sum (not three); a
    # block's write ranks by one scan of packed counts (not two). Offline sm_90 SASS (``--tiers``): the block
    # barriers of a tier fall 47 -> 29 (call 26: at one row per SM the top-k is a chain of them). Call 27's bench:
    # the top-k falls 5-14% in every case (12-14% at one row per SM from 32K), selection 2-5%.
    packed: bool = False
    # The histogram rounds as a loop run until a bucket holds exactly the keys still needed (or four rounds): one copy
    # of a round's code, not four unrolled (offline sm_90 SASS of the 2,048 tier: 624 instructions and 9 barriers
    # against 1,048 and 29). Call 31's phase profile of the fused launch (``benchmarks/selection_phase_profile.py``,
    # 33K x 16) timed each unrolled round's histogram at 2.3-2.8 us and its scan at 0.55, however few keys were live
    # (in the third round those sharing the k-th key's top 16 bits); rolled, the rounds after the first cost the same,
    # so the code fetch is not what a round costs. Its benches: selection 0.8 us less to 0.2 more at batch 16, 0.8-2.1
    # less at 34, 3.3-3.9 less at 64 x 17.4K (at 16K 0.3 more to the same).
    rolled: bool = False
    # The rounds after the first by one global atomic a live key into the row's own 256 bins a round
    # (``radix.atomic_histogram``), not Triton's histogram: Triton 3.6 (the GPU hosts' build) lowers ``tl.histogram``
    # to 9 warp ballots and 8 popcounts a key, live or not, then 256 shared atomics a warp, so a round cost what the
    # row's lanes do (call 31's phase profile: 2.3-2.8 us each at 2,061 candidates, the third round as much as the
    # first). Atomics cost what the live keys do: after the first round, those sharing the k-th key's top 8 bits.
    # Call 32's phase profile at 33K x 16: rounds 2 and 3 0.4 + 0.9 and 0.35 + 0.65 us (histogram + scan) against
    # 2.4 + 0.55 each. The first round stays Triton's: every key is live there and crowds the few digits that sign and
    # exponent take, so its atomics queue (by atomics too, its histogram and scan took 4.3 us against 3.9; spread over
    # 4, 8 or 16 copies of its bins, key j's into copy j % n, 4.7-6.9).
    atomic: bool = False
    # With ``atomic``: the first round by a 32-bin histogram of each key's distance in digits below the row's highest
    # key (``radix.top_digits_round``; Triton 3.6 lowers it to 6 ballots and a popcount a key, the 256-bin one to 9 and
    # 8), the 256-bin histogram only where the k-th key lies 31 or more digits below the highest. Call 32's bench at
    # batch 16 (one host): selection 201.2 against ``fused_atomic_narrow``'s 207.4 us summed over six contexts, less in
    # each (32.8 against 33.8 at 33K); not yet benched at batch 34 or 64, nor the default.
    top_digits: bool = False

    def __post_init__(self):
        assert self.short_warps is None or self.fine, "the short rows' launch holds FINE's tiers"
        assert not self.exit_early or self.bits == 8, "the early exit is the histogram rounds'"
        assert not self.packed or self.bits == 8, "the packed steps are the histogram rounds'"
        assert not self.rolled or (self.exit_early and self.packed), "rolled: the packed rounds, to the early exit"
        assert not self.atomic or self.rolled, "the atomic histograms are the rolled rounds'"
        assert not self.top_digits or self.atomic, "top_digits: the first round before the atomic ones"

    @property
    def atomic_code(self) -> int:
        """The kernels' ATOMIC: 0 Triton's histogram every round; 1 the rounds after its first by atomics; 2 those
        after a first round against the top digits (``top_digits``)."""
        return 2 if self.top_digits else int(self.atomic)

    def fuses(self, rows: int) -> bool:
        """Whether ``rows`` rows score and select in one launch."""
        return self.fused and (self.fused_max_rows is None or rows <= self.fused_max_rows)


_NARROW = TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, fused=True, fused_max_rows=WIDE_FROM_ROWS,
                      short_warps=8, short_maxnreg=40, short_from_rows=WIDE_FROM_ROWS)  # fused_hist64_narrow
_PACKED = replace(_NARROW, exit_early=True, packed=True)  # fused_packed_narrow
TOPK_VARIANTS = {"v1": TopKVariant(), "split": TopKVariant(), "even": TopKVariant(tails=True),
                 "hist": TopKVariant(bits=8), "fine": TopKVariant(tails=True, fine=True),
                 "fine_hist": TopKVariant(tails=True, fine=True, bits=8),
                 "fine_hist64": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64),
                 "fine_hist40": TopKVariant(tails=True, fine=True, bits=8, maxnreg=40),
                 "short8_hist40": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, short_warps=8,
                                              short_maxnreg=40),
                 "short8_hist40_wide": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, short_warps=8,
                                                   short_maxnreg=40, short_from_rows=WIDE_FROM_ROWS),
                 "fused_hist64": TopKVariant(tails=True, fine=True, bits=8, maxnreg=64, fused=True),
                 "fused_hist64_narrow": _NARROW,
                 "fused_exit_narrow": replace(_NARROW, exit_early=True),
                 "fused_packed_narrow": _PACKED,
                 "fused_rolled_narrow": replace(_PACKED, rolled=True),
                 "fused_atomic_narrow": replace(_PACKED, rolled=True, atomic=True),
                 "fused_topdigits_narrow": replace(_PACKED, rolled=True, atomic=True, top_digits=True)}
assert tuple(TOPK_VARIANTS) == SELECT_VARIANTS
SELECT_CHUNK = 1024   # scores per tile of ``select_and_write`` for longer rows (streamed from L2)
# SELECT_VARIANTS: ``v1``: the gpu_call14 kernels (64 strided score programs; top-k tiers
# 512/2048/4096), whose cost steps up past 2048 candidates (issue 24). ``split``: score programs
# split each row evenly, v1's top-k. ``even``: ``split`` whose top-k tiers step by SELECT_TAILS
# past 2048 (a second register block: fewer lanes than 4096, but its own block-wide reduction per
# round). ``hist``: ``split`` whose register tiers find the k-th key in 4 rounds of a 256-bin
# histogram instead of 16 rounds of 2-bit compares. Offline sm_90 SASS of one tier (instructions
# per thread / barriers): v1 2048 lanes 2472 / 69, 4096 lanes 4096 / 71; even 2048 + 256 lanes
# 3208 / 141; hist 2048 lanes 1336 / 47, 4096 lanes 2256 / 47, plus one shared-memory atomic per
# live key and round (contended if many keys share a digit). ``fine``: ``even`` whose rows of 513 to
# 2048 candidates (8K to 32K context at page 16) take 1024 or 1024 + 512 lanes, not 2048: at batch 64 the
# 512 rows (64 x 8 KV heads) keep every SM busy and top-k costs what its lanes do (H200, 16K x 64: top-k
# 46.3 us, score 44.5, benchmarks/results/speed/call22/kernel_bench/), where at batch 16 (one row per SM)
# a row's 16 rounds set its cost whatever its lanes. ``fine_hist``: ``fine``'s tiers with ``hist``'s 4
# histogram rounds (one shared-memory atomic per live key and round instead of 4 compares per key and
# round over 16 rounds: fewer instructions where the SMs are full); ``fine_hist64`` / ``fine_hist40``: that
# kernel under a register cap (``TopKVariant.maxnreg``), so 2 or 3 rows share an SM. ``short8_hist40``:
# ``fine_hist64`` whose rows of up to 1024 + 512 candidates (rollout A's lengths, up to 24K tokens) run in a launch of
# their own that compiles only those tiers, 8 warps under 40 registers (24 bytes of stack: 6 rows per SM, offline
# sm_90 compile), the longer rows in a second launch as ``fine_hist64`` (each launch's programs for the other's rows
# return at once); ``short8_hist40_wide``: that from WIDE_FROM_ROWS rows on, ``fine_hist64`` below. The same short
# launch at 16 warps (40 registers, or 32 and 8 bytes of stack) was slower than ``fine_hist64`` in every case of
# call 24's bench (``short_hist``, ``short_hist32`` there), so it is not offered. ``fused_hist64``: one launch of
# scoring and top-k (``sparse_decode.score_and_select``), a program per row that streams its row's landmarks
# (at rollout A's batch the split grid's score kernel reads at about copy bandwidth and the top-k then runs
# alone, 44.6 + 29.4 us at 16K x 64 in call 23's bench; fused, a row's top-k runs beside another row's
# streaming on the same SM); ``fused_hist64_narrow``: that up to WIDE_FROM_ROWS rows (one wave of its programs, 2
# per SM), ``short8_hist40_wide``'s two launches past it. ``fused_exit_narrow``: that whose histogram rounds stop
# once a bucket holds exactly the keys still needed (TopKVariant.exit_early), in every launch;
# ``fused_packed_narrow``: that with the rounds and the write in fewer block-wide steps (TopKVariant.packed).
# Its scoring loop with more landmarks in flight (4 stages of 128 pages, or 6 of 64, against sparse_decode's 3 of
# 128) scored no faster in call 28's bench (within 2% from 32K at batch 16 and 34, slower at 16K): at one row per SM
# the read is not set by the tiles in flight. Not offered. Nor is scoring each row in two programs at one row per SM
# or fewer, the second to finish running the top-k (a per-row counter, acquire-release): in call 28's bench at batch
# 16 the scoring fell 3-7% but the selection rose 17-22% (``benchmarks/results/speed/call28/kernel_bench_paired/``).
# Nor is the fused launch at 8 warps under 128 registers (23% fewer top-k instructions a program in offline SASS):
# in call 29's bench at batch 16 (one row per SM, so 8 warps an SM) its top-k fell 0-1.1 us but its scoring rose
# 2.7-3.8 us, selection 9-12% slower; at batch 34 (two rows an SM) both within 0.2 us
# (``benchmarks/results/speed/call29/kernel_bench_w8/``). Nor is a 2,048 + 512 tier for the rows of 2,049-2,304
# candidates: in call 30's bench it tied the 2,048 + 256 one (top-k 16.1-16.2 us at 2,061-2,301 candidates, batch 16;
# selection summed over six contexts 233.1 against 233.0 us). Past 2,048 candidates the top-k's 13.5-17.7 us follow the
# scores and the budget (presumably the histogram rounds before a bucket holds exactly the keys still needed), not the
# tier: at one context a budget of 128, 256 or 512 pages moved it by up to 3.2 us
# (``benchmarks/results/speed/call30/``).
# ``fused_rolled_narrow``: ``fused_packed_narrow`` whose histogram rounds are a loop (TopKVariant.rolled).
# ``fused_atomic_narrow``: that whose rounds after the first count by global atomics (TopKVariant.atomic). Nor are
# every round by atomics, or the first round's atomics spread over 4, 8 or 16 copies of its bins: slower than it in
# every case of call 32's benches (``benchmarks/results/speed/call32/``). ``fused_topdigits_narrow``: that whose first
# round counts each key's distance in digits below the row's highest key (TopKVariant.top_digits).
# Nor are rounds whose 256 digits split the live keys' own range [lowest, highest] (a reduction of both a round, a
# shift of ``key - lowest``), so that the first round parts keys of one exponent and two rounds usually end the search:
# in call 31's phase profile the search took 10.7-14.0 us against the fixed digits' three rounds' 7.5-9.9 (batch
# 16, 32K-34.8K), selection 8-15% slower in every case of its bench.
# Nor are the rows of 2,049 to 4,096 candidates offered the 4,096-lane tier (one register block: the 2,048 tier's 29
# block barriers in offline sm_90 SASS against 45 for 2,048 + a tail): in call 31's bench its top-k took 20.2-20.4 us
# at 2,061-2,301 candidates against the 2,048 + 256 tier's 16.2-16.9 (batch 16), and its phase profile put the cost in
# the histograms (3.0-4.0 us a round against 2.3-2.8): they cost what their lanes do, live or not. Nor are a row's
# reserved pages written before its scoring: within 1.0 us either way in every case of that bench
# (``benchmarks/results/speed/call31/``).
# All select ``select_pages``' pages.


def resolve_variant(variant: str | None) -> str:
    """``variant``, or the default for None; an unknown name is a ValueError (scoring and top-k share it)."""
    variant = DEFAULT_SELECT_VARIANT if variant is None else variant
    if variant not in SELECT_VARIANTS:
        raise ValueError(f"selection variant {variant!r}: expected one of {SELECT_VARIANTS}")
    return variant


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
        select_row(scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, bins_ptr,
                   r2t_stride, k, lo, hi, H, PS, SMALL, MEDIUM, LARGE, CHUNK, TAIL_A, TAIL_B, TAIL_C, TAILS, BITS,
                   FINE, FINE_ROW, FINE_TAIL, EXIT, PACKED, ROLLED, ATOMIC, PART != 2, PART != 1)


@triton.jit
def select_row(scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, bins_ptr,
               r2t_stride, k, lo, hi, H: tl.constexpr, PS: tl.constexpr, SMALL: tl.constexpr, MEDIUM: tl.constexpr,
               LARGE: tl.constexpr, CHUNK: tl.constexpr, TAIL_A: tl.constexpr, TAIL_B: tl.constexpr,
               TAIL_C: tl.constexpr, TAILS: tl.constexpr, BITS: tl.constexpr, FINE: tl.constexpr,
               FINE_ROW: tl.constexpr, FINE_TAIL: tl.constexpr, EXIT: tl.constexpr, PACKED: tl.constexpr,
               ROLLED: tl.constexpr, ATOMIC: tl.constexpr, SHORT: tl.constexpr, LONG: tl.constexpr):
    """One row's pages: the reserved ones, then its top-k by the tiers compiled in (SHORT: SMALL and, with
    FINE, FINE's; LONG: MEDIUM and past); EXIT, PACKED, ROLLED, ATOMIC: ``TopKVariant.exit_early``, ``.packed``,
    ``.rolled``, ``.atomic`` (its histogram bins: ``bins_ptr``'s BINS_PER_ROW of this row)."""
    r = tl.program_id(0)
    b = r // H
    h = r % H
    write_reserved(r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, r2t_stride, k, H, PS, SMALL)
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
def write_reserved(r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, r2t_stride, k, H: tl.constexpr,
                   PS: tl.constexpr, BLOCK: tl.constexpr):
    """The page ids of this program's row's reserved pages: sink pages first, recent pages last (current page
    last); a dense row (k 0) is all sink. The top-k's ``k`` slots between them are the top-k's to write."""
    r = tl.program_id(0)
    b = r // H
    h = r % H
    cnt = tl.load(cnt_ptr + b)
    n = tl.load(n_ptr + b)
    s = tl.load(sink_ptr + b)
    row = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    out = out_ptr + tl.load(indptr_ptr + r)
    offs = tl.arange(0, BLOCK)
    for u0 in range(0, cnt - k, BLOCK):
        u = u0 + offs
        m = u < cnt - k
        t = tl.where(u < s, u, u + k)
        page = tl.where(u < s, u, n - (cnt - t))
        slot = tl.load(row + page.to(tl.int64) * PS, mask=m, other=0)
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
    holds exactly the keys still needed; PACKED: each round and each block's write in fewer block-wide steps;
    ATOMIC: ``TopKVariant.atomic``'s histograms, into ``bins``)."""
    if ATOMIC:  # the rounds' bins zeroed, every thread's zeros stored before any atomic
        zero_bins(bins)
    j = lo + tl.arange(0, ROW)
    key = ukey(scores, j, j < hi)
    if TAIL > 0:
        j2 = lo + ROW + tl.arange(0, TAIL)
        key2 = ukey(scores, j2, j2 < hi)
    else:  # not read (TAIL 0): named for ``_round_histogram``'s arguments
        key2 = key
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
    zero = tl.zeros([], tl.int32)
    if PACKED:
        n_eq, n_taken = write_taken_packed(key, j, prefix, k - n_gt, zero, zero, row, out, h, H, PS)
        if TAIL > 0:
            write_taken_packed(key2, j2, prefix, k - n_gt, n_eq, n_taken, row, out, h, H, PS)
    else:
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
                  PACKED=v.packed, ROLLED=v.rolled, ATOMIC=v.atomic_code)
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
