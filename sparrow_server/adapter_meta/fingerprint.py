"""Base-model fingerprint: says whether an adapter was trained on the weights a server runs.

sha256 over (1) the model config without volatile keys (paths, versions, dtype, attention
implementation, private ``_`` keys), (2) every base parameter's name and shape, and (3) a
fixed sample of each parameter's values rounded to bfloat16. Independent of the dtype the
model was loaded in (fp32 and bf16 copies of the same checkpoint agree) and of a peft
wrapper (``base_model.model.`` prefixes, ``.base_layer`` and ``lora_`` parameters are
ignored), so a server can check an adapter against its own, possibly adapter-wrapped, model.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

FINGERPRINT_VERSION = 1
SAMPLES_PER_PARAMETER = 16
_VOLATILE_CONFIG_KEYS = frozenset({
    "_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "attn_implementation", "output_attentions", "output_hidden_states", "return_dict",
})
_PEFT_PREFIX = "base_model.model."


def model_fingerprint(model: Any) -> str:
    """``sparrow-fp1:<hex>`` for a transformers model (optionally wrapped by peft)."""
    h = hashlib.sha256()
    h.update(json.dumps(_stable_config(model.config.to_dict()), sort_keys=True, default=str).encode())
    for name, param in sorted(_base_parameters(model)):
        h.update(f"{name}:{tuple(param.shape)};".encode())
        h.update(_value_sample(param).numpy().tobytes())
    return f"sparrow-fp{FINGERPRINT_VERSION}:{h.hexdigest()}"


def _stable_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in _VOLATILE_CONFIG_KEYS and not k.startswith("_")}


def _base_parameters(model: Any) -> list[tuple[str, torch.Tensor]]:
    """(canonical name, tensor) of every non-LoRA parameter."""
    out = []
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        if name.startswith(_PEFT_PREFIX):
            name = name[len(_PEFT_PREFIX):]
        out.append((name.replace(".base_layer.", "."), param))
    return out


@torch.no_grad()
def _value_sample(param: torch.Tensor) -> torch.Tensor:
    """SAMPLES_PER_PARAMETER evenly spaced values, as bfloat16 bit patterns (int16)."""
    flat = param.detach().reshape(-1)
    # Integer arithmetic: float positions (linspace) round past the end for large tensors.
    idx = torch.arange(SAMPLES_PER_PARAMETER, device=flat.device) * (flat.numel() - 1) // (SAMPLES_PER_PARAMETER - 1)
    return flat[idx].to(torch.bfloat16).view(torch.int16).cpu()
