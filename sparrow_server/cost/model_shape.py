"""Model shapes for the cost model: what a dense transformer decoder reads and computes.

``ModelShape`` holds the numbers of an HF ``config.json`` that matter for decode cost; the
parameter count is computed from them (embeddings, attention projections, gated MLP, norms),
so it can be checked against a model built from the same config.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1}
DEFAULT_DTYPE_BYTES = 2  # bf16 weights and KV cache
# model_type values whose attention has per-head RMSNorm on q and k (q_norm/k_norm)
QK_NORM_MODEL_TYPES = ("qwen3",)
# model_type values whose q/k/v projections carry a bias even without "attention_bias" in the config
QKV_BIAS_MODEL_TYPES = ("qwen2",)


class ModelShapeError(ValueError):
    """A config that cannot be turned into a ``ModelShape``; names the field and value."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field = field_name
        self.value = value
        super().__init__(f"model config field {field_name!r} = {value!r}: {reason}")


@dataclass(frozen=True)
class ModelShape:
    """Decoder-only transformer with a gated (SwiGLU) MLP and grouped-query attention."""

    name: str
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    qk_norm: bool = False
    qkv_bias: bool = False
    weight_bytes: int = DEFAULT_DTYPE_BYTES
    kv_bytes: int = DEFAULT_DTYPE_BYTES

    def __post_init__(self) -> None:
        for field_name in ("hidden_size", "num_layers", "num_q_heads", "num_kv_heads", "head_dim",
                           "intermediate_size", "vocab_size", "weight_bytes", "kv_bytes"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelShapeError(field_name, value, "must be a positive integer")
        if self.num_q_heads % self.num_kv_heads:
            raise ModelShapeError("num_kv_heads", self.num_kv_heads, f"must divide num_q_heads {self.num_q_heads}")

    @property
    def gqa_ratio(self) -> int:
        """r = query heads per KV head (G)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def kv_dim(self) -> int:
        """D = K (or V) elements per token over all layers: layers * kv_heads * head_dim."""
        return self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token, K and V, all layers: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.kv_dim * self.kv_bytes

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer."""
        q_out, kv_out = self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attn = self.hidden_size * (q_out + 2 * kv_out) + q_out * self.hidden_size
        if self.qkv_bias:
            attn += q_out + 2 * kv_out
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        norms = 2 * self.hidden_size  # input and post-attention RMSNorm
        return attn + mlp + norms

    @property
    def params(self) -> int:
        """P: every parameter (input embedding, layers, final norm, untied LM head)."""
        head = 0 if self.tie_embeddings else self.embedding_params
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + head

    @property
    def matmul_params(self) -> int:
        """Parameters a decode step multiplies (and reads): P minus the input-embedding lookup
        table when it is not tied to the LM head."""
        return self.params if self.tie_embeddings else self.params - self.embedding_params

    def with_dtypes(self, weight_bytes: int | None = None, kv_bytes: int | None = None) -> "ModelShape":
        return replace(
            self,
            weight_bytes=self.weight_bytes if weight_bytes is None else weight_bytes,
            kv_bytes=self.kv_bytes if kv_bytes is None else kv_bytes,
        )


def model_shape_from_config(config: Mapping[str, Any], name: str = "") -> ModelShape:
    """Shape from an HF ``config.json`` mapping (Qwen3, Qwen2, Llama, Mistral-style dense decoders)."""
    if not isinstance(config, Mapping):
        raise ModelShapeError("<root>", type(config).__name__, "a config must be a JSON object")
    if config.get("num_experts") or config.get("num_local_experts"):
        raise ModelShapeError("num_experts", config.get("num_experts") or config.get("num_local_experts"),
                              "mixture-of-experts models are not modelled")

    def need(key: str) -> Any:
        if key not in config:
            raise ModelShapeError(key, None, "is required")
        return config[key]

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    model_type = str(config.get("model_type", ""))
    dtype = config.get("torch_dtype", config.get("dtype")) or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ModelShapeError("torch_dtype", dtype, f"unknown dtype (known: {sorted(DTYPE_BYTES)})")
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) else None)
    return ModelShape(
        name=name or str(config.get("_name_or_path") or model_type or "model"),
        hidden_size=hidden,
        num_layers=need("num_hidden_layers"),
        num_q_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        intermediate_size=need("intermediate_size"),
        vocab_size=need("vocab_size"),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qk_norm=model_type in QK_NORM_MODEL_TYPES,
        qkv_bias=bool(config.get("attention_bias", model_type in QKV_BIAS_MODEL_TYPES)),
        weight_bytes=DTYPE_BYTES[dtype],
    )


def load_model_shape(path: str | Path) -> ModelShape:
    """Shape from a ``config.json`` file (or a model directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelShapeError("<file>", str(path), f"cannot read a JSON config: {exc}") from exc
    return model_shape_from_config(config, name=path.parent.name or path.stem)


# Public Qwen3 shapes (their HF config.json values), bf16.
MODEL_PRESETS: dict[str, ModelShape] = {
    "qwen3-1.7b": ModelShape("qwen3-1.7b", hidden_size=2048, num_layers=28, num_q_heads=16, num_kv_heads=8,
                             head_dim=128, intermediate_size=6144, vocab_size=151936, tie_embeddings=True,
                             qk_norm=True),
    "qwen3-4b": ModelShape("qwen3-4b", hidden_size=2560, num_layers=36, num_q_heads=32, num_kv_heads=8,
                           head_dim=128, intermediate_size=9728, vocab_size=151936, tie_embeddings=True,
                           qk_norm=True),
    "qwen3-8b": ModelShape("qwen3-8b", hidden_size=4096, num_layers=36, num_q_heads=32, num_kv_heads=8,
                           head_dim=128, intermediate_size=12288, vocab_size=151936, tie_embeddings=False,
                           qk_norm=True),
    "qwen3-14b": ModelShape("qwen3-14b", hidden_size=5120, num_layers=40, num_q_heads=40, num_kv_heads=8,
                            head_dim=128, intermediate_size=17408, vocab_size=151936, tie_embeddings=False,
                            qk_norm=True),
}


def resolve_model(spec: str) -> ModelShape:
    """A preset name (``qwen3-1.7b`` ...) or a path to a ``config.json`` / model directory."""
    key = spec.strip().lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    if Path(spec).exists():
        return load_model_shape(spec)
    raise ModelShapeError("model", spec, f"neither a preset ({', '.join(MODEL_PRESETS)}) nor an existing config path")


__all__ = [
    "ModelShape", "ModelShapeError", "MODEL_PRESETS", "model_shape_from_config", "load_model_shape", "resolve_model",
]
