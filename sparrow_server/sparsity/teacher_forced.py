"""Teacher-forced sparse attention: one forward over a whole sequence that reproduces, at every
generated position, the page selection that sparse decode makes at that step.

Why: training (DistillSparse) and tests need the sparse policy's logprobs for a known sequence
without decoding it token by token. Decode at the step that processes token ``t`` attends
``t + 1`` tokens, selects pages from the query of token ``t`` and the landmarks of the full
pages, and keeps sink + recent pages; prefill (positions before ``sparse_from``) is dense.
Only pages that are full at step ``t`` are ever scored (the partial page and the one before it
are always in the recent set), so landmarks computed once from the whole sequence equal the ones
decode saw.

Shapes: ``T`` positions, ``Hq``/``Hkv`` heads, ``D`` head dim, ``P = ceil(T / ps)`` pages.
"""
from __future__ import annotations

import torch
from torch import Tensor

from sparrow_server.kernels.reference import landmark_values, store_landmarks

from .selection import (
    batched_page_landmarks,
    num_pages,
    page_scores,
    query_summary,
    select_pages,
    token_mask,
)


def causal_page_selection(
    q: Tensor,
    k: Tensor,
    budget_pages: Tensor,
    page_size: int,
    sink_pages: int,
    recent_pages: int,
    query_offset: int = 0,
    landmark_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Page selection of each query position as a decode query.

    q: [C, Hq, D] queries of positions ``query_offset .. query_offset + C - 1``; k: [T, Hkv, D]
    post-RoPE keys of the whole sequence (only the first ``position + 1`` matter per query);
    budget_pages: [C], the budget of the step that processes each position (at length
    ``position + 1``); ``landmark_dtype``: the dtype the landmarks are stored in before scoring, as a
    server's ``SPARROW_LANDMARK_DTYPE`` (float32: the fp32 means themselves; float8: with a scale per page and
    head, ``kernels.reference.store_landmarks``). Returns page ids [C, Hkv, K]
    (-1 padded).
    """
    c_len, (t_len, hkv) = q.shape[0], k.shape[:2]
    pad = (-t_len) % page_size
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)) if pad else k
    means = batched_page_landmarks(kp[None], page_size)  # [1, P, Hkv, D] float32
    landmarks = landmark_values(*store_landmarks(means, landmark_dtype))  # as the kernels store and score them
    scores = page_scores(query_summary(q, hkv), landmarks.expand(c_len, -1, -1, -1))
    lengths = torch.arange(query_offset + 1, query_offset + c_len + 1, device=k.device)
    page_ids, _ = select_pages(scores, num_pages(lengths, page_size), budget_pages, sink_pages, recent_pages)
    return page_ids


def sparse_causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    budget_pages: Tensor,
    sparse_from: int,
    page_size: int,
    sink_pages: int,
    recent_pages: int,
    scale: float,
    chunk: int = 512,
    landmark_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Causal attention where positions ``>= sparse_from`` attend only their selected pages.

    q: [T, Hq, D], k/v: [T, Hkv, D], budget_pages: [T]. Positions before ``sparse_from`` (the
    prompt, prefilled densely) attend causally and densely. Returns [T, Hq, D] in q's dtype.
    Queries are processed ``chunk`` at a time, so memory is O(chunk * T * Hq).
    Differentiable in q, k, v (the selection itself is discrete and carries no gradient).
    ``landmark_dtype``: as ``causal_page_selection``'s.
    """
    return torch.cat([
        _attend_chunk(q[s : s + chunk], k, v, budget_pages[s : s + chunk], s, sparse_from,
                      page_size, sink_pages, recent_pages, scale, landmark_dtype)
        for s in range(0, q.shape[0], chunk)
    ])


def _attend_chunk(q, k, v, budget_pages, offset, sparse_from, page_size, sink_pages, recent_pages, scale,
                  landmark_dtype):
    c_len, t_len, hkv = q.shape[0], k.shape[0], k.shape[1]
    positions = torch.arange(offset, offset + c_len, device=k.device)
    with torch.no_grad():
        page_ids = causal_page_selection(q, k, budget_pages, page_size, sink_pages, recent_pages, offset,
                                         landmark_dtype)
    mask = token_mask(page_ids, positions + 1, page_size, t_len)  # [C, Hkv, T], causal by construction
    causal = torch.arange(t_len, device=k.device)[None, :] <= positions[:, None]
    dense_rows = (positions < sparse_from)[:, None, None]
    mask = torch.where(dense_rows, causal[:, None, :].expand_as(mask), mask)
    return _shared_kv_attention(q, k, v, mask, scale)


def _shared_kv_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Like ``masked_decode_attention`` but every query row shares one K/V sequence (no copies).

    q: [C, Hq, D], k/v: [T, Hkv, D], mask: [C, Hkv, T] -> [C, Hq, D].
    """
    c_len, hq, d = q.shape
    hkv = k.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qg = q.to(acc).view(c_len, hkv, hq // hkv, d)
    logits = torch.einsum("chgd,thd->chgt", qg, k.to(acc)) * scale
    probs = torch.softmax(logits.masked_fill(~mask[:, :, None, :], float("-inf")), dim=-1)
    return torch.einsum("chgt,thd->chgd", probs, v.to(acc)).reshape(c_len, hq, d).to(q.dtype)
