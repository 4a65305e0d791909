"""Refuse, before SGLang touches a weight, a ``/update_weights_from_disk`` checkpoint that does not fit.

An AROUND hook on ``TokenizerManager.update_weights_from_disk`` (the HTTP process) runs the
checkpoint preflight (config.json + safetensors headers) against the serving checkpoint first:
SGLang 0.5.17 loads into the live parameters and cannot roll back from a checkpoint of another
shape, so such a request is answered ``success: false`` (HTTP 400) before SGLang touches a weight.
The scheduler-process side of a weight update (the landmark flush) is ``scheduler.landmarks``.
No SGLang import here (tested on CPU with stand-ins).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sparrow_server.engine.checkpoint_preflight import preflight
from sparrow_server.engine.weights import WeightLoadError

logger = logging.getLogger(__name__)

PREFLIGHT_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_weights_from_disk"


async def around_update_weights_from_disk(original: Any, manager: Any, obj: Any, *args: Any, **kwargs: Any):
    """AROUND hook of ``TokenizerManager.update_weights_from_disk``: refuse a checkpoint that does
    not fit the served one in place with SGLang's failure tuple ``(False, message, 0)``. Skipped
    (with a warning) when the serving model is not a local directory (a hub id)."""
    serving = getattr(manager, "model_path", None)
    if serving and Path(serving).is_dir():
        try:
            preflight(serving, obj.model_path)
        except WeightLoadError as exc:
            logger.warning("sparrow: refused weight update: %s", exc)
            return False, str(exc), 0
    else:
        logger.warning("sparrow: serving model %r is not a local directory; weight update not preflighted", serving)
    return await original(manager, obj, *args, **kwargs)


def install(hook_registry: Any, hook_type: Any) -> None:
    """Register the preflight hook (``frontend.install``)."""
    hook_registry.register(PREFLIGHT_TARGET, around_update_weights_from_disk, hook_type.AROUND)


__all__ = ["install", "around_update_weights_from_disk", "PREFLIGHT_TARGET"]
