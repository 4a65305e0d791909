"""Triton building blocks of the exact radix top-k (``topk``): order-preserving integer keys of fp32 scores,
one radix round (2-bit compares or an 8-bit histogram, plain or in fewer block-wide steps), and the index write of
the keys a search took, in page order (block by block, or both blocks of a row ranked before either gathers). At one
row per SM the top-k is a chain of the block-wide reductions these make (``benchmarks/selection_kernel_resources.py
--tiers`` counts their barriers), so the packed forms fold them.
"""
from __future__ import annotations

import triton
import triton.language as tl

BINS_PER_ROW = tl.constexpr(768)  # int32 bins a row of the atomic histograms: 256 digits for each of rounds 2-4
TOP_DIGITS = tl.constexpr(32)  # ``top_digits_round``'s bins: distances of 0-30 digits below the highest key, then more


@triton.jit
def ukey(scores_ptr, j, m):
    """Order-preserving unsigned key of fp32 scores (int64 in [0, 2**32)); -1 where masked."""
    bits = tl.load(scores_ptr + j, mask=m, other=0.0).to(tl.int32, bitcast=True)
    bits = tl.where(bits == -2147483648, 0, bits)  # -0.0 ties with +0.0
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648
    return tl.where(m, key, -1)


@triton.jit
def count_at_least(key, thr):
    """[NT] counts of ``key`` >= each threshold."""
    return tl.sum((key[:, None] >= thr[None, :]).to(tl.int32), axis=0)


@triton.jit
def radix_round(counts, k, prefix, shift, NT: tl.constexpr):
    """One round of the k-th largest key search over NT = 2**bits digits: (new prefix, keys >= new
    prefix + 1, which is the count above the threshold after the last round)."""
    c = tl.arange(0, NT).to(tl.int64)
    sel = tl.sum((counts >= k).to(tl.int32), axis=0)   # counts fall with c; c = -1 (the prefix) holds k
    return prefix + (sel.to(tl.int64) << shift), tl.sum(tl.where(c == sel, counts, 0), axis=0)


@triton.jit
def bucket_histogram(key, prefix, shift):
    """[256] counts of the next 8-bit digit (at ``shift``) of the keys whose higher bits equal
    ``prefix``'s (all valid keys in the first round, ``shift`` 24)."""
    live = (key >= 0) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
    return tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=live)


@triton.jit
def zero_bins(bins):
    """A row's BINS_PER_ROW bins zeroed, every thread's zeros stored before the barrier (so before any atomic)."""
    offs = tl.arange(0, 1024)
    tl.store(bins + offs, tl.zeros([1024], tl.int32), mask=offs < BINS_PER_ROW)
    tl.debug_barrier()


@triton.jit
def atomic_histogram(key, prefix, shift, bins):
    """``bucket_histogram``'s counts added into 256 zeroed int32 ``bins`` (global memory) by one atomic a live key:
    its cost follows the live keys, where Triton 3.6's ``tl.histogram`` costs ballots and popcounts a lane whether
    live or not, and 256 shared atomics a warp."""
    live = (key >= 0) & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
    tl.atomic_add(bins + ((key >> shift) & 255).to(tl.int32), 1, mask=live, sem="relaxed", scope="cta")


@triton.jit
def read_bins(bins):
    """The 256 counts of ``atomic_histogram`` once every thread's atomics are done: the block barrier orders them before
    the read (without it the GPU kernel tests of ``fused_atomic_narrow`` fail, call 32's breaks). Read ``.cg``, from
    L2 where the atomics ran, as a precaution: read through L1 the same tests passed on an H200."""
    tl.debug_barrier()
    return tl.load(bins + tl.arange(0, 256), cache_modifier=".cg")


@triton.jit
def top_digits_round(key, key2, k, TAIL: tl.constexpr):
    """The first round (top 8 bits) by a 32-bin histogram of each key's distance in digits below the highest key's
    (the last bin: 31 or more): Triton 3.6 lowers it to 6 ballots and a popcount a key, the 256-bin one to 9 and 8. The
    k-th largest key's digit is the first distance with at least ``k`` keys at or above it (``key2``: a second
    block, with TAIL). Returns ``histogram_round_packed``'s (prefix, keys above its bucket, exact) and 1 if that
    digit is within 30 of the top, else 0 (the caller then takes the round by the 256-bin histogram)."""
    top = tl.max(key, axis=0)
    if TAIL > 0:
        top = tl.maximum(top, tl.max(key2, axis=0))
    hist = tl.histogram(tl.minimum((top >> 24) - (key >> 24), TOP_DIGITS - 1).to(tl.int32), TOP_DIGITS,
                        mask=key >= 0)
    if TAIL > 0:
        hist += tl.histogram(tl.minimum((top >> 24) - (key2 >> 24), TOP_DIGITS - 1).to(tl.int32), TOP_DIGITS,
                             mask=key2 >= 0)
    at_least = tl.cumsum(hist, axis=0)  # keys at most c digits below the top: rises with c
    # the k-th key's distance is the first with k or more: fewer before it, exactly k iff any distance has k
    fewer = at_least < k
    packed = tl.sum(fewer.to(tl.int32) + ((at_least == k).to(tl.int32) << 8), axis=0)
    sel = packed & 255
    above = tl.max(tl.where(fewer, at_least, 0), axis=0)
    return ((top >> 24) - sel) << 24, above, ((packed >> 8) > 0).to(tl.int32), (sel < TOP_DIGITS - 1).to(tl.int32)


@triton.jit
def histogram_round(hist, k, n_gt, prefix, shift):
    """One 8-bit round: the digit holding the k-th largest key among the live ones (``k - n_gt``-th
    of them: ``n_gt`` keys are above the live bucket). Returns (prefix, keys above the new bucket, 1 if
    the new bucket holds exactly the ``k - n_gt`` keys still needed, else 0)."""
    need = k - n_gt
    at_least = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # live keys with digit >= c
    # at_least falls with c and is >= need at c = 0: sel is the last digit where it is; at_least[sel] == need
    # iff some digit has at_least == need (those digits are sel and the empty buckets just below it). One
    # reduction counts both: the first in the low 9 bits (at most 256), the second above them.
    both = tl.sum((at_least >= need).to(tl.int32) + (at_least == need).to(tl.int32) * 512, axis=0)
    sel = (both & 511) - 1
    c = tl.arange(0, 256)
    above = tl.sum(tl.where(c == sel, at_least - hist, 0), axis=0)
    return prefix + (sel.to(tl.int64) << shift), n_gt + above, (both >= 512).to(tl.int32)


@triton.jit
def histogram_round_packed(hist, k, n_gt, prefix, shift):
    """``histogram_round`` in one scan and one reduction: digits with at least ``need`` live keys at or above
    them (sel + 1), digits with exactly ``need`` (the bucket is exact iff any), and the live keys above sel's
    bucket (those of the digits with fewer than ``need`` at or above them), packed in 9 + 9 + 13 bits (at most
    256 digits and LARGE keys)."""
    need = k - n_gt
    at_least = tl.cumsum(hist, axis=0, reverse=True)  # live keys with digit >= c
    fewer = at_least < need
    packed = tl.sum((~fewer).to(tl.int32) + ((at_least == need).to(tl.int32) << 9) + (tl.where(fewer, hist, 0) << 18),
                    axis=0)
    sel = (packed & 511) - 1
    exact = (((packed >> 9) & 511) > 0).to(tl.int32)
    return prefix + (sel.to(tl.int64) << shift), n_gt + (packed >> 18), exact


@triton.jit
def write_taken(key, j, prefix, need, n_eq, n_taken, row, out, h, H: tl.constexpr, PS: tl.constexpr):
    """Write the page ids of the keys above ``prefix`` and of the first ``need`` equal to it (after
    ``n_eq`` equal ones before this block), at ranks from ``n_taken``: page order. Returns the
    running (n_eq, n_taken)."""
    eq = key == prefix
    take = (key > prefix) | (eq & (n_eq + tl.cumsum(eq.to(tl.int32), axis=0) <= need))
    rank = n_taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
    slot = tl.load(row + j.to(tl.int64) * PS, mask=take, other=0)
    tl.store(out + rank, slot * H + h, mask=take)
    return n_eq + tl.sum(eq.to(tl.int32), axis=0), n_taken + tl.sum(take.to(tl.int32), axis=0)


@triton.jit
def taken_ranks_packed(key, prefix, need, n_eq, n_taken):
    """``write_taken``'s choice in one scan (and one sum for the running counts, unused after the last block): a taken
    key's rank is the keys above ``prefix`` up to it plus the equal ones taken up to it, the first ``need`` of them
    overall (``n_eq`` before this block). Counts of one block fit 16 bits (at most LARGE keys). Returns (taken, rank,
    running n_eq, running n_taken)."""
    gt = key > prefix
    eq = key == prefix
    upto = tl.cumsum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)  # inclusive: above (low 16 bits), equal
    eq_upto = n_eq + (upto >> 16)
    take = gt | (eq & (eq_upto <= need))
    before = tl.minimum(n_eq, need)  # equal keys taken in earlier blocks
    rank = n_taken + (upto & 0xFFFF) + tl.minimum(eq_upto, need) - before - 1
    total = tl.sum(gt.to(tl.int32) + (eq.to(tl.int32) << 16), axis=0)
    n_eq_all = n_eq + (total >> 16)
    return take, rank, n_eq_all, n_taken + (total & 0xFFFF) + tl.minimum(n_eq_all, need) - before


@triton.jit
def write_taken_packed(key, j, prefix, need, n_eq, n_taken, row, out, h, H: tl.constexpr, PS: tl.constexpr):
    """``write_taken`` in fewer block-wide steps (``taken_ranks_packed``)."""
    take, rank, n_eq, n_taken = taken_ranks_packed(key, prefix, need, n_eq, n_taken)
    slot = tl.load(row + j.to(tl.int64) * PS, mask=take, other=0)
    tl.store(out + rank, slot * H + h, mask=take)
    return n_eq, n_taken


@triton.jit
def write_row_packed(key, j, key2, j2, prefix, need, row, out, h, H: tl.constexpr, PS: tl.constexpr,
                     TAIL: tl.constexpr, JOINT: tl.constexpr):
    """``write_taken_packed`` of a row's register block and (TAIL) its second block: block by block (JOINT 0), both
    ranked before either gathers its page ids (1), or (2) each block's ids gathered for every key at or above
    ``prefix`` (the taken ones and any equal ones past ``need``) before the ranks are scanned. Each block's gather
    from ``req_to_token`` is a memory latency before its store can issue; block by block, a warp waiting on the
    first block's held every warp at the second block's scan (one latency a block, not one a row); gathered first,
    the latency runs under the scans."""
    zero = tl.zeros([], tl.int32)
    if JOINT == 2:
        slot = tl.load(row + j.to(tl.int64) * PS, mask=key >= prefix, other=0)
        if TAIL > 0:
            slot2 = tl.load(row + j2.to(tl.int64) * PS, mask=key2 >= prefix, other=0)
        take, rank, n_eq, n_taken = taken_ranks_packed(key, prefix, need, zero, zero)
        tl.store(out + rank, slot * H + h, mask=take)
        if TAIL > 0:
            take2, rank2, n_eq, n_taken = taken_ranks_packed(key2, prefix, need, n_eq, n_taken)
            tl.store(out + rank2, slot2 * H + h, mask=take2)
    elif JOINT and (TAIL > 0):
        take, rank, n_eq, n_taken = taken_ranks_packed(key, prefix, need, zero, zero)
        take2, rank2, n_eq, n_taken = taken_ranks_packed(key2, prefix, need, n_eq, n_taken)
        slot = tl.load(row + j.to(tl.int64) * PS, mask=take, other=0)
        slot2 = tl.load(row + j2.to(tl.int64) * PS, mask=take2, other=0)
        tl.store(out + rank, slot * H + h, mask=take)
        tl.store(out + rank2, slot2 * H + h, mask=take2)
    else:
        n_eq, n_taken = write_taken_packed(key, j, prefix, need, zero, zero, row, out, h, H, PS)
        if TAIL > 0:
            write_taken_packed(key2, j2, prefix, need, n_eq, n_taken, row, out, h, H, PS)
