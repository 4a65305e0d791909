"""Triton kernels of the landmarks (each page's mean key, fp32 accumulation, as ``reference.update_landmarks``):
``update_landmarks`` after a prefill, and the pieces a decode launch folds in (``page_mean``, every head of a
page; ``row_update``, one KV head's, where the step's slot completes its page). Re-exported by ``sparse_decode``.

SCALED (float8 landmarks, ``reference.store_landmarks``): each (page, KV head) landmark is stored times a power of
two that puts its largest element in [2^7, 2^8), that power's inverse (the scale) in ``lms_ptr`` ([pages, H] fp32),
so keys of any magnitude keep float8's three mantissa bits (unscaled, a model's keys of ~1e-3 round to zero).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from sparrow_server.kernels.reference import SCALED_LANDMARK_DTYPES

# A landmark whose largest element has the biased float32 exponent e has the scale 2^s, s = e - 127 - 7
# (reference.store_landmarks): the scale's biased exponent is e - 7, its inverse's 127 - s = 261 - e.
_SCALE_EXP = tl.constexpr(7)
_INV_EXP = tl.constexpr(261)


@triton.jit
def _stored(mean, lms_ptr, at, dtype, SCALED: tl.constexpr):
    """A [D] fp32 landmark as stored: cast to ``dtype``, or (SCALED) first times 2^-s that puts its largest element
    in [2^7, 2^8), 2^s stored at ``lms_ptr + at`` (exponents clamped to the normal range: all-zero landmarks)."""
    if SCALED:
        e = (tl.max(tl.abs(mean), axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF
        scale = (tl.minimum(tl.maximum(e - _SCALE_EXP, 1), 254) << 23).to(tl.float32, bitcast=True)
        tl.store(lms_ptr + at, scale)
        mean = mean * (tl.minimum(tl.maximum(-(e - _INV_EXP), 1), 254) << 23).to(tl.float32, bitcast=True)
    return mean.to(dtype)


@triton.jit
def page_mean(k_ptr, lm_ptr, lms_ptr, loc, mask, H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
              BLOCK: tl.constexpr, SCALED: tl.constexpr):
    """Landmark (mean key, fp32 accumulation) of the page holding slot ``loc`` where ``mask``; SCALED: a head at a
    time (each its own scale)."""
    if SCALED:
        if mask:
            for h in tl.static_range(H):
                _head_page_mean(k_ptr, lm_ptr, lms_ptr, loc, h, H, D, PS, SCALED)
    else:
        HD: tl.constexpr = H * D
        page = loc // PS
        offs = tl.arange(0, BLOCK)
        m = mask & (offs < HD)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        base = k_ptr + page * PS * HD
        for t in tl.static_range(PS):
            acc += tl.load(base + t * HD + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(lm_ptr + page * HD + offs, (acc / PS).to(lm_ptr.dtype.element_ty), mask=m)


@triton.jit
def _landmark_kernel(k_ptr, loc_ptr, lm_ptr, lms_ptr, H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                     ONLY_FULL: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr):
    loc = tl.load(loc_ptr + tl.program_id(0)).to(tl.int64)
    if ONLY_FULL:
        page_mean(k_ptr, lm_ptr, lms_ptr, loc, (loc % PS) == PS - 1, H, D, PS, BLOCK, SCALED)
    else:
        page_mean(k_ptr, lm_ptr, lms_ptr, loc, loc >= 0, H, D, PS, BLOCK, SCALED)


def update_landmarks(k_buf: Tensor, locs: Tensor, landmarks: Tensor, page_size: int, only_full: bool,
                     landmark_scales: Tensor | None = None) -> None:
    """k_buf: [N, H, D] contiguous; locs: [T] slots; landmarks: [N // ps, H, D]; ``landmark_scales`` ([N // ps, H]
    float32) with float8 landmarks, their scales (``reference.store_landmarks``)."""
    t = locs.shape[0]
    if t == 0:
        return
    scaled = check_landmark_scales(landmarks, landmark_scales)
    h, d = k_buf.shape[1], k_buf.shape[2]
    _landmark_kernel[(t,)](k_buf, locs, landmarks, landmark_scales if scaled else landmarks, H=h, D=d, PS=page_size,
                           ONLY_FULL=only_full, BLOCK=triton.next_power_of_2(h * d), SCALED=scaled, num_warps=4)


def check_landmark_scales(landmarks: Tensor, landmark_scales: Tensor | None) -> bool:
    """Whether the landmarks are scaled: float8 ones always are, with [pages, H] float32 scales beside them."""
    scaled = landmarks.dtype in SCALED_LANDMARK_DTYPES
    assert scaled == (landmark_scales is not None), "float8 landmarks, and only they, take landmark_scales"
    if scaled:
        assert landmark_scales.dtype == torch.float32 and landmark_scales.shape == landmarks.shape[:2]
        assert landmark_scales.is_contiguous()
    return scaled


@triton.jit
def _head_page_mean(kbuf_ptr, lm_ptr, lms_ptr, loc, h, H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
                    SCALED: tl.constexpr):
    """Head ``h``'s part of ``page_mean``: the same sums in the same order, so the same landmark."""
    page = loc // PS
    d = tl.arange(0, D)
    acc = tl.zeros([D], dtype=tl.float32)
    base = kbuf_ptr + page * PS * H * D + h * D
    for t in tl.static_range(PS):
        acc += tl.load(base + t * H * D + d).to(tl.float32)
    tl.store(lm_ptr + page * H * D + h * D + d, _stored(acc / PS, lms_ptr, page * H + h, lm_ptr.dtype.element_ty,
                                                        SCALED))


@triton.jit
def row_update(kbuf_ptr, lm_ptr, lms_ptr, loc_ptr, b, h, H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
               SCALED: tl.constexpr):
    """Head ``h`` of the landmark of the page request ``b``'s slot completes (the partial page is always a recent
    page, never scored)."""
    loc = tl.load(loc_ptr + b).to(tl.int64)
    if loc % PS == PS - 1:
        _head_page_mean(kbuf_ptr, lm_ptr, lms_ptr, loc, h, H, D, PS, SCALED)


@triton.jit
def page_scales(lms_ptr, page, cand, h, H: tl.constexpr, SCALED: tl.constexpr):
    """[pages] scales of head ``h`` of physical ``page``s (SCALED; 1 past ``cand``), else 1."""
    if SCALED:
        s = tl.load(lms_ptr + page.to(tl.int64) * H + h, mask=cand, other=1.0)
    else:
        s = 1.0
    return s
