"""The scheduler-process half of the plug-in: what runs next to SGLang's model runner, in every
TP rank's (spawned) scheduler process.

The ``sparrow`` attention backend (``backend``), the hooks that carry each request's schedule and
host-side KV rows to it (``hooks``, ``side_table``, ``state``), per-step planning (``planning``),
the landmark side cache kept consistent with SGLang's KV cache (``landmarks``) and the selection
debug recorder (``selection_debug``), the batch-invariant plan of deterministic inference
(``determinism``), and the sparse rows kept for exact acceptance on a subsample
of positions, scored in the dense verify prefill (``exact_rows``, ``exact_verify``, ``exact_hooks``); and the
backend's per-layer sparse decode outside SGLang, on a random pool, for the kernel benchmark and tests
(``standalone_layer``).
The only code of the project that imports FlashInfer or SGLang's scheduler, model-runner or layer
internals; it never imports ``frontend``.
"""
from __future__ import annotations

from typing import Any

from sparrow_server.sglang_plugin.config import BACKEND_NAME


def create_backend(model_runner):
    """Factory SGLang calls with its ``ModelRunner`` when ``--attention-backend sparrow``."""
    from sparrow_server.sglang_plugin.scheduler.backend import SparrowAttnBackend

    return SparrowAttnBackend(model_runner)


def install(hook_registry: Any, hook_type: Any) -> None:
    """Register the backend and the scheduler-side hooks (called by the plug-in's ``register()``)."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    from sparrow_server.sglang_plugin.scheduler import determinism, exact_hooks, hooks, landmarks

    register_attention_backend(BACKEND_NAME)(create_backend)
    hooks.install(hook_registry, hook_type)
    landmarks.install(hook_registry, hook_type)  # landmarks zeroed on cache flush and memory resume
    exact_hooks.install(hook_registry, hook_type)  # exact acceptance on kept positions (issue 25)
    determinism.install(hook_registry, hook_type)  # deterministic inference: flashinfer's prefill alignment


__all__ = ["create_backend", "install"]
