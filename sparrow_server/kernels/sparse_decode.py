"""Triton kernels of block-sparse decode (CUDA-graph safe: grids depend only on static sizes).

Work follows each request's own page count, read on the device: loops run over the request's
candidate pages, never over ``Pcap`` (the server's ``--context-length`` in pages).

- ``update_landmarks``: mean key of the page holding each written slot (fp32 accumulation); prefill
  (``landmarks.py``, re-exported here).
- ``page_scores``: decode, per request: the landmark of the page this step completed (folded in),
  then every candidate page's landmark of each KV head dotted with the mean query of that head's
  group, written to ``[cand_lo, cand_hi)`` of the row only.
- ``select_and_write``: per (request, KV head) row: exact top-k over the candidate scores (radix
  search on order-preserving integer keys, the row held in registers at the smallest tile size
  that fits it, ties to the earlier page, as ``select_pages``)
  and the FlashInfer page ids of sink + top-k + recent pages into the decode wrapper's index buffer
  (its kernels in ``topk.py``, re-exported here).
- ``score_and_select``: a sparse layer's decode selection as the backend runs it (the fused variants: one launch of
  both per (request, KV head) row), which may also copy the query contiguous (``q_out``) and store the step's K and
  V (``store_kv``) for the attention.
Both take ``variant`` (SELECT_VARIANTS; default DEFAULT_SELECT_VARIANT; the server passes its
plug-in setting ``SPARROW_SELECT_VARIANT``): how scoring splits a row across programs and which
register tiers top-k has. Same pages either way.
Semantics (and shapes) are those of ``sparrow_server.kernels.reference``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparrow_server.kernels import DEFAULT_SELECT_VARIANT, SELECT_VARIANTS  # noqa: F401  (re-export)
from sparrow_server.kernels.landmarks import (  # noqa: F401  (re-export)
    check_landmark_scales, page_mean, page_scales, row_update, update_landmarks,
)
from sparrow_server.kernels.reference import per_head_kv_view  # noqa: F401  (re-export)
from sparrow_server.kernels.score_tiles import (  # noqa: F401  (re-export: the scoring's building blocks)
    FLOAT_BIG, ROW_BLOCK_P, ROW_STAGES, copy_group_query, group_query_sum, landmark_scores, request_duties, score_row,
    store_step_kv,
)
from sparrow_server.kernels.page_scores_whole import whole_page_scores
from sparrow_server.kernels.topk import (  # noqa: F401  (re-export: the selection's second half)
    SELECT_ROWS, TOPK_VARIANTS, radix_bins, reserved_ids, resolve_variant, select_and_write, select_launches,
    select_row, tier_launch, write_reserved_from,
)

SCORE_PROGRAMS = 64   # ``v1``: programs per request of ``page_scores`` (each strides over the candidate pages)
SCORE_PROGRAMS_MAX = 128  # split grid (all but v1): most programs per request (one tile each up to 4096 candidates)
SCORE_BLOCK_P = 32    # pages per tile of ``page_scores``
# Split grid: register cap of the score kernel, set when an offline compile without the launcher's alignment
# specialization (every load scalar) put it at 94 registers against v1's 80. Compiled as it runs (16-byte aligned
# arguments) it takes 48 and v1's 32 (benchmarks/results/speed/selection_kernel_resources.log): the cap binds
# neither, and stays only so that the measured kernels stay the same ones.
SCORE_MAXNREG = 80


@triton.jit
def _score_tile(q_row, lm_ptr, lms_ptr, r2t_ptr, out_ptr, b, rpi, r2t_stride, pcap, start, end, H: tl.constexpr,
                G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, BLOCK_P: tl.constexpr, SCALED: tl.constexpr):
    """Scores of candidate pages ``[start, min(start + BLOCK_P, end))`` of request ``b`` (its query heads at
    ``q_row``), every KV head."""
    d = tl.arange(0, D)
    j = start + tl.arange(0, BLOCK_P)
    cand = j < end
    slot = tl.load(r2t_ptr + rpi * r2t_stride + j.to(tl.int64) * PS, mask=cand, other=0).to(tl.int64)
    page = slot // PS
    for h in tl.static_range(H):
        qs = group_query_sum(q_row, 0, h, H, G, D)
        lm = tl.load(lm_ptr + page[:, None] * (H * D) + h * D + d[None, :], mask=cand[:, None], other=0.0)
        sc = landmark_scores(lm, qs, G, page_scales(lms_ptr, page, cand, h, H, SCALED), SCALED)
        tl.store(out_ptr + (b * H + h).to(tl.int64) * pcap + j, sc, mask=cand)


@triton.jit
def _score_kernel(q_ptr, lm_ptr, lms_ptr, k_ptr, loc_ptr, r2t_ptr, rpi_ptr, lo_ptr, hi_ptr, out_ptr, r2t_stride, pcap,
                  q_stride, qout_ptr, kin_ptr, vin_ptr, k_stride, v_stride, vbuf_ptr, H: tl.constexpr,
                  G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, BLOCK_P: tl.constexpr, NPROG: tl.constexpr,
                  EVEN: tl.constexpr, UPDATE: tl.constexpr, LM_BLOCK: tl.constexpr, COPY_Q: tl.constexpr,
                  STORE_KV: tl.constexpr, SCALED: tl.constexpr):
    """Programs (b, p): request ``b``'s query heads read ``q_stride`` elements a token apart; COPY_Q: program
    (b, 0) also copies them into the contiguous ``qout_ptr`` (as the fused launch's ``copy_group_query``).
    STORE_KV (with UPDATE): the landmark's program first stores the step's key and value of every head (as the
    fused launch's ``store_step_kv``)."""
    b = tl.program_id(0)
    p = tl.program_id(1)
    q_row = q_ptr + b.to(tl.int64) * q_stride
    # This step's token completes a page: its landmark, before it can become a candidate (the partial page is
    # always a recent page, never scored). The split grid gives it to the last program, idle unless the row needs
    # every program, so no scoring program runs it first.
    request_duties(q_row, qout_ptr, k_ptr, lm_ptr, lms_ptr, loc_ptr, kin_ptr, vin_ptr, k_stride, v_stride, vbuf_ptr, b,
                    p == 0, p == (NPROG - 1 if EVEN else 0), H, G, D, PS, LM_BLOCK, COPY_Q, UPDATE, STORE_KV, SCALED)
    lo = tl.load(lo_ptr + b)
    hi = tl.load(hi_ptr + b)
    rpi = tl.load(rpi_ptr + b).to(tl.int64)
    if EVEN:
        _score_span_even(q_row, lm_ptr, lms_ptr, r2t_ptr, out_ptr, b, p, rpi, r2t_stride, pcap, lo, hi,
                         H, G, D, PS, BLOCK_P, NPROG, SCALED)
    else:
        for start in range(lo + p * BLOCK_P, hi, NPROG * BLOCK_P):
            _score_tile(q_row, lm_ptr, lms_ptr, r2t_ptr, out_ptr, b, rpi, r2t_stride, pcap, start, hi, H, G, D, PS,
                        BLOCK_P, SCALED)


@triton.jit
def _score_span_even(q_row, lm_ptr, lms_ptr, r2t_ptr, out_ptr, b, p, rpi, r2t_stride, pcap, lo, hi,
                     H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, BLOCK_P: tl.constexpr,
                     NPROG: tl.constexpr, SCALED: tl.constexpr):
    """Program ``p``'s share of the row: the row's ``n`` candidates go to ``m = ceil(n / BLOCK_P)``
    programs (at most NPROG) in contiguous spans of ``n // m`` or ``n // m + 1`` pages, so a row just
    past a multiple of BLOCK_P costs one more concurrent program, not a second tile in series.
    Past NPROG * BLOCK_P candidates a span takes several tiles, of equal size (none nearly empty)."""
    n = hi - lo
    m = tl.minimum(tl.cdiv(n, BLOCK_P), NPROG)
    if p < m:
        a = lo + (p * n) // m
        e = lo + ((p + 1) * n) // m
        tiles = tl.cdiv(e - a, BLOCK_P)
        size = tl.cdiv(e - a, tiles)
        for t in range(tiles):
            start = a + t * size
            _score_tile(q_row, lm_ptr, lms_ptr, r2t_ptr, out_ptr, b, rpi, r2t_stride, pcap, start,
                        tl.minimum(start + size, e), H, G, D, PS, BLOCK_P, SCALED)


@triton.jit
def _row_kernel(q_ptr, lm_ptr, lms_ptr, kbuf_ptr, loc_ptr, scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr,
                k_ptr, lo_ptr, hi_ptr, indptr_ptr, out_ptr, bins_ptr, r2t_stride, q_stride, qout_ptr, kin_ptr, vin_ptr,
                k_stride, v_stride, vbuf_ptr, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                BLOCK_P: tl.constexpr, STAGES: tl.constexpr, UPDATE: tl.constexpr, SELECT: tl.constexpr,
                HOIST: tl.constexpr, COPY_Q: tl.constexpr, STORE_KV: tl.constexpr, SMALL: tl.constexpr,
                MEDIUM: tl.constexpr, LARGE: tl.constexpr, CHUNK: tl.constexpr, TAIL_A: tl.constexpr,
                TAIL_B: tl.constexpr, TAIL_C: tl.constexpr, TAILS: tl.constexpr, BITS: tl.constexpr,
                FINE: tl.constexpr, FINE_ROW: tl.constexpr, FINE_TAIL: tl.constexpr, EXIT: tl.constexpr,
                PACKED: tl.constexpr, ROLLED: tl.constexpr, ATOMIC: tl.constexpr, SCALED: tl.constexpr):
    """One program per (request, KV head) row: its head of the landmark this step completes (UPDATE), its
    scores, then (SELECT) its top-k and index write on those scores, after a barrier that makes every
    thread's score stores visible to the block. HOIST (``TopKVariant.hoisted``): every plan load first, the
    reserved pages' ids gathered before the scoring and stored after it. COPY_Q: the query read ``q_stride``
    elements a token apart and its row's heads copied into ``qout_ptr`` (contiguous), else read contiguous.
    STORE_KV (with UPDATE): first the step's key and value of the row's head (``kin_ptr``, ``vin_ptr``, tokens
    ``k_stride``, ``v_stride`` elements apart) into the pool at the request's slot, as SGLang's ``set_kv_buffer``."""
    r = tl.program_id(0)
    b = r // H
    h = r % H
    if HOIST:  # the plan loads in flight together; the reserved pages' ids on their way during the scoring
        lo = tl.load(lo_ptr + b)
        hi = tl.load(hi_ptr + b)
        row_r2t = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
        if SELECT:
            k = tl.load(k_ptr + b)
            n = tl.load(n_ptr + b)
            cnt = tl.load(cnt_ptr + b)
            s = tl.load(sink_ptr + b)
            out = out_ptr + tl.load(indptr_ptr + r)
        if STORE_KV:
            store_step_kv(kin_ptr, vin_ptr, k_stride, v_stride, kbuf_ptr, vbuf_ptr, loc_ptr, b, h * D, H * D, D)
            tl.debug_barrier()
        if UPDATE:
            row_update(kbuf_ptr, lm_ptr, lms_ptr, loc_ptr, b, h, H, D, PS, SCALED)
        if SELECT:
            t, slot, m = reserved_ids(row_r2t, n, cnt, s, k, 0, PS, SMALL)
    else:
        if STORE_KV:
            store_step_kv(kin_ptr, vin_ptr, k_stride, v_stride, kbuf_ptr, vbuf_ptr, loc_ptr, b, h * D, H * D, D)
            tl.debug_barrier()
        if UPDATE:
            row_update(kbuf_ptr, lm_ptr, lms_ptr, loc_ptr, b, h, H, D, PS, SCALED)
        lo = tl.load(lo_ptr + b)
        hi = tl.load(hi_ptr + b)
        row_r2t = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    if COPY_Q:
        qs = copy_group_query(q_ptr, q_stride, qout_ptr, b, h, H, G, D)
    else:
        qs = group_query_sum(q_ptr, b, h, H, G, D)
    score_row(qs, lm_ptr, lms_ptr, row_r2t, scores_ptr + r.to(tl.int64) * pcap, h, lo, hi, H, G, D, PS, BLOCK_P,
               STAGES, SCALED)
    if SELECT:
        if HOIST:
            tl.store(out + t, slot * H + h, mask=m)
            write_reserved_from(row_r2t, out, n, cnt, s, k, h, SMALL, H, PS, SMALL)
        tl.debug_barrier()
        if not HOIST:
            k = tl.load(k_ptr + b)
        select_row(r, scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, bins_ptr,
                   r2t_stride, k, lo, hi, H, PS, SMALL, MEDIUM, LARGE, CHUNK, TAIL_A, TAIL_B, TAIL_C, TAILS, BITS,
                   FINE, FINE_ROW, FINE_TAIL, EXIT, PACKED, ROLLED, ATOMIC, True, True, not HOIST)


def _row_launch(q, landmarks, landmark_scales, req_to_token, rpi, cand_lo, cand_hi, page_size, scores, k_buf,
                cache_loc, variant, select: tuple | None = None, q_out: Tensor | None = None,
                store_kv: tuple | None = None) -> None:
    """``_row_kernel`` over every row: scores alone, or with ``select`` (the plan's fields, row_indptr, the index
    buffer) the selection too; with ``q_out``, ``q`` copied into it; with ``store_kv``, the step's K and V stored
    first. Arguments a launch does not read are passed as ``cand_lo`` (a pointer of its own)."""
    b, hq, d = q.shape
    h = landmarks.shape[1]
    consts, options = tier_launch(variant)
    fields, row_indptr, out = select or ({}, cand_lo, cand_lo)
    field = lambda name: fields.get(name, cand_lo)  # noqa: E731
    bins = radix_bins(variant, b * h, out) if select else cand_lo
    kin, vin, v_buf = store_kv or (cand_lo, cand_lo, cand_lo)
    _row_kernel[(b * h,)](
        q, landmarks, landmarks if landmark_scales is None else landmark_scales, landmarks if k_buf is None else k_buf,
        cand_lo if cache_loc is None else cache_loc, scores, scores.shape[1], req_to_token, rpi, field("n_pages"),
        field("count"), field("sink"), field("k"), cand_lo, cand_hi, row_indptr, out, bins, req_to_token.stride(0),
        q.stride(0), q if q_out is None else q_out, kin, vin, kin.stride(0), vin.stride(0), v_buf, H=h, G=hq // h, D=d,
        PS=page_size, BLOCK_P=ROW_BLOCK_P, STAGES=ROW_STAGES, UPDATE=k_buf is not None, SELECT=select is not None,
        HOIST=TOPK_VARIANTS[resolve_variant(variant)].hoisted, COPY_Q=q_out is not None, STORE_KV=store_kv is not None,
        SCALED=landmark_scales is not None, **consts, **options)


def score_and_select(q: Tensor, landmarks: Tensor, req_to_token: Tensor, req_pool_indices: Tensor, fields: dict,
                     row_indptr: Tensor, page_size: int, scores: Tensor, out: Tensor, k_buf: Tensor | None = None,
                     cache_loc: Tensor | None = None, variant: str | None = None, q_out: Tensor | None = None,
                     store_kv: tuple[Tensor, Tensor, Tensor] | None = None,
                     landmark_scales: Tensor | None = None) -> None:
    """A sparse layer's selection, as the backend runs it: ``page_scores`` then ``select_and_write`` (the plan's
    ``fields``: n_pages, count, sink, k, cand_lo, cand_hi), or for a fused variant at its rows one launch of both.
    Same scores, pages and landmark update either way. ``q_out`` (where ``copies_query``): ``q`` may lie a stride
    apart per token, and the launch also copies it into ``q_out`` (contiguous, for the attention). ``store_kv``
    (where ``stores_kv``; with ``k_buf`` and ``cache_loc``): the step's key and value ([B, H, D], each token's heads
    adjacent, its tokens a stride apart) and the value pool: the launch stores them at ``cache_loc`` first, as
    SGLang's ``set_kv_buffer`` would (a plain pool of their dtype), so the landmark update sees the step's key.
    ``landmark_scales``: float8 landmarks' scales ([pages, H] float32, ``reference.store_landmarks``)."""
    variant = resolve_variant(variant)
    check_landmark_scales(landmarks, landmark_scales)
    f = fields
    if q_out is not None:
        assert copies_query(variant), "the query copy is a copying variant's"
    if store_kv is not None:
        assert stores_kv(variant), "the K/V store is a storing variant's"
    if TOPK_VARIANTS[variant].fuses(q.shape[0] * landmarks.shape[1]):
        _check_query_copy(q, q_out)
        _check_step_kv(store_kv, k_buf, cache_loc)
        _row_launch(q, landmarks, landmark_scales, req_to_token, req_pool_indices, f["cand_lo"], f["cand_hi"],
                    page_size, scores, k_buf, cache_loc, variant, select=(f, row_indptr, out), q_out=q_out,
                    store_kv=store_kv)
        return
    page_scores(q, landmarks, req_to_token, req_pool_indices, f["cand_lo"], f["cand_hi"], page_size, scores, k_buf,
                cache_loc, variant, q_out=q_out, store_kv=store_kv, landmark_scales=landmark_scales)
    select_and_write(scores, req_to_token, req_pool_indices, f["n_pages"], f["count"], f["sink"], f["k"],
                     f["cand_lo"], f["cand_hi"], row_indptr, landmarks.shape[1], page_size, out, variant)


def copies_query(variant: str | None) -> bool:
    """Whether ``score_and_select`` takes a query strided per token and copies it contiguous
    (``TopKVariant.copies_query``: in its fused launch, or past its rows in the split scoring's first program of
    each request): the backend then needs no copy kernel of its own, at any batch."""
    return TOPK_VARIANTS[resolve_variant(variant)].copies_query


def query_copy(q: Tensor, copies: bool) -> Tensor | None:
    """The contiguous twin ``q_out`` that ``score_and_select`` copies ``q`` into for the attention where the variant
    copies the query (``copies``: its ``copies_query``), else None. At every batch size alike, also where ``q`` reads
    as contiguous already: one request's slice of the QKV output does (PyTorch ignores a size-1 dimension's stride),
    and a launch without the copy is another compile of the kernel (batch 1's 19-21 s capture pause in call 45, gone
    in call 46: ``benchmarks/results/speed/call46/capture_times.md``)."""
    return torch.empty(q.shape, dtype=q.dtype, device=q.device) if copies else None


def stores_kv(variant: str | None) -> bool:
    """Whether ``score_and_select`` stores the step's K and V given ``store_kv`` (``TopKVariant.stores_kv``, either
    launch path): the backend then skips SGLang's ``set_kv_buffer`` where its pool is a plain one of K's dtype."""
    return TOPK_VARIANTS[resolve_variant(variant)].stores_kv


def _check_step_kv(store_kv: tuple | None, k_buf: Tensor | None, cache_loc: Tensor | None) -> None:
    """The step's K and V as the store reads them: [B, H, D] of the pools' dtype, each token's heads adjacent (its
    tokens any stride apart); the value pool the key pool's twin; the slots given."""
    if store_kv is None:
        return
    k, v, v_buf = store_kv
    assert k_buf is not None and cache_loc is not None and cache_loc.shape[0] == k.shape[0]
    assert k.shape == v.shape and k.shape[1:] == k_buf.shape[1:] and v_buf.shape == k_buf.shape
    assert all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (k, v))
    assert k.dtype == v.dtype == k_buf.dtype == v_buf.dtype and k_buf.is_contiguous() and v_buf.is_contiguous()


def _check_query_copy(q: Tensor, q_out: Tensor | None) -> None:
    """A strided query's heads each contiguous and adjacent (a slice of a token's row), ``q_out`` its contiguous
    twin."""
    if q_out is not None:
        assert q.stride(2) == 1 and q.stride(1) == q.shape[2] and q_out.is_contiguous() and q_out.shape == q.shape
    else:
        assert q.is_contiguous(), "a strided query needs q_out"


def score_programs(pcap: int, variant: str | None = None) -> int:
    """Programs per request of ``page_scores``: static (a server's Pcap), so CUDA-graph safe. The
    split grid (every variant but v1) is sized to the longest row the server can hold, so every row
    gets one tile per program."""
    if resolve_variant(variant) == "v1":
        return SCORE_PROGRAMS
    return max(1, min(SCORE_PROGRAMS_MAX, triton.cdiv(pcap, SCORE_BLOCK_P)))


def page_scores(q: Tensor, landmarks: Tensor, req_to_token: Tensor, req_pool_indices: Tensor,
                cand_lo: Tensor, cand_hi: Tensor, page_size: int, out: Tensor, k_buf: Tensor | None = None,
                cache_loc: Tensor | None = None, variant: str | None = None, q_out: Tensor | None = None,
                store_kv: tuple[Tensor, Tensor, Tensor] | None = None,
                landmark_scales: Tensor | None = None) -> Tensor:
    """q: [B, H*G, D] contiguous, or with ``q_out`` (its contiguous twin, which the launch fills) strided per
    token; out: [B*H, Pcap] float32, written on ``[cand_lo, cand_hi)`` only. ``store_kv``: as ``score_and_select``.

    With ``k_buf`` and ``cache_loc`` ([B] slots written this step), first recompute the landmark of
    each page that slot completes. ``variant``: one of SELECT_VARIANTS (default DEFAULT_SELECT_VARIANT).
    ``landmark_scales``: as ``score_and_select``'s. Returns out."""
    b, hq, d = q.shape
    h = landmarks.shape[1]
    update = k_buf is not None
    variant = resolve_variant(variant)
    _check_query_copy(q, q_out)
    _check_step_kv(store_kv, k_buf, cache_loc)
    scaled = check_landmark_scales(landmarks, landmark_scales)
    if TOPK_VARIANTS[variant].fuses(b * h):  # the fused launch's own scoring, without its selection
        _row_launch(q, landmarks, landmark_scales, req_to_token, req_pool_indices, cand_lo, cand_hi, page_size, out,
                    k_buf, cache_loc, variant, q_out=q_out, store_kv=store_kv)
        return out
    if TOPK_VARIANTS[variant].scores_whole_pages:
        return whole_page_scores(q, landmarks, landmark_scales if scaled else None, req_to_token, req_pool_indices,
                                 cand_lo, cand_hi, page_size, out, k_buf, cache_loc, q_out, store_kv)
    nprog = score_programs(out.shape[1], variant)
    kin, vin, v_buf = store_kv or (cand_lo, cand_lo, cand_lo)
    _score_kernel[(b, nprog)](
        q, landmarks, landmark_scales if scaled else landmarks, k_buf if update else landmarks,
        cache_loc if update else cand_lo, req_to_token, req_pool_indices, cand_lo, cand_hi, out, req_to_token.stride(0),
        out.shape[1], q.stride(0), q if q_out is None else q_out, kin, vin, kin.stride(0), vin.stride(0), v_buf, H=h,
        G=hq // h, D=d, PS=page_size, BLOCK_P=SCORE_BLOCK_P, NPROG=nprog, EVEN=variant != "v1", UPDATE=update,
        LM_BLOCK=triton.next_power_of_2(h * d), COPY_Q=q_out is not None, STORE_KV=store_kv is not None, SCALED=scaled,
        num_warps=8, **({} if variant == "v1" else {"maxnreg": SCORE_MAXNREG}))
    return out
