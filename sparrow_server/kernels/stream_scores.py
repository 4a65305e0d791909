"""The streamed scoring of a sparse layer's rows past its fused launch (``TopKVariant.streams_scores``).

Past one wave of row programs (264 rows: batch 34 at 8 KV heads, rollout A's 64 requests) the split grid scores each
request with one program per tile of 32 pages across its KV heads, sized to the server's longest row: at 34 x 32K
2,720 programs, at 64 x 16K 5,120 (3,072 of them with nothing to do), each a chain of dependent loads (plan, page
ids, then one head's tile after another) that holds a few KB in flight. That grid reads the landmarks at 2.3-3.1 TB/s
where the same replay's attention reads the KV at 3.6-3.8 (call 47's profiles), and float8 landmarks, half the bytes,
scored no faster there (call 43): it is latency-bound. Here a fixed grid of a few programs an SM (CUDA-graph safe: it
depends on the device alone) splits every row's candidate tiles (``BLOCK_P`` pages of one KV head) evenly by count,
in order, so that each program streams a contiguous share, one or a few rows' runs, through the fused row's
pipelined loop (``score_tiles._score_row``): the same scores, written to the same places, as the split grid's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparrow_server.kernels.landmarks import page_mean
from sparrow_server.kernels.score_tiles import (ROW_STAGES, _copy_request_query, _group_query_sum, _score_row,
                                                _store_step_kv)

STREAM_BLOCK_P = 64   # pages per tile: 16 KB of one KV head's bf16 landmarks
STREAM_PROGRAMS_PER_SM = 4  # 3 stages of 16 KB of shared memory a program: four share an SM's 228 KB
STREAM_WARPS = 4
STREAM_PROGRAMS_INTERPRETED = 5  # CPU tensors (the Triton interpreter): few programs, so shares cut rows anywhere


@triton.jit
def _stream_score_kernel(q_ptr, lm_ptr, lms_ptr, k_ptr, loc_ptr, r2t_ptr, rpi_ptr, lo_ptr, hi_ptr, out_ptr, r2t_stride,
                         pcap, q_stride, qout_ptr, kin_ptr, vin_ptr, k_stride, v_stride, vbuf_ptr, B,
                         H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, BLOCK_P: tl.constexpr,
                         STAGES: tl.constexpr, BMAX: tl.constexpr, UPDATE: tl.constexpr, LM_BLOCK: tl.constexpr,
                         COPY_Q: tl.constexpr, STORE_KV: tl.constexpr, SCALED: tl.constexpr):
    """Program ``p`` of ``P``: first each request ``b = p, p + P, ...``'s duties (COPY_Q: its query heads into the
    contiguous ``qout_ptr``; UPDATE: STORE_KV's step K/V, then the landmark of the page its slot completes, which is
    a recent page, never a candidate this step); then its share of every row's candidate tiles."""
    p = tl.program_id(0)
    nprog = tl.num_programs(0)
    for i in range(p, B, nprog):
        b = tl.cast(i, tl.int32)  # a tensor, as a program id is (the interpreter's loop counter is an int)
        if COPY_Q:
            at = tl.cast(b, tl.int64)
            _copy_request_query(q_ptr + at * q_stride, qout_ptr + at * (H * G * D), H * G, D)
        if UPDATE:
            if STORE_KV:
                for hh in tl.static_range(H):
                    _store_step_kv(kin_ptr, vin_ptr, k_stride, v_stride, k_ptr, vbuf_ptr, loc_ptr, b, hh * D, H * D,
                                   D)
                tl.debug_barrier()
            loc = tl.load(loc_ptr + b).to(tl.int64)
            page_mean(k_ptr, lm_ptr, lms_ptr, loc, (loc % PS) == PS - 1, H, D, PS, LM_BLOCK, SCALED)
    r = tl.arange(0, BMAX)
    lo = tl.load(lo_ptr + r, mask=r < B, other=0)
    hi = tl.load(hi_ptr + r, mask=r < B, other=0)
    tiles = tl.where(hi > lo, (hi - lo + BLOCK_P - 1) // BLOCK_P, 0)  # per KV head of request r
    ends = tl.cumsum(tiles * H, 0)  # request r's rows are tiles [ends[r] - H * tiles[r], ends[r]) of all
    share = tl.cdiv(tl.max(ends, 0), nprog)
    first = p * share
    last = tl.minimum(first + share, tl.max(ends, 0))
    if first < last:
        for b in range(tl.sum((ends <= first).to(tl.int32), 0), tl.sum((ends < last).to(tl.int32), 0) + 1):
            _stream_request(q_ptr, lm_ptr, lms_ptr, r2t_ptr, rpi_ptr, out_ptr, r2t_stride, pcap, q_stride, b, r, lo,
                            hi, tiles, ends, first, last, H, G, D, PS, BLOCK_P, STAGES, SCALED)


@triton.jit
def _stream_request(q_ptr, lm_ptr, lms_ptr, r2t_ptr, rpi_ptr, out_ptr, r2t_stride, pcap, q_stride, b, r, lo, hi, tiles,
                    ends, first, last, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                    BLOCK_P: tl.constexpr, STAGES: tl.constexpr, SCALED: tl.constexpr):
    """The tiles of request ``b`` inside ``[first, last)``: a run of each of its rows (KV heads) in turn."""
    at = r == b
    n = tl.maximum(tl.sum(tl.where(at, tiles, 0), 0), 1)  # tiles a row (1 where none: then no tile is in range)
    start = tl.sum(tl.where(at, ends, 0), 0) - H * tl.sum(tl.where(at, tiles, 0), 0)
    lo_b = tl.sum(tl.where(at, lo, 0), 0)
    hi_b = tl.sum(tl.where(at, hi, 0), 0)
    s = tl.maximum(first - start, 0)
    e = tl.minimum(last - start, H * tl.sum(tl.where(at, tiles, 0), 0))
    row_r2t = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    q_row = q_ptr + tl.cast(b, tl.int64) * q_stride
    for h in range(s // n, (e + n - 1) // n):
        t0 = tl.maximum(s - h * n, 0)
        t1 = tl.minimum(e - h * n, n)
        _score_row(_group_query_sum(q_row, 0, h, H, G, D), lm_ptr, lms_ptr, row_r2t,
                   out_ptr + tl.cast(b * H + h, tl.int64) * pcap, h, lo_b + t0 * BLOCK_P,
                   tl.minimum(lo_b + t1 * BLOCK_P, hi_b), H, G, D, PS, BLOCK_P, STAGES, SCALED)


def stream_programs(device: torch.device) -> int:
    """The streamed grid's programs on ``device``: STREAM_PROGRAMS_PER_SM an SM (static: CUDA-graph safe)."""
    if device.type != "cuda":
        return STREAM_PROGRAMS_INTERPRETED
    return STREAM_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def stream_page_scores(q: Tensor, landmarks: Tensor, landmark_scales: Tensor | None, req_to_token: Tensor,
                       req_pool_indices: Tensor, cand_lo: Tensor, cand_hi: Tensor, page_size: int, out: Tensor,
                       k_buf: Tensor | None, cache_loc: Tensor | None, q_out: Tensor | None, store_kv: tuple | None,
                       programs: int | None = None) -> Tensor:
    """``sparse_decode.page_scores`` past the fused rows, streamed (its arguments, checked there); ``programs``
    overrides ``stream_programs``."""
    b, hq, d = q.shape
    h = landmarks.shape[1]
    kin, vin, v_buf = store_kv or (cand_lo, cand_lo, cand_lo)
    grid = (programs or stream_programs(q.device),)
    _stream_score_kernel[grid](
        q, landmarks, landmarks if landmark_scales is None else landmark_scales,
        landmarks if k_buf is None else k_buf, cand_lo if cache_loc is None else cache_loc, req_to_token,
        req_pool_indices, cand_lo, cand_hi, out, req_to_token.stride(0), out.shape[1], q.stride(0),
        q if q_out is None else q_out, kin, vin, kin.stride(0), vin.stride(0), v_buf, b, H=h, G=hq // h, D=d,
        PS=page_size, BLOCK_P=STREAM_BLOCK_P, STAGES=ROW_STAGES, BMAX=triton.next_power_of_2(b),
        UPDATE=k_buf is not None, LM_BLOCK=triton.next_power_of_2(h * d), COPY_Q=q_out is not None,
        STORE_KV=store_kv is not None, SCALED=landmark_scales is not None, num_warps=STREAM_WARPS)
    return out
