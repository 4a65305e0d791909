"""Block (page) selection for sparse decode, and a reference sparse attention.

Granularity is per (request, KV head, layer), as in the paper: the G query heads that share
a KV head share one page list. Notation for shapes:

- ``B``: requests in the batch, ``Hq``/``Hkv``: query/KV heads, ``G = Hq // Hkv``,
- ``D``: head dim, ``ps``: page size, ``P``: pages (``ceil(L / ps)``), ``Lmax``: padded length.

A landmark is the mean of a full page's post-RoPE keys, accumulated in fp32. The score of a
page is ``dot(q_summary, landmark)`` where ``q_summary`` is the mean of the group's queries.
Sink pages (the first ``sink``) and the last ``recent`` pages (the partial page last) are always
kept; top-k over the rest fills the budget. A sequence with no more pages than its budget
attends every page (exactly dense). Selected page ids are returned in ascending position order,
so the (possibly partial) last page is last, as FlashInfer's ``last_page_len`` requires.
"""
from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def num_pages(lengths: Tensor, page_size: int) -> Tensor:
    """``ceil(lengths / page_size)``. lengths: [B] int -> [B] int64."""
    return (lengths.to(torch.int64) + page_size - 1) // page_size


def page_landmarks(keys: Tensor, page_size: int) -> Tensor:
    """Landmarks of the full pages of one sequence.

    keys: [L, Hkv, D] post-RoPE keys -> [L // ps, Hkv, D] float32 (mean over each page's tokens).
    """
    n_full = keys.shape[0] // page_size
    pages = keys[: n_full * page_size].to(torch.float32)
    return pages.view(n_full, page_size, *keys.shape[1:]).mean(dim=1)


def batched_page_landmarks(keys: Tensor, page_size: int) -> Tensor:
    """keys: [B, Lmax, Hkv, D] (Lmax a multiple of ps) -> [B, Lmax // ps, Hkv, D] float32.

    Pages past a sequence's end (or partial) get garbage landmarks; ``page_scores`` masks them.
    """
    b, lmax, hkv, d = keys.shape
    assert lmax % page_size == 0, "pad Lmax to a multiple of the page size"
    return keys.to(torch.float32).view(b, lmax // page_size, page_size, hkv, d).mean(dim=2)


def query_summary(q: Tensor, num_kv_heads: int) -> Tensor:
    """Mean of the G query heads that share each KV head. q: [B, Hq, D] -> [B, Hkv, D] float32."""
    b, hq, d = q.shape
    assert hq % num_kv_heads == 0, "query heads must be a multiple of KV heads"
    return q.to(torch.float32).view(b, num_kv_heads, hq // num_kv_heads, d).mean(dim=2)


def page_scores(q_summary: Tensor, landmarks: Tensor) -> Tensor:
    """Dot-product page scores. q_summary: [B, Hkv, D], landmarks: [B, P, Hkv, D] -> [B, Hkv, P] float32."""
    return torch.einsum("bhd,bphd->bhp", q_summary.to(torch.float32), landmarks.to(torch.float32))


def select_pages(
    scores: Tensor,
    n_pages: Tensor,
    budget_pages: Tensor,
    sink_pages: int,
    recent_pages: int,
) -> tuple[Tensor, Tensor]:
    """Choose the pages each (request, KV head) attends.

    scores: [B, Hkv, Pmax] (entries past a row's candidate range are ignored),
    n_pages: [B] pages in each sequence (the last may be partial),
    budget_pages: [B] budget in pages, reserved pages included.
    Returns ``(page_ids, counts)``: page_ids [B, Hkv, Kmax] int64 ascending per row, padded
    with -1 (``Kmax = min(max(budget), Pmax)``); counts [B] int64 pages kept per row.
    Dense rows (``n_pages <= budget``) keep every page.
    """
    b, hkv, pmax = scores.shape
    device = scores.device
    n_pages = n_pages.to(device=device, dtype=torch.int64)
    budget = budget_pages.to(device=device, dtype=torch.int64)
    counts = torch.minimum(n_pages, budget)
    sparse_rows = n_pages > budget
    if bool((sparse_rows & (budget < sink_pages + recent_pages)).any()):
        bad = int(budget[sparse_rows & (budget < sink_pages + recent_pages)][0])
        raise ValueError(
            f"budget_pages = {bad}: a sparse row needs at least sink_pages + recent_pages = "
            f"{sink_pages + recent_pages} pages (the partial last page must stay selected)"
        )
    kmax = int(min(int(budget.max()) if b else 0, pmax))
    pos = torch.arange(pmax, device=device)
    n = n_pages[:, None, None]
    dense = (n <= budget[:, None, None])
    in_seq = pos < n
    reserved = (pos < sink_pages) | (pos >= n - recent_pages)
    candidate = in_seq & ~reserved
    # Reserved pages rank above any candidate; pages past the end rank last.
    # A NaN score ranks as the lowest candidate (a plain descending sort would put it first,
    # above the reserved pages).
    big = torch.finfo(torch.float32).max
    finite = torch.nan_to_num(scores.to(torch.float32), nan=-big / 2).clamp(min=-big / 2, max=big / 2)
    key = torch.where(candidate, finite, torch.full_like(scores, NEG_INF, dtype=torch.float32))
    key = torch.where(in_seq & (reserved | dense), torch.full_like(key, big), key)
    # Stable tie-break by position: earlier page first among equal scores.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :kmax]
    keep = torch.arange(kmax, device=device) < counts[:, None, None]
    chosen = torch.where(keep, order, torch.full_like(order, pmax))
    chosen = torch.sort(chosen, dim=-1).values
    page_ids = torch.where(chosen < pmax, chosen, torch.full_like(chosen, -1))
    return page_ids, counts


def token_mask(page_ids: Tensor, lengths: Tensor, page_size: int, lmax: int) -> Tensor:
    """Boolean mask of attended tokens. page_ids: [B, Hkv, K] (-1 padded), lengths: [B] -> [B, Hkv, Lmax]."""
    b, hkv, _ = page_ids.shape
    pmax = (lmax + page_size - 1) // page_size
    page_hit = torch.zeros(b, hkv, pmax + 1, dtype=torch.bool, device=page_ids.device)
    idx = torch.where(page_ids >= 0, page_ids, torch.full_like(page_ids, pmax))
    page_hit.scatter_(2, idx, True)
    mask = page_hit[..., :pmax].repeat_interleave(page_size, dim=2)[..., :lmax]
    return mask & (torch.arange(lmax, device=page_ids.device) < lengths.to(page_ids.device)[:, None, None])


def masked_decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Softmax attention of one query token per request over the masked tokens.

    q: [B, Hq, D], k/v: [B, Lmax, Hkv, D], mask: [B, Hkv, Lmax] bool -> [B, Hq, D] in q's dtype.
    Computed in float32 (float64 if q is float64).
    """
    b, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qg = q.to(acc).view(b, hkv, g, d)
    logits = torch.einsum("bhgd,blhd->bhgl", qg, k.to(acc)) * scale
    logits = logits.masked_fill(~mask[:, :, None, :], NEG_INF)
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("bhgl,blhd->bhgd", probs, v.to(acc))
    return out.reshape(b, hq, d).to(q.dtype)


def sparse_decode_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lengths: Tensor,
    budget_pages: Tensor,
    page_size: int,
    sink_pages: int,
    recent_pages: int,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Reference block-sparse decode for one layer: select pages, then attend only to them.

    q: [B, Hq, D] (the token being decoded, its K/V already at position lengths-1),
    k/v: [B, Lmax, Hkv, D] post-RoPE, zero-padded past each length, lengths: [B],
    budget_pages: [B]. Returns ``(out [B, Hq, D], page_ids [B, Hkv, K])``.
    """
    b, lmax, hkv, d = k.shape
    pad = (-lmax) % page_size
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)) if pad else k
    landmarks = batched_page_landmarks(kp, page_size)
    scores = page_scores(query_summary(q, hkv), landmarks)
    page_ids, _ = select_pages(scores, num_pages(lengths, page_size), budget_pages, sink_pages, recent_pages)
    mask = token_mask(page_ids, lengths, page_size, lmax)
    return masked_decode_attention(q, k, v, mask, scale), page_ids


def dense_decode_attention(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, scale: float) -> Tensor:
    """Dense decode over each request's first ``lengths`` tokens (same shapes as the sparse one)."""
    b, lmax, hkv, _ = k.shape
    mask = (torch.arange(lmax, device=k.device) < lengths.to(k.device)[:, None])[:, None, :].expand(b, hkv, lmax)
    return masked_decode_attention(q, k, v, mask, scale)
