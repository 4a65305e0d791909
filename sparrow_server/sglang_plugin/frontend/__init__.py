"""The HTTP-process half of the plug-in: what runs where SGLang's tokenizer manager and HTTP
server run (``sparrow-server serve --engine sglang``).

The service's ``SGLangEngine`` (``engine``) over SGLang's tokenizer manager (``runtime``), the host
that runs SGLang's server with the Sparrow app mounted (``host``), dense verification by a prefill
(``verification``) and the checkpoint preflight of weight updates (``weight_preflight``). It never
imports ``scheduler``: what it shares with the scheduler processes is ``sglang_plugin.config``
and the core's ``sparsity.wire``.
"""
from __future__ import annotations

from typing import Any


def install(hook_registry: Any, hook_type: Any) -> None:
    """Register the HTTP-process hooks (called by the plug-in's ``register()``)."""
    from sparrow_server.sglang_plugin.frontend import weight_preflight

    weight_preflight.install(hook_registry, hook_type)


__all__ = ["install"]
