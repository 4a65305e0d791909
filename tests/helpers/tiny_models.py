"""Tiny random Llama / Qwen3 models for fast tests, plus teacher-forced reference forwards.

``teacher_forced_logprobs`` recomputes, with the plain HF model, the logprobs of a completion;
with ``selections`` (what the engine recorded per generated token) each sparse layer's KV
heads attend only the recorded pages, through a masked eager attention registered here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from sparrow_server.models import (  # the product's tiny models, under the names the tests use
    TINY_CONTEXT, TINY_HEAD_DIM, TINY_KV_HEADS, TINY_LAYERS, TINY_VOCAB, save_tiny_model, tiny_config, tiny_model,
)

PAGE_SIZE = 16


def load_plain(directory: str | Path, attn: str = "eager"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32, attn_implementation=attn).eval()


_MASKS: dict[int, torch.Tensor] = {}
MASKED_ATTENTION = "sparrow_test_masked"


def _masked_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention with a per-layer [Hkv, L, L] boolean mask from ``_MASKS``. q: [1, Hq, L, D]."""
    mask = _MASKS[module.layer_idx]
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1).double()
    v = value.repeat_interleave(groups, dim=1).double()
    logits = torch.einsum("bhqd,bhkd->bhqk", query.double(), k) * scaling
    logits = logits.masked_fill(~mask.repeat_interleave(groups, dim=0)[None], float("-inf"))
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(logits, dim=-1), v).to(query.dtype)
    return out.transpose(1, 2), None


def _register_masked() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(MASKED_ATTENTION, _masked_attention)
    AttentionMaskInterface.register(MASKED_ATTENTION, lambda *a, **k: None)


def selection_masks(prompt_len: int, total: int, selections: Sequence[Any], num_layers: int, kv_heads: int) -> dict[int, torch.Tensor]:
    """Per-layer [Hkv, L, L] masks: causal everywhere; the query at position ``prompt_len + i - 1``
    (which produced generated token ``i``) sees only its recorded pages at sparse layers."""
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    masks = {layer: causal[None].repeat(kv_heads, 1, 1) for layer in range(num_layers)}
    for i, sel in enumerate(selections):
        if sel is None:  # produced by the dense prefill
            continue
        q = prompt_len + i - 1
        for layer, heads in enumerate(sel):
            if heads is None:
                continue
            for h, pages in enumerate(heads):
                row = torch.zeros(total, dtype=torch.bool)
                for p in pages:
                    row[p * PAGE_SIZE : (p + 1) * PAGE_SIZE] = True
                masks[layer][h, q] = row & causal[q]
    return masks


@torch.no_grad()
def teacher_forced_logprobs(model, prompt: Sequence[int], completion: Sequence[int], temperature: float = 1.0,
                            selections: Sequence[Any] | None = None) -> list[float]:
    """Logprobs of ``completion`` given ``prompt`` (one HF forward, float32 logits, log_softmax(logits / T))."""
    ids = torch.tensor([list(prompt) + list(completion)])
    if selections is not None:
        _register_masked()
        cfg = model.config
        _MASKS.clear()
        _MASKS.update(selection_masks(len(prompt), ids.shape[1], selections, cfg.num_hidden_layers, cfg.num_key_value_heads))
        previous = model.config._attn_implementation
        model.set_attn_implementation(MASKED_ATTENTION)
        try:
            logits = model(input_ids=ids).logits[0]
        finally:
            model.set_attn_implementation(previous)
    else:
        logits = model(input_ids=ids).logits[0]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    n = len(prompt)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(completion)]


__all__ = ["TINY_CONTEXT", "TINY_HEAD_DIM", "TINY_KV_HEADS", "TINY_LAYERS", "TINY_VOCAB", "PAGE_SIZE", "MASKED_ATTENTION",
           "save_tiny_model", "tiny_config", "tiny_model", "load_plain", "selection_masks", "teacher_forced_logprobs"]
