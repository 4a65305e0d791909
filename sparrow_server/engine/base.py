"""Engine interface: what the HTTP service needs from a generation engine.

Engine-agnostic on purpose (no torch types): the reference engine (PyTorch + transformers)
and the SGLang engine (forwarding to SGLang's tokenizer manager) implement the same API.
Requests and streamed outputs are frozen dataclasses of plain Python values.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

from sparrow_server.engine import bounds
# The errors have their own module, so that memory, weights and weight groups (which Engine uses) need not
# import this one; imported here, they stay part of the interface.
from sparrow_server.engine.errors import (
    ContextLengthError, DuplicateRequestError, EngineError, InvalidRequestError, UnknownAdapterError,
)
from sparrow_server.engine.ports import AdapterPort, DenseScoring, LocalModel
from sparrow_server.engine.weights import DEFAULT_WEIGHT_VERSION
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.sparsity.wire import check_page_size

if TYPE_CHECKING:  # annotations only (exact_subsample imports torch)
    from sparrow_server.stats.exact_subsample import KeptPositions
    from sparrow_server.engine.memory import MemoryControl
    from sparrow_server.engine.weights import WeightSync
    from sparrow_server.engine.weight_groups import WeightGroups

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
DEFAULT_TOP_K = -1  # -1 = no top-k truncation (SGLang's convention)
DEFAULT_MIN_P = 0.0
DEFAULT_FREQUENCY_PENALTY = 0.0
DEFAULT_PRESENCE_PENALTY = 0.0
DEFAULT_REPETITION_PENALTY = 1.0  # 1 = off
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request. ``temperature == 0`` (or below ``SAMPLING_EPS``) means greedy."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    top_k: int = DEFAULT_TOP_K
    min_p: float = DEFAULT_MIN_P
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()  # stop strings (matched on the detokenised completion)
    # SGLang's penalties, over the tokens generated so far (not the prompt), and its logit bias
    frequency_penalty: float = DEFAULT_FREQUENCY_PENALTY
    presence_penalty: float = DEFAULT_PRESENCE_PENALTY
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY
    min_new_tokens: int = 0  # EOS and stop_token_ids are masked until this many tokens exist
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    def __post_init__(self) -> None:
        _validate_sampling(self)

    @property
    def is_greedy(self) -> bool:
        """Temperature 0, or below ``SAMPLING_EPS`` (as SGLang: dividing logits by a tiny positive
        temperature would overflow to non-finite probabilities)."""
        return self.temperature < bounds.SAMPLING_EPS

    @property
    def adjusts_logits(self) -> bool:
        """Whether any penalty, ``min_new_tokens`` or logit bias changes the logits."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
                    or self.min_new_tokens or self.logit_bias)

    @property
    def logprob_temperature(self) -> float:
        """Temperature the reported logprobs are computed at (1 when greedy, as SGLang does)."""
        return 1.0 if self.is_greedy else self.temperature


def _validate_sampling(p: SamplingParams) -> None:
    def check(name: str, value: Any, reason: str | None) -> None:
        if reason is not None:
            raise InvalidRequestError(f"sampling_params.{name}", value, reason)

    if not bounds.is_int(p.max_new_tokens) or p.max_new_tokens < 0:
        check("max_new_tokens", p.max_new_tokens, "must be an integer >= 0 (0: score the prompt only)")
    check("temperature", p.temperature, bounds.float_reason(p.temperature, 0.0, bounds.MAX_TEMPERATURE))
    check("top_p", p.top_p, bounds.float_reason(p.top_p, 0.0, 1.0, low_open=True))
    check("top_k", p.top_k, bounds.top_k_reason(p.top_k))
    check("min_p", p.min_p, bounds.float_reason(p.min_p, 0.0, 1.0))
    if p.seed is not None:
        check("seed", p.seed, bounds.seed_reason(p.seed))
    for i, text in enumerate(p.stop):
        if not isinstance(text, str) or not text:
            check(f"stop[{i}]", text, "must be a non-empty string")
    for i, t in enumerate(p.stop_token_ids):
        check(f"stop_token_ids[{i}]", t, bounds.int_reason(t, 0, bounds.MAX_TOKEN_ID, "a token id"))
    _validate_penalties(p, check)


def _validate_penalties(p: SamplingParams, check) -> None:
    for name in ("frequency_penalty", "presence_penalty"):
        check(name, getattr(p, name), bounds.penalty_reason(name, getattr(p, name)))
    # (0, 2], not SGLang's [0, 2]: a repetition penalty of 0 divides the logits by zero
    low, high = bounds.PENALTY_RANGES["repetition_penalty"]
    check("repetition_penalty", p.repetition_penalty,
          bounds.float_reason(p.repetition_penalty, low, high, low_open=True))
    check("min_new_tokens", p.min_new_tokens, bounds.int_reason(p.min_new_tokens, 0, bounds.MAX_TOKEN_ID))
    for token, bias in p.logit_bias:
        check("logit_bias", token, bounds.int_reason(token, 0, bounds.MAX_TOKEN_ID, "a token id"))
        check(f"logit_bias.{token}", bias, None if bounds.is_finite(bias) else "must be a finite number")


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to generate. The schedule is resolved before submission; the adapter is a
    name the engine resolves once, at admission (the request finishes on that version).

    ``return_selected_pages``: record, per generated token, the pages each sparse layer's KV
    heads attended (for tests and debugging). ``verify``/``record_topk``: reserved for dense
    verification (the sparse top-k distribution recorded per token, then re-scored densely);
    ``exact_keep``: the generated positions whose full sparse row the engine keeps for exact acceptance.
    ``logprob_start_len``: also report the logprobs of ``input_ids[logprob_start_len:]`` (SGLang's
    field and semantics: from the dense prefill, at temperature 1, the first one ``None``);
    ``None``: no prompt logprobs.
    """

    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    schedule: Schedule | None = None
    adapter: str | None = None
    top_logprobs: int = 0
    return_selected_pages: bool = False
    verify: bool = False
    record_topk: int = 0
    logprob_start_len: int | None = None
    exact_keep: KeptPositions | None = None  # verified: store the sparse rows there for exact acceptance

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise InvalidRequestError("input_ids", list(self.input_ids), "must not be empty")
        if not bounds.is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError("top_logprobs", self.top_logprobs, f"must be in [0, {MAX_TOP_LOGPROBS}]")
        if self.record_topk < 0:
            raise InvalidRequestError("record_topk", self.record_topk, "must be >= 0")
        start = self.logprob_start_len
        if start is not None and (isinstance(start, bool) or not isinstance(start, int)
                                  or not 0 <= start <= len(self.input_ids)):
            raise InvalidRequestError("logprob_start_len", start,
                                      f"must be in [0, {len(self.input_ids)}] (the prompt's length), or -1/null for none")


@dataclass(frozen=True)
class FinishReason:
    """Why a sequence ended, in SGLang's shape: ``stop`` (``matched`` = the token id),
    ``length`` (``length`` = max_new_tokens), ``abort`` or ``error`` (``message``)."""

    type: str
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        if self.length is not None:
            out["length"] = self.length
        if self.message is not None:
            out["message"] = self.message
        return out


# One generated token's top logprobs: ((logprob, token_id), ...) best first.
TopLogprobs = tuple[tuple[float, int], ...]
# Pages attended for one generated token: per layer (None for a dense layer), per KV head,
# the logical page indices (ascending) within the sequence.
PageSelection = tuple[tuple[tuple[int, ...], ...] | None, ...]


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens produced since the previous chunk of the same request (``rid``).

    ``kv_budget_tokens[i]``: KV tokens the sparse layers attended to produce token ``i``
    (``None`` for the token produced by the dense prefill). ``finish`` is set on the last chunk.
    ``prompt_logprobs``/``prompt_top_logprobs``: on the first chunk of a request that asked for them
    (``logprob_start_len``), one entry per prompt token from that position on, the first ``None``.
    """

    rid: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int
    top_logprobs: tuple[TopLogprobs, ...] | None = None
    kv_budget_tokens: tuple[int | None, ...] = ()
    selected_pages: tuple[PageSelection, ...] | None = None
    finish: FinishReason | None = None
    adapter: str | None = None
    weight_version: str = DEFAULT_WEIGHT_VERSION
    prompt_logprobs: tuple[float | None, ...] | None = None
    prompt_top_logprobs: tuple[TopLogprobs | None, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific fields (e.g. verification)

    @property
    def done(self) -> bool:
        return self.finish is not None


@dataclass(frozen=True)
class EngineInfo:
    engine: str
    model_name: str
    vocab_size: int
    context_length: int
    weight_version: str
    page_size: int
    eos_token_ids: tuple[int, ...] = ()
    device: str = "cpu"


# Why an engine makes no progress until a control call undoes it (``EngineHealth.held``).
HELD_MEMORY_RELEASED = "memory_released"  # /release_memory_occupation freed the KV pool (until resumed)
HELD_PAUSED = "paused"  # /pause_generation (until /continue_generation)


@dataclass(frozen=True)
class EngineHealth:
    """``ok``: the engine's loop runs. ``held``: why no token can come until a control call (None: it
    can generate). ``free_pages`` is 0 while the KV pool is released. ``progress`` moves whenever the
    engine finishes a step (None: this engine does not count them)."""

    ok: bool
    live_requests: int
    queued_requests: int
    free_pages: int | None = None
    total_pages: int | None = None
    detail: str = ""
    held: str | None = None
    progress: int | None = None

    @property
    def serving(self) -> bool:
        """The loop runs and nothing holds generation."""
        return self.ok and self.held is None

    @property
    def used_pages(self) -> int:
        """Pages requests hold: none while the pool is released (no page is free, none is used)."""
        if self.held == HELD_MEMORY_RELEASED:
            return 0
        return (self.total_pages or 0) - (self.free_pages or 0)


class Engine(abc.ABC):
    """What the service calls. Implementations must be safe to call from one asyncio loop.

    Optional capabilities are typed ports: a method returning the port, or None when this engine
    lacks it (``adapter_port``, ``weights``, ``weight_groups``, ``memory_control``, ``local_model``, ``dense_scoring``)."""

    # The engine's schedulers read the default schedule once, at start (SGLang): it cannot change live.
    default_schedule_fixed_at_start: bool = False

    @abc.abstractmethod
    async def start(self) -> None:
        """Start background work (the batching loop)."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Abort live requests and stop background work."""

    @abc.abstractmethod
    def validate(self, request: GenerationRequest) -> None:
        """Raise the error the request would fail with at admission (no side effects)."""

    @abc.abstractmethod
    def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Admit a request and stream its chunks; the last one has ``finish`` set.

        Closing the iterator before the last chunk aborts the request and frees its memory.
        Raises (on first iteration) the errors of ``validate``.
        """

    @abc.abstractmethod
    async def abort(self, rid: str) -> bool:
        """Abort a live request; False when no such request is live."""

    @abc.abstractmethod
    def live_requests(self) -> tuple[str, ...]:
        """rids admitted and not yet finished (queued or running)."""

    @abc.abstractmethod
    def health(self) -> EngineHealth: ...

    @abc.abstractmethod
    def info(self) -> EngineInfo: ...

    def adapters(self) -> tuple[str, ...]:
        """Names of the loaded adapters."""
        return ()

    def adapter_port(self) -> AdapterPort | None:
        """Loading and unloading LoRA adapters at run time; None when this engine cannot."""
        return None

    def weights(self) -> WeightSync | None:
        """Weight updates without a restart, pause/continue; None when this engine cannot."""
        return None

    def weight_groups(self) -> WeightGroups | None:
        """Joining a trainer's process group and taking the weights it broadcasts; None when this engine cannot."""
        return None

    def memory_control(self) -> MemoryControl | None:
        """Flushing, releasing and resuming the KV pool, the weights checker; None when unsupported."""
        return None

    def local_model(self) -> LocalModel | None:
        """The model, when it runs in this process (exact verification, the base fingerprint)."""
        return None

    def dense_scoring(self) -> DenseScoring | None:
        """A dense scorer of the engine's own, for engines without a local model (SGLang)."""
        return None

    def max_running_requests(self) -> int | None:
        """Most requests decoding at once, when this engine has such a limit."""
        return None

    def check_schedule(self, schedule: Schedule) -> None:
        """Raise ``ScheduleError`` for a schedule this engine cannot run as written (default: one
        whose pages are not this engine's)."""
        check_page_size(schedule, self.info().page_size)

    def resolve_adapter(self, name: str | None) -> str | None:
        """The adapter version a request naming ``name`` runs on; raises ``UnknownAdapterError``."""
        if name is None:
            return None
        raise UnknownAdapterError(name, self.adapters())


__all__ = [
    "Engine", "EngineError", "InvalidRequestError", "ContextLengthError", "UnknownAdapterError",
    "DuplicateRequestError", "SamplingParams", "GenerationRequest", "GenerationChunk", "FinishReason",
    "EngineInfo", "EngineHealth", "TopLogprobs", "PageSelection", "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_WEIGHT_VERSION", "MAX_TOP_LOGPROBS", "HELD_MEMORY_RELEASED", "HELD_PAUSED",
]
