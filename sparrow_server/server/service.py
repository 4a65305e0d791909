"""Service layer between the HTTP routes and the engine: resolves schedule, adapter and input,
expands ``n`` into engine requests, merges their streams, accumulates results and records metrics.
Engine-agnostic: it only uses the ``Engine`` interface."""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

from sparrow_server.engine.base import (
    Engine,
    FinishReason,
    GenerationChunk,
    GenerationRequest,
    InvalidRequestError,
)
from sparrow_server.engine.chat_template import chat_template_ids, user_turn
from sparrow_server.monitor import service_hooks
from sparrow_server.server.api_models import SamplingParamsIn, check_n
from sparrow_server.server.metrics import ServiceMetrics
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import DENSE_SCHEDULE_NAME, Schedule

FINISH_STATUS = {"stop": "ok", "length": "ok", "abort": "aborted", "error": "error"}


@dataclass
class SampleResult:
    """Everything generated so far for one sample (``index`` of ``n``)."""

    index: int
    rid: str
    prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[Any] = field(default_factory=list)
    kv_budget_tokens: list[int | None] = field(default_factory=list)
    selected_pages: list[Any] = field(default_factory=list)
    text: str = ""
    finish: FinishReason | None = None
    adapter: str | None = None
    weight_version: str = ""
    first_token_at: float | None = None
    verification: dict[str, Any] | None = None  # acceptance_p5/mean for meta (monitor.service_hooks)
    prompt_logprobs: list[float | None] | None = None  # asked for with ``logprob_start_len``
    prompt_top_logprobs: list[Any] | None = None

    def add(self, chunk: GenerationChunk) -> None:
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = list(chunk.prompt_logprobs)
            self.prompt_top_logprobs = list(chunk.prompt_top_logprobs or ())
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.top_logprobs is not None:
            self.top_logprobs.extend(chunk.top_logprobs)
        self.kv_budget_tokens.extend(chunk.kv_budget_tokens)
        if chunk.selected_pages is not None:
            self.selected_pages.extend(chunk.selected_pages)
        self.finish = chunk.finish or self.finish
        self.adapter = chunk.adapter
        self.weight_version = chunk.weight_version

    @property
    def kv_budget_tokens_mean(self) -> float | None:
        values = [b for b in self.kv_budget_tokens if b is not None]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Rollout:
    """A validated request, ready to stream: one engine request per sample."""

    endpoint: str
    rid: str
    schedule: Schedule
    requests: tuple[GenerationRequest, ...]
    started: float
    verify_requested: bool = False  # the client asked for dense verification
    skip_special_tokens: bool = True  # for the returned text (SGLang's sampling key)


class TextDecoder:
    """Incremental detokenisation: text deltas that never split a multi-byte character. Decodes a
    short window (from ``prefix`` on) per call, so a long generation costs O(tokens), not O(tokens^2)."""

    def __init__(self, tokenizer: Any | None, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.prefix = 0  # window start: tokens before it are final
        self.read = 0  # tokens already turned into text

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def delta(self, token_ids: Sequence[int]) -> str | None:
        if self.tokenizer is None:
            return None
        before = self._decode(token_ids[self.prefix:self.read])
        text = self._decode(token_ids[self.prefix:])
        if text.endswith("\ufffd") or len(text) < len(before):
            return ""  # an incomplete character: wait for the next token
        self.prefix, self.read = self.read, len(token_ids)
        return text[len(before):]


class RolloutService:
    def __init__(self, engine: Engine, schedules: ScheduleRegistry, metrics: ServiceMetrics,
                 default_schedule: str = DENSE_SCHEDULE_NAME, tokenizer: Any | None = None):
        self.engine = engine
        self.verifier = None  # a monitor DenseVerifier, set by create_app
        self.schedules = schedules
        self.metrics = metrics
        self.default_schedule = default_schedule
        self.tokenizer = tokenizer

    def resolve_schedule(self, name: str | None) -> Schedule:
        """Raises ``UnknownScheduleError`` (404)."""
        return self.schedules.get(name or self.default_schedule)

    def encode(self, input_ids: list[int] | None, text: str | None, chat: bool = False) -> tuple[int, ...]:
        if (input_ids is None) == (text is None):
            raise InvalidRequestError("input_ids", input_ids, "give exactly one of input_ids and text")
        if input_ids is not None:
            return tuple(input_ids)
        if self.tokenizer is None:
            raise InvalidRequestError("text", text, "this server's model has no tokenizer; send input_ids")
        if not text:
            raise InvalidRequestError("text", text, "must not be empty")
        if chat:
            return tuple(chat_template_ids(self.tokenizer, user_turn(text)))
        return tuple(self.tokenizer(text)["input_ids"])

    def prepare(self, endpoint: str, input_ids: tuple[int, ...], sampling: SamplingParamsIn, schedule_name: str | None,
                adapter: str | None, top_logprobs: int, n: int, rid: str | None, **flags: Any) -> Rollout:
        """Validate everything (raising the 4xx errors) before any streaming starts."""
        schedule = self.resolve_schedule(schedule_name)
        check_n(n)
        room = max(0, self.engine.info().context_length - len(input_ids))  # for a null max_new_tokens
        rid = rid or uuid.uuid4().hex
        verify_requested = bool(flags.pop("verify", False))
        requests = tuple(
            GenerationRequest(rid=rid if n == 1 else f"{rid}-{i}", input_ids=input_ids, sampling=sampling.to_engine(i, room),
                              schedule=schedule, adapter=adapter, top_logprobs=top_logprobs, **flags,
                              **service_hooks.request_flags(self.verifier, verify_requested))
            for i in range(n)
        )
        for request in requests:
            self.engine.validate(request)
        return Rollout(endpoint, rid, schedule, requests, time.monotonic(), verify_requested, sampling.skip_special_tokens)

    async def stream(self, rollout: Rollout) -> AsyncIterator[tuple[SampleResult, GenerationChunk, str | None]]:
        """Merged chunks of every sample: (accumulated sample, new chunk, text delta or None)."""
        name = rollout.schedule.name
        samples = [SampleResult(i, r.rid, len(r.input_ids)) for i, r in enumerate(rollout.requests)]
        decoders = [TextDecoder(self.tokenizer, rollout.skip_special_tokens) for _ in samples]
        self.metrics.prompt_tokens.labels(name).inc(sum(s.prompt_tokens for s in samples))
        inflight = self.metrics.adapter_inflight.labels(rollout.requests[0].adapter or "")
        inflight.inc(len(samples))
        try:
            async with contextlib.aclosing(merge([self.engine.submit(r) for r in rollout.requests])) as chunks:
                async for i, chunk in chunks:
                    sample = samples[i]
                    if sample.first_token_at is None and chunk.token_ids:
                        sample.first_token_at = time.monotonic()
                        self.metrics.ttft.labels(rollout.endpoint).observe(sample.first_token_at - rollout.started)
                    sample.add(chunk)
                    if chunk.finish is not None:  # dense verification (waits only when the client asked)
                        sample.verification = await service_hooks.on_finished(
                            self.verifier, rollout.requests[i], rollout.schedule, sample, rollout.verify_requested)
                    delta = decoders[i].delta(sample.token_ids)
                    if delta is not None:
                        sample.text += delta
                    self.metrics.observe_chunk(name, chunk)
                    yield sample, chunk, delta
        finally:
            inflight.dec(len(samples))
            elapsed = time.monotonic() - rollout.started
            for sample in samples:
                status = FINISH_STATUS.get(sample.finish.type, "error") if sample.finish else "aborted"
                self.metrics.observe_finish(rollout.endpoint, name, status, elapsed)

    def final_text(self, sample: SampleResult, skip_special_tokens: bool, no_stop_trim: bool) -> str:
        """SGLang's text of a sample: a matched stop string is cut off (kept, and what follows it cut,
        with ``no_stop_trim``); a matched stop token (EOS or ``stop_token_ids``) is not decoded unless
        ``no_stop_trim`` (SGLang 0.5.17 ``DetokenizerManager.trim_matched_stop``)."""
        matched = sample.finish.matched if sample.finish is not None and sample.finish.type == "stop" else None
        if matched is None or self.tokenizer is None:
            return sample.text
        if isinstance(matched, str):
            pos = sample.text.find(matched)
            if pos < 0:
                return sample.text
            return sample.text[:pos + len(matched)] if no_stop_trim else sample.text[:pos]
        if no_stop_trim or not sample.token_ids:
            return sample.text
        return self.tokenizer.decode(sample.token_ids[:-1], skip_special_tokens=skip_special_tokens)

    async def collect(self, rollout: Rollout) -> list[SampleResult]:
        samples: dict[int, SampleResult] = {}
        async for sample, _, _ in self.stream(rollout):
            samples[sample.index] = sample
        return [samples[i] for i in sorted(samples)]


async def merge(streams: Sequence[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several streams as (stream index, item); closing this iterator cancels (so aborts)
    all of them. An exception in one stream is re-raised here. A stream is pulled again only once
    the consumer has taken its previous item (items may be mutable, e.g. accumulated samples: a
    stream running ahead would change an item before the consumer reads it)."""
    queue: asyncio.Queue = asyncio.Queue()
    exhausted = object()
    taken = [asyncio.Event() for _ in streams]

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async with contextlib.aclosing(stream):  # cancelled while waiting: the stream closes (aborts) too
                async for item in stream:
                    taken[i].clear()
                    queue.put_nowait((i, item))
                    await taken[i].wait()
            queue.put_nowait((i, exhausted))
        except Exception as exc:  # delivered to the consumer, which re-raises it
            queue.put_nowait((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is exhausted:
                remaining -= 1
                continue
            yield i, item
            taken[i].set()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
