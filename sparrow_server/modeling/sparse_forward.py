"""Teacher-forced forward of a transformers causal LM under a schedule's sparse semantics.

``teacher_forced_logits(model, ids, prompt_len, schedule)`` returns the logits the sparse
actor produces at every position of a known sequence, as decode would (prompt dense, each
generated position with its own page selection, ``dense_layers`` dense). With the ``dense``
schedule it is the model's ordinary causal forward. Used by dense verification (the dense
side), calibration, the fidelity study and DistillSparse training (differentiable).

Works with any transformers model whose attention goes through ``AttentionInterface``
(Llama, Qwen2/3, Mistral, ...): it registers an attention implementation named
``sparrow_teacher_forced`` and switches the model to it for the duration of the call.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from transformers import AttentionInterface

from ..sparsity.schedule import Schedule, budget_pages
from ..sparsity.teacher_forced import sparse_causal_attention

ATTN_NAME = "sparrow_teacher_forced"


@dataclass(frozen=True)
class _SparseContext:
    schedule: Schedule
    prompt_len: int
    budgets: Tensor  # [T] budget pages of the step that processes each position
    # sees (layer, q [T, Hq, D], k [T, Hkv, D]) of every sparse layer when set
    observe: Callable[[int, Tensor, Tensor], None] | None = None
    landmark_dtype: torch.dtype = torch.float32  # the landmarks' storage dtype (a server's SPARROW_LANDMARK_DTYPE)


_CONTEXT: contextvars.ContextVar[_SparseContext | None] = contextvars.ContextVar("sparrow_tf", default=None)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface function. query: [1, Hq, T, D], key/value: [1, Hkv, T, D] -> ([1, T, Hq, D], None)."""
    ctx = _CONTEXT.get()
    assert ctx is not None, "sparrow_teacher_forced attention used outside teacher_forced_logits"
    assert query.shape[0] == 1, "teacher-forced sparse forward takes one sequence at a time"
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)
    s = ctx.schedule
    dense = s.is_dense or module.layer_idx in s.dense_layers
    sparse_from = q.shape[0] if dense else ctx.prompt_len
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    if ctx.observe is not None and not dense:
        ctx.observe(module.layer_idx, q, k)
    out = sparse_causal_attention(
        q, k, v, ctx.budgets.to(q.device), sparse_from, s.page_size, s.sink_pages, s.recent_pages, scale,
        landmark_dtype=ctx.landmark_dtype,
    )
    return out[None], None


AttentionInterface.register(ATTN_NAME, _attention)


def position_budgets(schedule: Schedule, seq_len: int, prompt_len: int) -> Tensor:
    """Budget in pages of the decode step that processes each position: [T] int64."""
    return torch.tensor([budget_pages(schedule, t + 1, prompt_len) for t in range(seq_len)], dtype=torch.int64)


@contextlib.contextmanager
def attention_implementation(model, name: str):
    """Switch a transformers model to another registered attention implementation, then back."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def teacher_forced_logits(model, input_ids: Tensor, prompt_len: int, schedule: Schedule,
                          observe: Callable[[int, Tensor, Tensor], None] | None = None,
                          landmark_dtype: torch.dtype = torch.float32) -> Tensor:
    """Logits of the sparse actor at every position of one sequence.

    input_ids: [T] or [1, T], on any device (moved to the model's); prompt_len: tokens prefilled densely. Returns [T, V] float32
    (row t predicts token t + 1). Gradients flow if enabled by the caller. ``observe(layer, q, k)``,
    if given, sees each sparse layer's post-RoPE queries and keys (e.g. to recompute its selections).
    ``landmark_dtype``: the landmarks' storage dtype, as a server's ``SPARROW_LANDMARK_DTYPE``.
    """
    ids = _on_model_device(model, input_ids)
    ctx = _SparseContext(schedule, prompt_len, position_budgets(schedule, ids.shape[1], prompt_len), observe,
                         landmark_dtype)
    token = _CONTEXT.set(ctx)
    try:
        with attention_implementation(model, ATTN_NAME):
            out = model(input_ids=ids, use_cache=False)
    finally:
        _CONTEXT.reset(token)
    return out.logits[0].float()


def dense_logits(model, input_ids: Tensor) -> Tensor:
    """The model's ordinary causal forward (its own attention implementation). [T] -> [T, V] float32."""
    out = model(input_ids=_on_model_device(model, input_ids), use_cache=False)
    return out.logits[0].float()


def _on_model_device(model, input_ids: Tensor) -> Tensor:
    """[T] or [1, T] -> [1, T] on the device of the model's first parameter (its embedding): callers
    build ids on the CPU from token lists, and a CUDA model's embedding rejects CPU indices."""
    device = next(model.parameters()).device
    return input_ids.reshape(1, -1).to(device)
