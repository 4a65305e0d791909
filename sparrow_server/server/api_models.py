"""Pydantic models of the HTTP edge. Values are checked for type here, strictly (``STRICT``: a
boolean is not an integer, ``2.0`` is not an integer, no NaN or infinity); ranges are checked by
the engine dataclasses they convert into (``SamplingParams``, ``GenerationRequest``), so every
default is defined once, in ``sparrow_server.engine.base``, and every bound once, in
``sparrow_server.engine.bounds``."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sparrow_server.engine import bounds
from sparrow_server.engine.base import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MIN_P,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    InvalidRequestError,
    SamplingParams,
)

MAX_N = 64
STRICT = ConfigDict(strict=True, allow_inf_nan=False)  # every request model's type rules
SCHEDULE_CUSTOM_PARAM = "sparrow_schedule"  # sampling_params.custom_params key on /generate
# /generate ``extra_key`` naming the schedule: the router keeps ``extra_key`` but drops custom_params.
SCHEDULE_EXTRA_KEY_PREFIX = "sparrow_schedule="
# SGLang sampling keys accepted only at their neutral value (this engine does not implement them).
NEUTRAL_SAMPLING = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0,
    "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None, "logit_bias": None, "stop_regex": None,
}


class SamplingParamsIn(BaseModel):
    """SGLang's sampling keys (unknown keys are refused, as SGLang's HTTP contract does)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    min_p: float = DEFAULT_MIN_P
    seed: int | None = None
    sampling_seed: int | None = None  # SGLang's name for the seed
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    n: int = 1
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    custom_params: dict[str, Any] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[str, float] | None = None
    stop_regex: str | list[str] | None = None
    stream_interval: int | None = None  # accepted for compatibility; this server streams every token

    def to_engine(self, sample_index: int = 0) -> SamplingParams:
        """Engine params of sample ``sample_index`` (sample i of n uses seed + i)."""
        for key, neutral in NEUTRAL_SAMPLING.items():
            value = getattr(self, key)
            if value != neutral:
                raise InvalidRequestError(f"sampling_params.{key}", value, f"is not supported by this server (only {neutral!r})")
        seed = self.seed if self.seed is not None else self.sampling_seed
        if seed is not None and (reason := bounds.seed_reason(seed, sample_index + 1)) is not None:
            raise InvalidRequestError("sampling_params.seed" if self.seed is not None else "sampling_params.sampling_seed",
                                      seed, reason)
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, seed=None if seed is None else seed + sample_index,
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
            stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
        )


class RolloutIn(BaseModel):
    """``POST /rollout`` body."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    input_ids: list[int] | None = None
    text: str | None = None
    apply_chat_template: bool = False
    sampling_params: SamplingParamsIn = Field(default_factory=SamplingParamsIn)
    schedule: str | None = None
    adapter: str | None = None
    top_logprobs: int = 0
    stream: bool = False
    n: int = 1
    rid: str | None = None
    return_selected_pages: bool = False
    verify: bool = False


class AbortIn(BaseModel):
    model_config = STRICT
    rid: str


def check_n(n: int, field: str = "n") -> int:
    if isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise InvalidRequestError(field, n, f"must be in [1, {MAX_N}]")
    return n
