"""The scoring of a sparse layer's rows past its fused launch by whole pages (``TopKVariant.scores_whole_pages``).

Past one wave of row programs (264 rows: batch 34 at 8 KV heads, rollout A's 64 requests) the split grid scores each
request with one program per tile of 32 pages, each KV head's 256 B of a page a load of its own, no pipeline; the
fused rows and call 47's streamed grid read one KV head's landmarks a program. All of them read at 2.8-3.1 TB/s. A
read-only pass over the same rows, every KV head of a page together (2 KB contiguous), 4 programs an SM, tiles of 8
pages through a pipelined loop, reads them at 3.6-4.0 TB/s (call 48's kernel bench, ``benchmarks/landmark_read.py``):
the scoring took 16-22% longer than that pass at Qwen3-1.7B's shapes, 74% at Qwen3-4B's 48 x 8K. Here the scoring
is that pass: program (b, p) takes the p-th of ``programs`` even shares of request b's candidates and scores every KV
head of each page it reads, the same scores written to the same places as the split grid's.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparrow_server.kernels.score_tiles import ROW_STAGES, clamp_scores, request_duties, tile_pages

PAGE_TILE = 8  # pages a tile: every KV head's landmark of 8 pages, 16 KB of bf16 (the read-only pass's tile)
PAGE_PROGRAMS_PER_SM = 4  # 3 stages of 16 KB of shared memory a program: four share an SM's 228 KB
PAGE_WARPS = 4
PAGE_PROGRAMS_INTERPRETED = 2  # programs a request on CPU tensors (the Triton interpreter): shares cut a row


@triton.jit
def _whole_page_score_kernel(q_ptr, lm_ptr, lms_ptr, k_ptr, loc_ptr, r2t_ptr, rpi_ptr, lo_ptr, hi_ptr, out_ptr,
                             r2t_stride, pcap, q_stride, qout_ptr, kin_ptr, vin_ptr, k_stride, v_stride, vbuf_ptr,
                             nprog, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                             BLOCK_P: tl.constexpr, STAGES: tl.constexpr, UPDATE: tl.constexpr,
                             LM_BLOCK: tl.constexpr, COPY_Q: tl.constexpr, STORE_KV: tl.constexpr,
                             SCALED: tl.constexpr):
    """Program (b, p) of (B, ``nprog``): first request b's duties, COPY_Q (its query heads into the contiguous
    ``qout_ptr``) in its first program, UPDATE (STORE_KV's step K/V, then the landmark of the page its slot completes,
    a recent page, never a candidate this step) in its last; then the p-th even share of its candidates."""
    b = tl.program_id(0)
    p = tl.program_id(1)
    q_row = q_ptr + b.to(tl.int64) * q_stride
    request_duties(q_row, qout_ptr, k_ptr, lm_ptr, lms_ptr, loc_ptr, kin_ptr, vin_ptr, k_stride, v_stride, vbuf_ptr, b,
                    p == 0, p == nprog - 1, H, G, D, PS, LM_BLOCK, COPY_Q, UPDATE, STORE_KV, SCALED)
    lo = tl.load(lo_ptr + b)
    n = tl.load(hi_ptr + b) - lo
    _score_share(q_row, lm_ptr, lms_ptr, r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride,
                 out_ptr + (b * H).to(tl.int64) * pcap, pcap, lo + (p * n) // nprog, lo + ((p + 1) * n) // nprog,
                 H, G, D, PS, BLOCK_P, STAGES, SCALED)


@triton.jit
def _score_share(q_row, lm_ptr, lms_ptr, row_r2t, out_b, pcap, first, end, H: tl.constexpr, G: tl.constexpr,
                 D: tl.constexpr, PS: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr,
                 SCALED: tl.constexpr):
    """Scores of candidate pages ``[first, end)`` of one request, every KV head (``out_b``: its head 0's row of
    ``pcap``), against each head's group mean query; the loop software-pipelined (STAGES), each tile ``BLOCK_P``
    pages' whole landmark rows."""
    h = tl.arange(0, H)
    d = tl.arange(0, D)
    qs = tl.zeros([H, D], dtype=tl.float32)
    for g in tl.static_range(G):
        qs += tl.load(q_row + (h[:, None] * G + g) * D + d[None, :]).to(tl.float32)
    qm = qs / G
    for start in tl.range(first, end, BLOCK_P, num_stages=STAGES):
        j = start + tl.arange(0, BLOCK_P)
        live = j < end
        page = tile_pages(row_r2t, j, end, PS).to(tl.int64)
        lm = tl.load(lm_ptr + page[:, None, None] * (H * D) + h[None, :, None] * D + d[None, None, :],
                     mask=live[:, None, None], other=0.0)
        sc = tl.sum(lm.to(tl.float32) * qm[None, :, :], axis=2)
        if SCALED:  # a power of two a page and head: the same score as the scaled landmark's, bit for bit
            sc = sc * tl.load(lms_ptr + page[:, None] * H + h[None, :], mask=live[:, None], other=1.0)
        tl.store(out_b + h[None, :].to(tl.int64) * pcap + j[:, None], clamp_scores(sc), mask=live[:, None])


def page_programs(batch: int, device: torch.device) -> int:
    """Programs a request: PAGE_PROGRAMS_PER_SM an SM over ``batch`` requests (static for a captured batch)."""
    if device.type != "cuda":
        return PAGE_PROGRAMS_INTERPRETED
    index = torch.cuda.current_device() if device.index is None else device.index
    return max(1, triton.cdiv(PAGE_PROGRAMS_PER_SM * _sm_count(index), batch))


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    """The card's SMs, read once: ``page_programs`` runs at every eager decode step of every sparse layer."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def whole_page_scores(q: Tensor, landmarks: Tensor, landmark_scales: Tensor | None, req_to_token: Tensor,
                      req_pool_indices: Tensor, cand_lo: Tensor, cand_hi: Tensor, page_size: int, out: Tensor,
                      k_buf: Tensor | None, cache_loc: Tensor | None, q_out: Tensor | None, store_kv: tuple | None,
                      programs: int | None = None) -> Tensor:
    """``sparse_decode.page_scores`` past the fused rows by whole pages (its arguments, checked there);
    ``programs`` (a request) overrides ``page_programs``."""
    b, hq, d = q.shape
    h = landmarks.shape[1]
    kin, vin, v_buf = store_kv or (cand_lo, cand_lo, cand_lo)
    nprog = programs or page_programs(b, q.device)
    _whole_page_score_kernel[(b, nprog)](
        q, landmarks, landmarks if landmark_scales is None else landmark_scales,
        landmarks if k_buf is None else k_buf, cand_lo if cache_loc is None else cache_loc, req_to_token,
        req_pool_indices, cand_lo, cand_hi, out, req_to_token.stride(0), out.shape[1], q.stride(0),
        q if q_out is None else q_out, kin, vin, kin.stride(0), vin.stride(0), v_buf, nprog, H=h, G=hq // h, D=d,
        PS=page_size, BLOCK_P=PAGE_TILE, STAGES=ROW_STAGES, UPDATE=k_buf is not None,
        LM_BLOCK=triton.next_power_of_2(h * d), COPY_Q=q_out is not None, STORE_KV=store_kv is not None,
        SCALED=landmark_scales is not None, num_warps=PAGE_WARPS)
    return out
