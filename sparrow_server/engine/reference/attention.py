"""Paged attention for the reference engine, plugged into transformers' ``AttentionInterface``
so the HF model runs its own layers (projections, q/k norms, RoPE, MLP, LoRA wrappers) and only
attention is ours. The batch layout of the current forward lives in a ``ForwardContext`` set
around the model call (a context variable, so no HF signature has to change).

- prefill (one request, positions ``0..L-1``): writes K/V into the request's pages, fills the
  landmarks of its full pages, attends densely (causal SDPA);
- decode (``B`` requests, one token each): writes the token's K/V, updates the landmark of a page
  that just filled, then per (request, KV head, layer) scores pages and keeps the top ones under the
  request's budget with the core ``select_pages`` (dense layers and the ``dense`` schedule attend
  every page), and attends with the core ``masked_decode_attention``.

Shapes: q ``[B, Hq, L, D]``, k/v ``[B, Hkv, L, D]`` as HF passes them (post-RoPE).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from sparrow_server.engine.reference.kv_cache import PagedKVCache, PageTable, padded_page_index
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.sparsity.selection import (
    masked_decode_attention,
    num_pages,
    page_scores,
    query_summary,
    select_pages,
    token_mask,
)

ATTENTION_NAME = "sparrow_paged"


@dataclass
class ForwardContext:
    """Layout of one forward. ``lengths[b]``: tokens in row b's cache after this forward."""

    cache: PagedKVCache
    tables: list[PageTable]
    lengths: Tensor  # [B] int64
    is_prefill: bool
    schedules: list[Schedule] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)
    # Per row, the pages a sparse layer attends (``schedule.attended_pages``, evaluated per request
    # by the engine before the forward, so a schedule that fails there never reaches the batch).
    budget_pages: list[int] = field(default_factory=list)
    record: list[bool] = field(default_factory=list)
    # Outputs: per row, per layer, the attended pages per KV head (None = dense layer).
    selections: list[dict[int, tuple[tuple[int, ...], ...] | None]] = field(default_factory=list)
    _page_index: Tensor | None = None
    _sparse_budget: Tensor | None = None
    _slots: tuple[Tensor, Tensor] | None = None

    def page_index(self) -> Tensor:
        if self._page_index is None:
            self._page_index = padded_page_index(self.tables, self.lengths.device)
        return self._page_index

    def decode_slots(self) -> tuple[Tensor, Tensor]:
        """(page id, offset) of each row's new token, [B] each (the same at every layer)."""
        if self._slots is None:
            ps = self.cache.page_size
            positions = (self.lengths - 1).tolist()
            pages = [t.pages[p // ps] for t, p in zip(self.tables, positions)]
            device = self.lengths.device
            self._slots = (torch.tensor(pages, dtype=torch.long, device=device),
                           torch.tensor([p % ps for p in positions], dtype=torch.long, device=device))
        return self._slots

    def sparse_budget(self) -> Tensor:
        """[B] budget in pages of each row at a sparse layer."""
        if self._sparse_budget is None:
            self._sparse_budget = torch.tensor(self.budget_pages, dtype=torch.long, device=self.lengths.device)
        return self._sparse_budget


_CONTEXT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("sparrow_forward", default=None)


@contextlib.contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    token = _CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.reset(token)


def paged_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling: float | None = None,
                    dropout: float = 0.0, **kwargs) -> tuple[Tensor, None]:
    """AttentionInterface entry point -> (out [B, L, Hq, D], None)."""
    ctx = _CONTEXT.get()
    if ctx is None:
        raise RuntimeError(f"attention {ATTENTION_NAME!r} called outside a reference-engine forward")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if ctx.is_prefill:
        return _prefill(ctx, module.layer_idx, query, key, value, scale), None
    return _decode(ctx, module.layer_idx, query, key, value, scale), None


def _prefill(ctx: ForwardContext, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    assert q.shape[0] == 1, "prefill runs one request at a time"
    cache, table = ctx.cache, ctx.tables[0]
    length = k.shape[2]
    positions = torch.arange(length, device=k.device)
    pages, offsets = cache.slots(table, positions)
    cache.write(layer, pages, offsets, k[0].transpose(0, 1), v[0].transpose(0, 1))
    full = torch.tensor(table.pages[: length // cache.page_size], dtype=torch.long, device=k.device)
    cache.update_landmarks(layer, full)
    groups = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), is_causal=True, scale=scale
    )
    return out.transpose(1, 2)


def _decode(ctx: ForwardContext, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    cache = ctx.cache
    b, hkv = k.shape[0], k.shape[1]
    pages, offsets = ctx.decode_slots()
    cache.write(layer, pages, offsets, k[:, :, 0], v[:, :, 0])
    cache.update_landmarks(layer, pages[ctx.lengths % cache.page_size == 0])
    page_index = ctx.page_index()
    keys, values, landmarks = cache.gather(layer, page_index)
    mask = _decode_mask(ctx, layer, q[:, :, 0], landmarks, keys.shape[1], hkv)
    out = masked_decode_attention(q[:, :, 0], keys, values, mask, scale)
    return out[:, None]


def _decode_mask(ctx: ForwardContext, layer: int, q: Tensor, landmarks: Tensor, lmax: int, hkv: int) -> Tensor:
    """[B, Hkv, Lmax] attended tokens of each row at ``layer``; records selections when asked."""
    ps = ctx.cache.page_size
    n_pages = num_pages(ctx.lengths, ps)
    dense_layer = torch.tensor([s.is_dense or layer in s.dense_layers for s in ctx.schedules], device=q.device)
    budget = torch.where(dense_layer, n_pages, ctx.sparse_budget())
    positions = torch.arange(lmax, device=q.device)
    mask = (positions < ctx.lengths[:, None])[:, None, :].expand(-1, hkv, -1).clone()
    if bool(dense_layer.all()):
        _record(ctx, layer, dense_layer, None, None)
        return mask
    scores = page_scores(query_summary(q, hkv), landmarks)
    for (sink, recent), rows in _group_by_reserved(ctx.schedules, dense_layer).items():
        idx = torch.tensor(rows, dtype=torch.long, device=q.device)
        page_ids, counts = select_pages(scores[idx], n_pages[idx], budget[idx], sink, recent)
        mask[idx] = token_mask(page_ids, ctx.lengths[idx], ps, lmax)
        _record(ctx, layer, dense_layer, rows, (page_ids, counts))
    return mask


def _group_by_reserved(schedules: list[Schedule], dense_layer: Tensor) -> dict[tuple[int, int], list[int]]:
    """Sparse rows grouped by (sink_pages, recent_pages), which ``select_pages`` takes as scalars."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(schedules):
        if not bool(dense_layer[i]):
            groups.setdefault((s.sink_pages, s.recent_pages), []).append(i)
    return groups


def _record(ctx: ForwardContext, layer: int, dense_layer: Tensor, rows, selection) -> None:
    for i, wanted in enumerate(ctx.record):
        if wanted and bool(dense_layer[i]):
            ctx.selections[i][layer] = None
    if rows is None:
        return
    page_ids, counts = selection
    for j, i in enumerate(rows):
        if ctx.record[i]:
            n = int(counts[j])
            ctx.selections[i][layer] = tuple(tuple(row[:n]) for row in page_ids[j].tolist())


def _no_mask(*args, **kwargs) -> None:
    """Mask builder for our attention: the layout comes from the ForwardContext instead."""
    return None


def register_attention() -> str:
    """Register the paged attention with transformers (idempotent); returns its name."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
