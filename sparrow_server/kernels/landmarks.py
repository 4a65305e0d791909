"""Triton kernels of the landmarks (each page's mean key, fp32 accumulation, as ``reference.update_landmarks``):
``update_landmarks`` after a prefill, and the pieces a decode launch folds in (``page_mean``, every head of a
page; ``row_update``, one KV head's, where the step's slot completes its page). Re-exported by ``sparse_decode``.
"""
from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def page_mean(k_ptr, lm_ptr, loc, mask, HD: tl.constexpr, PS: tl.constexpr, BLOCK: tl.constexpr):
    """Landmark (mean key, fp32 accumulation) of the page holding slot ``loc``."""
    page = loc // PS
    offs = tl.arange(0, BLOCK)
    m = mask & (offs < HD)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    base = k_ptr + page * PS * HD
    for t in tl.static_range(PS):
        acc += tl.load(base + t * HD + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(lm_ptr + page * HD + offs, (acc / PS).to(lm_ptr.dtype.element_ty), mask=m)


@triton.jit
def _landmark_kernel(k_ptr, loc_ptr, lm_ptr, HD: tl.constexpr, PS: tl.constexpr, ONLY_FULL: tl.constexpr,
                     BLOCK: tl.constexpr):
    loc = tl.load(loc_ptr + tl.program_id(0)).to(tl.int64)
    if ONLY_FULL:
        page_mean(k_ptr, lm_ptr, loc, (loc % PS) == PS - 1, HD, PS, BLOCK)
    else:
        page_mean(k_ptr, lm_ptr, loc, loc >= 0, HD, PS, BLOCK)


def update_landmarks(k_buf: Tensor, locs: Tensor, landmarks: Tensor, page_size: int, only_full: bool) -> None:
    """k_buf: [N, H, D] contiguous; locs: [T] slots; landmarks: [N // ps, H, D]."""
    t = locs.shape[0]
    if t == 0:
        return
    hd = k_buf.shape[1] * k_buf.shape[2]
    _landmark_kernel[(t,)](k_buf, locs, landmarks, HD=hd, PS=page_size, ONLY_FULL=only_full,
                           BLOCK=triton.next_power_of_2(hd), num_warps=4)


@triton.jit
def _head_page_mean(kbuf_ptr, lm_ptr, loc, h, H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr):
    """Head ``h``'s part of ``page_mean``: the same sums in the same order, so the same landmark."""
    page = loc // PS
    d = tl.arange(0, D)
    acc = tl.zeros([D], dtype=tl.float32)
    base = kbuf_ptr + page * PS * H * D + h * D
    for t in tl.static_range(PS):
        acc += tl.load(base + t * H * D + d).to(tl.float32)
    tl.store(lm_ptr + page * H * D + h * D + d, (acc / PS).to(lm_ptr.dtype.element_ty))


@triton.jit
def row_update(kbuf_ptr, lm_ptr, loc_ptr, b, h, H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr):
    """Head ``h`` of the landmark of the page request ``b``'s slot completes (the partial page is always a recent
    page, never scored)."""
    loc = tl.load(loc_ptr + b).to(tl.int64)
    if loc % PS == PS - 1:
        _head_page_mean(kbuf_ptr, lm_ptr, loc, h, H, D, PS)
