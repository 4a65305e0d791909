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

from .selection import (
    batched_page_landmarks,
    masked_decode_attention,
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
) -> Tensor:
    """Page selection of every position as a decode query.

    q: [T, Hq, D], k: [T, Hkv, D] post-RoPE, budget_pages: [T] (budget of the step that
    processes each position, i.e. at length ``t + 1``). Returns page ids [T, Hkv, K] (-1 padded).
    """
    t_len, hkv = k.shape[0], k.shape[1]
    pad = (-t_len) % page_size
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)) if pad else k
    landmarks = batched_page_landmarks(kp[None], page_size)  # [1, P, Hkv, D]
    scores = page_scores(query_summary(q, hkv), landmarks.expand(t_len, -1, -1, -1))
    lengths = torch.arange(1, t_len + 1, device=k.device)
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
) -> Tensor:
    """Causal attention where positions ``>= sparse_from`` attend only their selected pages.

    q: [T, Hq, D], k/v: [T, Hkv, D], budget_pages: [T]. Positions before ``sparse_from`` (the
    prompt, prefilled densely) attend causally and densely. Returns [T, Hq, D] in q's dtype.
    Memory is O(T^2 * Hkv); meant for training and tests, not serving.
    """
    t_len, hkv = k.shape[0], k.shape[1]
    lengths = torch.arange(1, t_len + 1, device=k.device)
    page_ids = causal_page_selection(q, k, budget_pages, page_size, sink_pages, recent_pages)
    mask = token_mask(page_ids, lengths, page_size, t_len)  # [T, Hkv, T], causal by construction
    causal = torch.arange(t_len, device=k.device)[None, :] < lengths[:, None]
    dense_rows = (torch.arange(t_len, device=k.device) < sparse_from)[:, None, None]
    mask = torch.where(dense_rows, causal[:, None, :].expand_as(mask), mask)
    kk = k[None].expand(t_len, -1, -1, -1)
    vv = v[None].expand(t_len, -1, -1, -1)
    return masked_decode_attention(q, kk, vv, mask, scale)
