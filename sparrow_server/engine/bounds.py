"""Ranges of request fields that both engines can execute, defined once.

The engine dataclasses (``engine.base.SamplingParams``, ``GenerationRequest``) check them when a
request is built, so the HTTP edge refuses an out-of-range value with a 422 naming the field and
its value before anything runs. Each check returns the reason a value is refused, or None.
Types (no booleans for numbers, finite numbers only, valid Unicode) are checked at the edge
(``server.request_checks``); these checks also refuse a wrong type, for callers that skip it.
"""
from __future__ import annotations

import math
from typing import Any

SAMPLING_EPS = 1e-6  # a temperature below it samples greedily (SGLang's rule: T -> 1, top_k -> 1)
MAX_TEMPERATURE = 1e6  # logits / T is then ~0: uniform sampling; larger values say nothing more
MAX_TOP_K = 1 << 30  # SGLang's TOP_K_ALL: any larger top-k keeps every token anyway
MAX_SEED = (1 << 64) - 1  # torch and SGLang seeds are unsigned 64-bit (sample i of n uses seed + i)
MAX_TOKEN_ID = (1 << 31) - 1  # token ids travel as int32 on the SGLang side
# SGLang's ranges of its penalty keys (sampling_params.verify)
PENALTY_RANGES: dict[str, tuple[float, float]] = {
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "repetition_penalty": (0.0, 2.0),
}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def int_reason(value: Any, low: int, high: int, what: str = "an integer") -> str | None:
    if is_int(value) and low <= value <= high:
        return None
    return f"must be {what} in [{low}, {high}]"


def float_reason(value: Any, low: float, high: float, low_open: bool = False) -> str | None:
    if is_finite(value) and (value > low if low_open else value >= low) and value <= high:
        return None
    return f"must be a finite number in {'(' if low_open else '['}{low}, {high}]"


def top_k_reason(value: Any) -> str | None:
    if is_int(value) and (value == -1 or 1 <= value <= MAX_TOP_K):
        return None
    return f"must be -1 (off) or an integer in [1, {MAX_TOP_K}]"


def seed_reason(seed: Any, samples: int = 1) -> str | None:
    """A seed for ``samples`` samples (seeds ``seed .. seed + samples - 1``)."""
    if not is_int(seed) or seed < 0:
        return f"must be an integer in [0, {MAX_SEED}]"
    if seed + samples - 1 > MAX_SEED:
        return f"seed + {samples - 1} (the last of {samples} samples' seeds) exceeds {MAX_SEED} (2**64 - 1)"
    return None


def penalty_reason(name: str, value: Any) -> str | None:
    low, high = PENALTY_RANGES[name]
    return float_reason(value, low, high)


__all__ = ["SAMPLING_EPS", "MAX_TEMPERATURE", "MAX_TOP_K", "MAX_SEED", "MAX_TOKEN_ID", "PENALTY_RANGES", "is_int", "is_finite",
           "int_reason", "float_reason", "top_k_reason", "seed_reason", "penalty_reason"]
