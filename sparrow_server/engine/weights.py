"""Policy weight updates between RL steps: the engine-agnostic protocol.

An engine that can take new weights without restarting returns a ``WeightSync`` from
``engine.weights()``. The HTTP routes (``sparrow_server.server.weights``) speak SGLang's shapes and
call it; the reference engine implements it in ``engine.reference.weight_update``, the SGLang
engine forwards to SGLang's own tokenizer manager.

The contract every implementation keeps (docs/weight-updates.md):
- an update loads the new weights off to the side first; a bad path or a different architecture
  raises ``WeightLoadError`` and the old weights keep serving;
- then it waits for the requests already generating (or aborts them when
  ``abort_all_requests``), swaps the weights in, flushes the KV cache and the landmark cache,
  sets ``weight_version`` and lets generation resume;
- every chunk's ``weight_version`` names the weights that produced all the tokens of its request.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sparrow_server.engine.errors import EngineError, InvalidRequestError

DEFAULT_WEIGHT_VERSION = "default"  # SGLang's initial weight_version

PAUSE_ABORT = "abort"        # abort every live request; hold new ones until continue
PAUSE_RETRACT = "retract"    # free the running requests' KV and requeue them; hold new ones
PAUSE_IN_PLACE = "in_place"  # freeze the batch loop; requests keep their KV and resume on continue
PAUSE_MODES = (PAUSE_ABORT, PAUSE_RETRACT, PAUSE_IN_PLACE)
DEFAULT_PAUSE_MODE = PAUSE_ABORT  # SGLang's default
LOAD_FORMATS = (None, "auto", "safetensors", "pt")  # what the reference engine reads (HF checkpoints)


class WeightLoadError(EngineError, ValueError):
    """The new weights cannot be used (HTTP 400); the old ones keep serving.
    ``field``/``value`` name the offending request field, ``reason`` says why."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field = field_name
        self.value = value
        self.reason = reason
        super().__init__(f"{field_name} = {value!r}: {reason}")


class WeightSyncConflictError(EngineError):
    """The engine's state forbids the operation right now (HTTP 409); nothing changed."""


@dataclass(frozen=True)
class WeightUpdate:
    """``POST /update_weights_from_disk``. ``weight_version`` None = ``next_weight_version``.

    ``keep_pause``: stay paused after the update (the trainer calls ``continue_generation``).
    """

    model_path: str
    load_format: str | None = None
    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    keep_pause: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, str) or not self.model_path:
            raise InvalidRequestError("model_path", self.model_path, "must be a non-empty path")
        if self.weight_version is not None and (not isinstance(self.weight_version, str) or not self.weight_version):
            raise InvalidRequestError("weight_version", self.weight_version, "must be a non-empty string")


@dataclass(frozen=True)
class WeightUpdateResult:
    """What an update did. Times in seconds: loading (old weights still serving), waiting for
    in-flight requests, and the swap itself (generation stopped)."""

    weight_version: str
    previous_weight_version: str
    num_aborted_requests: int = 0
    num_paused_requests: int = 0
    load_s: float = 0.0
    drain_s: float = 0.0
    swap_s: float = 0.0

    @property
    def message(self) -> str:
        return (f"Succeeded to update model weights: {self.previous_weight_version} -> {self.weight_version} "
                f"(load {self.load_s:.2f} s, drain {self.drain_s:.2f} s, swap {self.swap_s:.3f} s).")


@dataclass(frozen=True)
class PauseState:
    """``mode`` None = generating. ``running``: requests holding KV; ``waiting``: queued or retracted."""

    mode: str | None
    running: int
    waiting: int


@runtime_checkable
class WeightSync(Protocol):
    """What the weight routes call; safe to call from the service's event loop."""

    @property
    def weight_version(self) -> str: ...

    async def update_weights_from_disk(self, update: WeightUpdate) -> WeightUpdateResult: ...

    async def pause_generation(self, mode: str = DEFAULT_PAUSE_MODE) -> PauseState: ...

    async def continue_generation(self) -> PauseState: ...

    def pause_state(self) -> PauseState: ...


def check_pause_mode(mode: Any) -> str:
    if mode not in PAUSE_MODES:
        raise InvalidRequestError("mode", mode, f"must be one of {', '.join(PAUSE_MODES)}")
    return mode


def check_load_format(load_format: Any) -> str | None:
    if load_format not in LOAD_FORMATS:
        known = ", ".join(str(f) for f in LOAD_FORMATS if f is not None)
        raise WeightLoadError("load_format", load_format, f"this engine reads HF checkpoints: {known} (or omit it)")
    return load_format


_TRAILING_INT = re.compile(r"^(.*?)(\d+)$")


def next_weight_version(current: str) -> str:
    """The version an update without ``weight_version`` gets: the trailing integer incremented
    (``"7"`` -> ``"8"``, ``"step-7"`` -> ``"step-8"``); ``"default"`` -> ``"1"``; otherwise ``"<current>.1"``."""
    if current == DEFAULT_WEIGHT_VERSION:
        return "1"
    match = _TRAILING_INT.match(current)
    if match:
        prefix, digits = match.groups()
        return f"{prefix}{int(digits) + 1:0{len(digits)}d}"
    return f"{current}.1"


__all__ = [
    "WeightUpdate", "WeightUpdateResult", "PauseState", "WeightSync", "WeightLoadError", "WeightSyncConflictError",
    "check_pause_mode", "check_load_format", "next_weight_version", "PAUSE_MODES",
    "PAUSE_ABORT", "PAUSE_RETRACT", "PAUSE_IN_PLACE", "DEFAULT_PAUSE_MODE", "LOAD_FORMATS",
]
