"""Triton building blocks of a sparse layer's scoring, shared by its launches (``sparse_decode``'s split grid and fused
row programs, ``page_scores_whole``' whole-page grid): a KV head's group query sum, a landmark tile's scores, one row's
pipelined scoring loop, the query copy and the step's K/V store. Re-exported by ``sparse_decode``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from sparrow_server.kernels.landmarks import page_mean, page_scales

# Fused variants (``TopKVariant.fused``): pages per tile of a row program's scoring loop (128 pages of one KV
# head: 32 KB of bf16 landmarks, 16-byte loads; 44 registers, no spill, sm_90): one program per SM must stream its
# row at about its share of HBM bandwidth.
ROW_BLOCK_P = 128
# Stages of the row loop's pipeline (Triton's cp.async into shared memory: 2 tiles, 64 KB, in flight while a third
# is reduced; 67 KB of shared memory a program, so two programs still share an SM). Without it a program waited a
# memory latency per tile (call 25's first bench: 21 GB/s a program at 32K x 16); with it, in the second, selection
# at batch 16 fell 1.6-3.2 us a layer from 32K tokens on and rose 2.8 us at 16K (fewer tiles than stages to fill).
# Deeper (4 stages of 128 pages, 6 of 64) scored no faster in call 28's bench (within 2% from 32K).
ROW_STAGES = 3
FLOAT_BIG = tl.constexpr(3.4028234663852886e38)  # float32 max; scores are clamped to +-FLOAT_BIG / 2 (``select_pages``)


@triton.jit
def group_query_sum(q_ptr, b, h, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr):
    """[D] fp32 sum of the query heads of KV head ``h``'s group (heads ``h * G`` to ``h * G + G - 1``)."""
    d = tl.arange(0, D)
    qs = tl.zeros([D], dtype=tl.float32)
    for g in tl.static_range(G):
        qs += tl.load(q_ptr + (b * H * G + h * G + g) * D + d).to(tl.float32)
    return qs


@triton.jit
def landmark_scores(lm, qs, G: tl.constexpr, scale, SCALED: tl.constexpr):
    """Scores of a [pages, D] landmark tile (SCALED: times its pages' ``scale``) against the group's mean query,
    ``clamp_scores``'d."""
    sc = tl.sum(lm.to(tl.float32) * (qs / G)[None, :], axis=1)
    if SCALED:
        sc = sc * scale  # a power of two: the same score as the scaled landmark's, bit for bit
    return clamp_scores(sc)


@triton.jit
def clamp_scores(sc):
    """Scores as ``select_pages`` ranks them: NaN the lowest candidate, +-inf clamped to +-FLOAT_BIG / 2."""
    sc = tl.where(sc != sc, -FLOAT_BIG / 2, sc)
    return tl.minimum(tl.maximum(sc, -FLOAT_BIG / 2), FLOAT_BIG / 2)


@triton.jit
def tile_pages(row_r2t, j, hi, PS: tl.constexpr):
    """Physical pages of candidate pages ``j`` (0 past ``hi``) of one request (int32: registers across the loop)."""
    return tl.load(row_r2t + j.to(tl.int64) * PS, mask=j < hi, other=0) // PS


@triton.jit
def landmark_tile(lm_ptr, page, j, hi, h, H: tl.constexpr, D: tl.constexpr):
    """[pages, D] landmarks of head ``h`` of physical ``page``s (zero past ``hi``)."""
    d = tl.arange(0, D)
    return tl.load(lm_ptr + page.to(tl.int64)[:, None] * (H * D) + h * D + d[None, :], mask=(j < hi)[:, None],
                   other=0.0)


@triton.jit
def copy_group_query(q_ptr, q_stride, qout_ptr, b, h, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr):
    """``group_query_sum`` of a query whose tokens lie ``q_stride`` elements apart (SGLang's q: a slice of the
    fused QKV output), each of the group's heads also stored into the contiguous ``qout_ptr`` ([B, H * G, D]), the
    query FlashInfer's decode then reads."""
    d = tl.arange(0, D)
    qs = tl.zeros([D], dtype=tl.float32)
    for g in tl.static_range(G):
        x = tl.load(q_ptr + b.to(tl.int64) * q_stride + (h * G + g) * D + d)
        tl.store(qout_ptr + (b * H * G + h * G + g) * D + d, x)
        qs += x.to(tl.float32)
    return qs


@triton.jit
def copy_request_query(q_row, qout_row, HG: tl.constexpr, D: tl.constexpr):
    """One request's ``HG`` query heads from ``q_row`` into the contiguous ``qout_row``, a head at a time."""
    d = tl.arange(0, D)
    for i in tl.static_range(HG):
        tl.store(qout_row + i * D + d, tl.load(q_row + i * D + d))


@triton.jit
def score_row(qs, lm_ptr, lms_ptr, row_r2t, out, h, lo, hi, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
               PS: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr, SCALED: tl.constexpr):
    """Scores of one (request, KV head) row's candidates ``[lo, hi)`` into ``out``, as ``_score_tile``'s, against
    its group's query sum ``qs``. The loop is software-pipelined (STAGES): the page ids and landmarks of the next
    tiles copy asynchronously into shared memory while this tile is reduced."""
    offs = tl.arange(0, BLOCK_P)
    for start in tl.range(lo, hi, BLOCK_P, num_stages=STAGES):
        j = start + offs
        page = tile_pages(row_r2t, j, hi, PS)
        lm = landmark_tile(lm_ptr, page, j, hi, h, H, D)
        tl.store(out + j, landmark_scores(lm, qs, G, page_scales(lms_ptr, page, j < hi, h, H, SCALED), SCALED),
                 mask=j < hi)


@triton.jit
def store_step_kv(kin_ptr, vin_ptr, k_stride, v_stride, kbuf_ptr, vbuf_ptr, loc_ptr, b, first, HD: tl.constexpr,
                   N: tl.constexpr):
    """Elements ``[first, first + N)`` of request ``b``'s step key and value (tokens ``k_stride``, ``v_stride``
    apart) into the token-major pools' rows (``HD`` elements) at its slot. The caller then holds a block barrier
    before the landmark update reads the slot's key back."""
    loc = tl.load(loc_ptr + b).to(tl.int64)
    e = first + tl.arange(0, N)
    tl.store(kbuf_ptr + loc * HD + e, tl.load(kin_ptr + b.to(tl.int64) * k_stride + e))
    tl.store(vbuf_ptr + loc * HD + e, tl.load(vin_ptr + b.to(tl.int64) * v_stride + e))


@triton.jit
def request_duties(q_row, qout_ptr, k_ptr, lm_ptr, lms_ptr, loc_ptr, kin_ptr, vin_ptr, k_stride, v_stride, vbuf_ptr,
                    b, copy_here, update_here, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                    LM_BLOCK: tl.constexpr, COPY_Q: tl.constexpr, UPDATE: tl.constexpr, STORE_KV: tl.constexpr,
                    SCALED: tl.constexpr):
    """A scoring grid's per-request work, in the program it names: COPY_Q (``copy_here``), request ``b``'s query heads
    from ``q_row`` into the contiguous ``qout_ptr``; UPDATE (``update_here``), STORE_KV's step key and value of every
    head, then the landmark of the page the step's slot completes (a recent page, never a candidate this step)."""
    if COPY_Q:
        if copy_here:
            copy_request_query(q_row, qout_ptr + b.to(tl.int64) * (H * G * D), H * G, D)
    if UPDATE:
        if update_here:
            if STORE_KV:
                for hh in tl.static_range(H):
                    store_step_kv(kin_ptr, vin_ptr, k_stride, v_stride, k_ptr, vbuf_ptr, loc_ptr, b, hh * D, H * D, D)
                tl.debug_barrier()
            loc = tl.load(loc_ptr + b).to(tl.int64)
            page_mean(k_ptr, lm_ptr, lms_ptr, loc, (loc % PS) == PS - 1, H, D, PS, LM_BLOCK, SCALED)
