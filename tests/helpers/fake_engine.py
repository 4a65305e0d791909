"""Engines for service tests that need no model: a fast deterministic fake, and a fault injector
that wraps any engine and raises inside chosen requests' streams."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from sparrow_server.engine.base import (
    ContextLengthError,
    DuplicateRequestError,
    Engine,
    EngineHealth,
    EngineInfo,
    FinishReason,
    GenerationChunk,
    GenerationRequest,
    InvalidRequestError,
)

FAKE_VOCAB = 128
FAKE_CONTEXT = 1024


class FakeEngine(Engine):
    """Token ``i`` of a request is ``(sum(prompt) + i) % vocab`` with logprob ``-0.5``; one chunk
    per token, ``token_delay_s`` apart. Validates like the reference engine (vocabulary, context)."""

    def __init__(self, token_delay_s: float = 0.0, vocab: int = FAKE_VOCAB, context: int = FAKE_CONTEXT):
        self.token_delay_s = token_delay_s
        self.vocab = vocab
        self.context = context
        self.live: dict[str, asyncio.Event] = {}
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        for event in self.live.values():
            event.set()

    def validate(self, request: GenerationRequest) -> None:
        for i, t in enumerate(request.input_ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab:
                raise InvalidRequestError(f"input_ids[{i}]", t, f"outside the vocabulary [0, {self.vocab})")
        if len(request.input_ids) + request.sampling.max_new_tokens > self.context:
            raise ContextLengthError(len(request.input_ids), request.sampling.max_new_tokens, self.context)
        self.resolve_adapter(request.adapter)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.validate(request)
        if request.rid in self.live:
            raise DuplicateRequestError(f"rid {request.rid!r} is already live")
        aborted = self.live[request.rid] = asyncio.Event()
        base = sum(request.input_ids)
        new = request.sampling.max_new_tokens
        try:
            for i in range(new):
                await self.before_token(request, i, aborted)
                if aborted.is_set():
                    yield self._chunk(request, (), i, FinishReason("abort", message="aborted"))
                    return
                finish = FinishReason("length", length=new) if i == new - 1 else None
                yield self._chunk(request, ((base + i) % self.vocab,), i + 1, finish)
        finally:
            self.live.pop(request.rid, None)

    async def before_token(self, request: GenerationRequest, i: int, aborted: asyncio.Event) -> None:
        """Runs before ``request``'s token ``i`` (0-based) goes out; a subclass may hold it here."""
        if self.token_delay_s:
            await asyncio.sleep(self.token_delay_s)

    def _chunk(self, request: GenerationRequest, tokens: tuple[int, ...], done: int, finish) -> GenerationChunk:
        top = tuple(((-0.5, t),) * min(request.top_logprobs, 1) for t in tokens) if request.top_logprobs else None
        return GenerationChunk(rid=request.rid, token_ids=tokens, logprobs=(-0.5,) * len(tokens),
                               prompt_tokens=len(request.input_ids), completion_tokens=done, top_logprobs=top,
                               kv_budget_tokens=(None,) * len(tokens), finish=finish)

    async def abort(self, rid: str) -> bool:
        event = self.live.get(rid)
        if event is not None:
            event.set()
        return event is not None

    def live_requests(self) -> tuple[str, ...]:
        return tuple(self.live)

    def health(self) -> EngineHealth:
        return EngineHealth(ok=True, live_requests=len(self.live), queued_requests=0)

    def info(self) -> EngineInfo:
        return EngineInfo(engine="fake", model_name="fake", vocab_size=self.vocab, context_length=self.context,
                          weight_version="default", page_size=16)


class InjectedFault(RuntimeError):
    """What ``FaultyEngine`` raises."""


class FaultyEngine(Engine):
    """Delegates to ``inner``; requests for which ``should_fail(request)`` is true raise
    ``InjectedFault`` after ``after_chunks`` chunks (closing the inner stream, which aborts it)."""

    def __init__(self, inner: Engine, should_fail: Callable[[GenerationRequest], bool], after_chunks: int = 2):
        self.inner = inner
        self.should_fail = should_fail
        self.after_chunks = after_chunks
        self.faults = 0

    async def start(self) -> None:
        await self.inner.start()

    async def shutdown(self) -> None:
        await self.inner.shutdown()

    def validate(self, request: GenerationRequest) -> None:
        self.inner.validate(request)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        stream = self.inner.submit(request)
        try:
            sent = 0
            async for chunk in stream:
                if self.should_fail(request) and sent >= self.after_chunks:
                    self.faults += 1
                    raise InjectedFault(f"injected fault in {request.rid}")
                sent += 1
                yield chunk
        finally:
            await stream.aclose()

    async def abort(self, rid: str) -> bool:
        return await self.inner.abort(rid)

    def live_requests(self) -> tuple[str, ...]:
        return self.inner.live_requests()

    def health(self) -> EngineHealth:
        return self.inner.health()

    def info(self) -> EngineInfo:
        return self.inner.info()

    def adapters(self) -> tuple[str, ...]:
        return self.inner.adapters()

    def resolve_adapter(self, name: str | None) -> str | None:
        return self.inner.resolve_adapter(name)
