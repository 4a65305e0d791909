"""Engines by name. Each entry is a lazily imported ``"module:function"`` taking ``EngineOptions``
and returning a ``BuiltEngine``; the SGLang engine registers itself here by name."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from sparrow_server.engine.base import DEFAULT_WEIGHT_VERSION, Engine

ENGINE_FACTORIES: dict[str, str] = {
    "reference": "sparrow_server.engine.reference.factory:build_reference_engine",
    "sglang": "sparrow_server.sglang_plugin.frontend.engine:build_sglang_engine",
}


@dataclass(frozen=True)
class EngineOptions:
    model: str | None = None  # HF directory or .gguf; None = the embedded model
    device: str = "cpu"
    adapters: tuple[tuple[str, str], ...] = ()  # (name, path) loaded at start
    kv_pool_tokens: int | None = None  # None = the engine's default
    max_batch_size: int | None = None
    threads: int | None = None  # torch intra-op threads (CPU); None = torch's default
    weight_version: str = DEFAULT_WEIGHT_VERSION
    weight_group_timeout_s: float | None = None  # group init and each broadcast (reference engine); None = default


@dataclass(frozen=True)
class BuiltEngine:
    engine: Engine
    tokenizer: Any | None  # for text input; None = token ids only
    model_name: str


def default_engine_name() -> str:
    """``sglang`` on a CUDA machine where SGLang is installed, else ``reference``."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:
        cuda = False
    return "sglang" if cuda and importlib.util.find_spec("sglang") is not None else "reference"


def build_engine(name: str, options: EngineOptions) -> BuiltEngine:
    if name not in ENGINE_FACTORIES:
        raise ValueError(f"--engine {name!r}: unknown engine (known: {', '.join(sorted(ENGINE_FACTORIES))})")
    module_name, _, func = ENGINE_FACTORIES[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"--engine {name!r} is not available here: {exc}") from exc
    return getattr(module, func)(options)
