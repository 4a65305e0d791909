"""Pydantic models of the HTTP edge. Values are checked for type here, strictly (``STRICT``: a
boolean is not an integer, ``2.0`` is not an integer, no NaN or infinity); ranges are checked by
the engine dataclasses they convert into (``SamplingParams``, ``GenerationRequest``), so every
default is defined once, in ``sparrow_server.engine.base``, and every bound once, in
``sparrow_server.engine.bounds``."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparrow_server.engine import bounds
from sparrow_server.engine.base import (
    DEFAULT_FREQUENCY_PENALTY,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MIN_P,
    DEFAULT_PRESENCE_PENALTY,
    DEFAULT_REPETITION_PENALTY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    InvalidRequestError,
    SamplingParams,
)

MAX_N = 64
STRICT = ConfigDict(strict=True, allow_inf_nan=False)  # every request model's type rules
# SGLang sampling keys this engine does not implement: accepted only empty (null, "" or []), as
# SGLang treats an empty grammar as none; anything else is a 422 naming the key.
UNSUPPORTED_SAMPLING = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex")
# A null value means the default (SGLang's SamplingParams.__post_init__), except max_new_tokens,
# whose null means "until the context (or the KV pool) is full".
NULL_MEANS_UNBOUNDED = "max_new_tokens"


class SamplingParamsIn(BaseModel):
    """SGLang 0.5.17's sampling keys (unknown keys are refused, as SGLang's HTTP contract does).
    docs/api.md has the field-by-field table."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS
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
    # SGLang passes it to the HF tokenizer's decode; fast tokenizers (SGLang's and this server's) have no
    # such option, so either value gives the same text there. slime always sends false.
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    custom_params: dict[str, Any] | None = None
    frequency_penalty: float = DEFAULT_FREQUENCY_PENALTY
    presence_penalty: float = DEFAULT_PRESENCE_PENALTY
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY
    min_new_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    stop_regex: str | list[str] | None = None
    stream_interval: int | None = None  # SGLang's streaming granularity; this server streams every token

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k == NULL_MEANS_UNBOUNDED}
        return data

    def check_supported(self) -> None:
        for key in UNSUPPORTED_SAMPLING:
            value = getattr(self, key)
            if value:
                raise InvalidRequestError(f"sampling_params.{key}", value,
                                          "is not supported by this server (only null or empty)")

    def to_engine(self, sample_index: int = 0, max_new_tokens: int | None = None) -> SamplingParams:
        """Engine params of sample ``sample_index`` (sample i of n uses seed + i). ``max_new_tokens``
        replaces a null ``max_new_tokens`` (the caller knows the room left in the context)."""
        self.check_supported()
        seed = self.seed if self.seed is not None else self.sampling_seed
        if seed is not None and (reason := bounds.seed_reason(seed, sample_index + 1)) is not None:
            raise InvalidRequestError("sampling_params.seed" if self.seed is not None else "sampling_params.sampling_seed",
                                      seed, reason)
        return SamplingParams(
            max_new_tokens=self.max_new_tokens if self.max_new_tokens is not None else max_new_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, seed=None if seed is None else seed + sample_index,
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
            stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
            frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty, min_new_tokens=self.min_new_tokens,
            logit_bias=tuple((_token_key(k), v) for k, v in (self.logit_bias or {}).items()),
        )


def _token_key(key: str) -> int:
    """A ``logit_bias`` key: a token id written as a string (JSON keys are strings)."""
    try:
        return int(key)
    except ValueError:
        raise InvalidRequestError(f"sampling_params.logit_bias.{key}", key, "keys must be token ids") from None


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
    """SGLang's ``AbortReq``: ``rid`` defaults to "" (matches nothing); ``abort_all`` aborts every
    live request. ``finished_reason``/``abort_message`` are SGLang-internal and accepted unused."""

    model_config = STRICT
    rid: str | None = ""
    abort_all: bool = False
    finished_reason: dict[str, Any] | None = None
    abort_message: str | None = None


def check_n(n: int, field: str = "n") -> int:
    if isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise InvalidRequestError(field, n, f"must be in [1, {MAX_N}]")
    return n
