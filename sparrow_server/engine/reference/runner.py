"""Forward passes of the reference engine over an HF causal LM whose attention is the paged one.

``prefill`` runs one request's prompt; ``decode`` runs one token for each of ``B`` requests. Rows
may use different LoRA adapters (peft mixed-batch ``adapter_names``) and different schedules.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sparrow_server.engine.reference.attention import ForwardContext, forward_context, register_attention

PEFT_BASE = "__base__"  # peft's adapter name for "no adapter" in a mixed batch


class ModelRunner:
    def __init__(self, model: Any):
        layer_types = getattr(model.config, "layer_types", None) or ()
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(f"model layer_types {sorted(set(layer_types))}: the reference engine supports full-attention "
                             "layers only (no sliding window)")
        self.model = model
        name = register_attention()
        model.set_attn_implementation(name)
        self.device = next(model.parameters()).device

    @property
    def has_adapters(self) -> bool:
        return hasattr(self.model, "peft_config")

    def _adapter_kwargs(self, adapters: list[str | None]) -> dict[str, Any]:
        if not self.has_adapters:
            assert all(a is None for a in adapters), "adapter requested but none loaded"
            return {}
        return {"adapter_names": [a if a is not None else PEFT_BASE for a in adapters]}

    @torch.inference_mode()
    def prefill(self, input_ids: list[int], adapter: str | None, ctx: ForwardContext, keep: int = 1) -> Tensor:
        """Dense prefill of one prompt (its pages already allocated) -> the last ``keep`` positions'
        logits [keep, V] (the last row predicts the first new token)."""
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(len(input_ids), device=self.device)[None]
        with forward_context(ctx):
            out = self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=keep,
                             **self._adapter_kwargs([adapter]))
        return out.logits[0, -keep:]

    @torch.inference_mode()
    def decode(self, token_ids: list[int], adapters: list[str | None], ctx: ForwardContext) -> Tensor:
        """One decode step. token_ids: B tokens at positions ``ctx.lengths - 1`` -> logits [B, V]."""
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)[:, None]
        positions = (ctx.lengths - 1)[:, None].to(self.device)
        with forward_context(ctx):
            out = self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=1,
                             **self._adapter_kwargs(adapters))
        return out.logits[:, -1]
