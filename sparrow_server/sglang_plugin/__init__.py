"""SGLang plug-in: the ``sparrow`` attention backend (block-sparse FlashInfer decode).

``register`` is the ``sglang.srt.plugins`` entry point; SGLang calls it in every process
(schedulers are spawned). It imports nothing heavy until SGLang builds the backend.
"""
from __future__ import annotations

from sparrow_server.sglang_plugin.config import BACKEND_NAME


def create_backend(model_runner):
    """Factory SGLang calls with its ``ModelRunner`` when ``--attention-backend sparrow``."""
    from sparrow_server.sglang_plugin.backend import SparrowAttnBackend

    return SparrowAttnBackend(model_runner)


def register() -> None:
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    from sparrow_server.sglang_plugin import hooks, weight_sync

    register_attention_backend(BACKEND_NAME)(create_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    hooks.install(HookRegistry, HookType)
    weight_sync.install(HookRegistry, HookType)  # landmark flush + checkpoint preflight on weight updates


__all__ = ["register", "create_backend", "BACKEND_NAME"]
