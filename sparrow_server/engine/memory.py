"""Cache and memory control between RL steps: the engine-agnostic protocol behind SGLang's
``/flush_cache``, ``/release_memory_occupation``, ``/resume_memory_occupation`` and
``/weights_checker``. An engine that supports it returns a ``MemoryControl`` from ``engine.memory_control()``.

Tags are SGLang 0.5.17's (``srt/constants.py``): no tags means all of them. Each engine reports,
per call, which tags it really released and which it kept (the reference engine keeps its weights:
it has no GPU memory saver), so nothing is silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from sparrow_server.engine.errors import InvalidRequestError

KV_CACHE, WEIGHTS, CUDA_GRAPH = "kv_cache", "weights", "cuda_graph"
MEMORY_TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)  # SGLang's GPU_MEMORY_ALL_TYPES, in its order
WEIGHT_CHECK_ACTIONS = ("checksum", "snapshot", "compare", "reset_tensors")  # SGLang's WeightChecker


class MemoryBusyError(Exception):
    """Requests are live: the operation needs an idle engine (HTTP 400, as SGLang refuses it)."""


@dataclass(frozen=True)
class MemoryReport:
    """What a release or resume did: ``changed`` tags acted on, ``kept`` tags this engine holds on to."""

    changed: tuple[str, ...]
    kept: tuple[str, ...]


@runtime_checkable
class MemoryControl(Protocol):
    def flush_cache(self) -> bool:
        """Clear the KV pool and the landmark side cache; False (nothing done) while requests are live."""

    def release_memory(self, tags: Sequence[str]) -> MemoryReport: ...

    def resume_memory(self, tags: Sequence[str]) -> MemoryReport: ...

    def check_weights(self, action: str) -> dict[str, Any] | None:
        """SGLang's weights checker: ``checksum`` returns the per-rank payload; the others None."""


def memory_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """SGLang's tag list: None or empty = all; an unknown tag is a 422."""
    if not tags:
        return MEMORY_TAGS
    for i, tag in enumerate(tags):
        if tag not in MEMORY_TAGS:
            raise InvalidRequestError(f"tags[{i}]", tag, f"must be one of {', '.join(MEMORY_TAGS)}")
    return tuple(dict.fromkeys(tags))
