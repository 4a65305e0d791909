"""PyTorch references of the Triton kernels in ``sparse_decode`` (same inputs, same outputs).

They define the semantics the GPU kernels are tested against and run on CPU.
Shapes: ``B`` requests, ``H`` KV heads, ``G`` query heads per KV head, ``D`` head dim, ``ps`` page
size, ``N`` KV slots in the pool (a multiple of ``ps``), ``R`` KV rows, ``Pcap`` max pages.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


SCALED_LANDMARK_DTYPES = (torch.float8_e4m3fn,)  # stored with a power-of-two scale per (page, KV head)


def _biased_exponents(x: Tensor) -> Tensor:
    return (x.contiguous().view(torch.int32) >> 23) & 0xFF


def _pow2(biased: Tensor) -> Tensor:
    """2^(biased - 127) as float32, the exponent clamped to the normal range."""
    return (biased.clamp(1, 254) << 23).to(torch.int32).view(torch.float32)


def store_landmarks(means: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """fp32 landmarks [..., D] as the kernels store them in ``dtype``: cast; a float8 one first times the power of
    two that puts its largest element in [2^7, 2^8) (under e4m3's 448: three mantissa bits kept for keys of any
    magnitude), its inverse, the scale ([...] float32), beside it. Returns (stored, scales or None)."""
    if dtype not in SCALED_LANDMARK_DTYPES:
        return means.to(dtype), None
    e = _biased_exponents(means.abs().amax(dim=-1))  # the largest element's: in [2^(e-127), 2^(e-126))
    return (means * _pow2(261 - e)[..., None]).to(dtype), _pow2(e - 7)


def zero_landmarks(pages: int, heads: int, head_dim: int, dtype: torch.dtype,
                   device: torch.device | str = "cpu") -> tuple[Tensor, Tensor | None]:
    """Zeroed landmarks [pages, heads, head_dim] in ``dtype`` and, where that dtype is stored scaled, their zeroed
    scales [pages, heads] float32 (else None)."""
    landmarks = torch.zeros(pages, heads, head_dim, dtype=dtype, device=device)
    scaled = dtype in SCALED_LANDMARK_DTYPES
    return landmarks, (torch.zeros(pages, heads, dtype=torch.float32, device=device) if scaled else None)


def landmark_values(stored: Tensor, scales: Tensor | None) -> Tensor:
    """The fp32 landmarks the scoring sees: the stored ones, times their scales where scaled."""
    values = stored.to(torch.float32)
    return values if scales is None else values * scales[..., None]


def update_landmarks(k_buf: Tensor, locs: Tensor, landmarks: Tensor, page_size: int, only_full: bool,
                     landmark_scales: Tensor | None = None) -> None:
    """Recompute the landmark (mean key, fp32 accumulation) of the page holding each slot in ``locs``.

    k_buf: [N, H, D]; locs: [T] int slots; landmarks: [N // ps, H, D] (written in place), stored as
    ``store_landmarks``: float8 ones with their scales in ``landmark_scales`` ([N // ps, H] float32).
    ``only_full``: only pages whose last slot is in ``locs`` (prefill); otherwise every touched page.
    """
    assert (landmarks.dtype in SCALED_LANDMARK_DTYPES) == (landmark_scales is not None)
    locs = locs.to(torch.int64)
    if only_full:
        locs = locs[locs % page_size == page_size - 1]
    pages = torch.unique(locs // page_size)
    h, d = k_buf.shape[1:]
    means = k_buf.view(-1, page_size, h, d)[pages].to(torch.float32).mean(dim=1)
    landmarks[pages], scales = store_landmarks(means, landmarks.dtype)
    if scales is not None:
        landmark_scales[pages] = scales


def page_scores(
    q: Tensor, landmarks: Tensor, req_to_token: Tensor, req_pool_indices: Tensor,
    cand_lo: Tensor, cand_hi: Tensor, page_size: int, pcap: int, landmark_scales: Tensor | None = None,
) -> Tensor:
    """Scores of candidate pages against the mean query of each KV-head group.

    q: [B, H * G, D]; landmarks: [N // ps, H, D] (with their ``landmark_scales`` where float8);
    req_to_token: [R, max_ctx] int slots.
    Returns [B * H, Pcap] float32, ``-inf`` outside each request's ``[cand_lo, cand_hi)``.
    """
    b, hq, d = q.shape
    h = landmarks.shape[1]
    qs = q.to(torch.float32).view(b, h, hq // h, d).mean(dim=2)
    out = torch.full((b * h, pcap), float("-inf"), dtype=torch.float32)
    for i in range(b):
        lo, hi = int(cand_lo[i]), int(cand_hi[i])
        if hi <= lo:
            continue
        j = torch.arange(lo, hi)
        phys = req_to_token[int(req_pool_indices[i]), j * page_size].to(torch.int64) // page_size
        lm = landmark_values(landmarks[phys], None if landmark_scales is None else landmark_scales[phys])  # [P, H, D]
        out[i * h:(i + 1) * h, lo:hi] = torch.einsum("hd,phd->hp", qs[i], lm)
    return out


def write_indices(
    topk: Tensor, req_to_token: Tensor, req_pool_indices: Tensor, fields: dict[str, Tensor],
    row_indptr: Tensor, num_kv_heads: int, page_size: int, out: Tensor,
) -> None:
    """Write each (request, KV head) row's FlashInfer page ids into ``out`` at ``row_indptr``.

    The id of logical page ``j`` of request ``b`` for head ``h`` is ``slot(b, j * ps) * H + h``:
    page ``j``'s first slot, in the per-head strided view of the pool (see ``per_head_kv_view``).
    topk: [B * H, K] logical pages, best first; fields: ``REQUEST_FIELDS`` tensors [B].
    """
    h = num_kv_heads
    for r in range(topk.shape[0]):
        b = r // h
        cnt, s, k, n = (int(fields[f][b]) for f in ("count", "sink", "k", "n_pages"))
        start = int(row_indptr[r])
        for t in range(cnt):
            j = t if t < s else int(topk[r, t - s]) if t < s + k else n - (cnt - t)
            slot = int(req_to_token[int(req_pool_indices[b]), j * page_size])
            out[start + t] = slot * h + (r % h)


def per_head_kv_view(buf: Tensor, page_size: int) -> Tensor:
    """View a token-major pool [N, H, D] as FlashInfer NHD pages of one head each.

    Page id ``slot * H + h`` (``slot`` a page's first slot) covers tokens ``slot .. slot+ps-1`` of
    head ``h``: offset ``id * D + t * H * D`` -- a uniform stride, so no copy. Returns
    [(N - ps + 1) * H, ps, 1, D].
    """
    n, h, d = buf.shape
    return buf.as_strided(((n - page_size + 1) * h, page_size, 1, d), (d, h * d, d, 1))


def merge_parts(v: Tensor, s: Tensor, parts: int) -> Tensor:
    """``merge.merge_parts``'s reference: [rows * parts, G, D] outputs and base-2 log-sum-exps -> [rows, G, D]
    float32, each row's sub-rows weighted by 2 ** lse (the softmax over the union of their keys)."""
    g, d = v.shape[1:]
    v, s = v.float().view(-1, parts, g, d), s.float().view(-1, parts, g)
    w = torch.softmax(s * math.log(2.0), dim=1)  # 2 ** s / sum 2 ** s
    return (w[..., None] * v).sum(dim=1)
