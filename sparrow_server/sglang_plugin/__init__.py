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
(schedulers are spawned). It imports nothing heavy until SGLang builds the backend. It adds ``sparrow``
to SGLang's attention-backend choices and to its deterministic ones (``--enable-deterministic-inference``
refuses any other backend at parse time; the backend then plans batch-invariantly,
``scheduler/determinism.py``), not to the radix-cache-compatible deterministic ones: as for
``flashinfer``, SGLang turns the radix cache off in that mode.
"""
from __future__ import annotations

from sparrow_server.sglang_plugin.config import BACKEND_NAME


def register() -> None:
    from sglang.srt import server_args
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sparrow_server.sglang_plugin import frontend, scheduler

    scheduler.install(HookRegistry, HookType)  # the backend, the side-table hooks, the landmark flush
    frontend.install(HookRegistry, HookType)  # the checkpoint preflight on weight updates
    add_choice(server_args, "ATTENTION_BACKEND_CHOICES", "add_attention_backend_choices")
    add_choice(server_args, "DETERMINISTIC_ATTENTION_BACKEND_CHOICES", "add_deterministic_attention_backend_choices")


def add_choice(server_args, choices: str, add: str) -> None:
    """Add the backend to one of SGLang's choice lists through its plug-in helper, once per process."""
    if BACKEND_NAME not in getattr(server_args, choices):
        getattr(server_args, add)([BACKEND_NAME])


__all__ = ["register", "BACKEND_NAME"]
