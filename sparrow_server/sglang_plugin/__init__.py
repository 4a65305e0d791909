"""SGLang plug-in: the ``sparrow`` attention backend (block-sparse FlashInfer decode) and the
``serve --engine sglang`` front end.

SGLang runs in several processes, and the package is split the same way:

- ``scheduler/``: code that runs in each (TP rank's) scheduler process, next to the model runner:
  the attention backend, its hooks, the schedule side table, step planning. The only code that
  imports FlashInfer or SGLang's scheduler / model-runner / layer internals.
- ``frontend/``: code that runs in the HTTP process (SGLang's tokenizer manager): the
  ``SGLangEngine`` adapter, its runtime, the host that mounts the Sparrow app, verification, and
  the weight-update preflight.
- here: what both need, ``register`` (the entry point) and ``config`` (the settings both read).

The two halves never import each other (``tests/core/test_layering.py``).

``register`` is the ``sglang.srt.plugins`` entry point; SGLang calls it in every process
(schedulers are spawned). It imports nothing heavy until SGLang builds the backend.
"""
from __future__ import annotations

from sparrow_server.sglang_plugin.config import BACKEND_NAME


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    from sparrow_server.sglang_plugin import frontend, scheduler

    scheduler.install(HookRegistry, HookType)  # the backend, the side-table hooks, the landmark flush
    frontend.install(HookRegistry, HookType)  # the checkpoint preflight on weight updates
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])


__all__ = ["register", "BACKEND_NAME"]
