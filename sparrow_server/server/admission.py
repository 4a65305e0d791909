"""Admission of generation requests: concurrency slots, a bounded queue, timeouts, stream guards.

Every generation request takes a ``StreamSlot`` from ``Admission.acquire`` before it reaches the
engine and gives it back when it ends (finished, failed, timed out, aborted or disconnected):

- a client (by remote address) above ``max_streams_per_client`` (queued ones included) -> 429;
- when ``max_concurrent_streams`` slots are taken the request waits in a FIFO queue of at most
  ``max_queue`` requests; a full queue, or a wait longer than ``request_timeout_s``, -> 429;
- every 429 carries ``Retry-After: retry_after_s``; while draining for shutdown -> 503.

``guarded_stream`` wraps a response body so that an engine exception, the request timeout or
a shutdown abort ends the stream with one final error event (``{"error": {...}, "done": true}``)
instead of a cut connection, closes the generation (which aborts it and frees its KV pages),
and releases the slot. ``GuardedStreamingResponse`` closes the body when the client goes away.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from sparrow_server.engine.base import EngineError
from sparrow_server.server.errors import error_response
from sparrow_server.server.limits import Limits, flag

log = logging.getLogger(__name__)
T = TypeVar("T")
ErrorEncoder = Callable[[dict[str, Any]], bytes]


class TooManyRequestsError(Exception):
    """HTTP 429 with ``Retry-After``. ``reason`` says which bound was hit."""

    def __init__(self, reason: str, retry_after_s: int):
        self.reason = reason
        self.retry_after_s = retry_after_s
        super().__init__(reason)


class ShuttingDownError(Exception):
    """HTTP 503: the server is draining and admits nothing new."""


class RequestTimeoutError(Exception):
    """HTTP 504 for a non-streaming request that ran past ``request_timeout_s``."""


class EngineFailureError(Exception):
    """HTTP 500 with a JSON error body: the engine raised while serving a non-streaming request."""


@dataclass(eq=False)
class StreamSlot:
    """One admitted request. ``abort(reason)`` ends its stream with an error event of type ``reason``."""

    client: str
    deadline: float | None  # time.monotonic() deadline, None = no timeout
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    abort_reason: str = ""
    released: bool = False

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def abort(self, reason: str) -> None:
        self.abort_reason = self.abort_reason or reason
        self.aborted.set()


class Admission:
    """Slots and the bounded FIFO queue of one app (one asyncio loop)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.active: set[StreamSlot] = set()
        self.per_client: collections.Counter[str] = collections.Counter()
        self._granted = 0  # slots in use or handed to a waiter that has not woken yet
        self._waiting: collections.deque[asyncio.Future] = collections.deque()
        self.closed = False
        self.rejected: collections.Counter[str] = collections.Counter()
        self.on_reject: Callable[[str], None] | None = None  # e.g. a Prometheus counter's inc

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def acquire(self, client: str) -> StreamSlot:
        if self.closed:
            raise ShuttingDownError("the server is shutting down and admits no new requests")
        limits = self.limits
        if self.per_client[client] >= limits.max_streams_per_client:
            raise self._reject("per_client", f"client {client} has {self.per_client[client]} requests in flight "
                                             f"(limit {limits.max_streams_per_client}, {flag('max_streams_per_client')})")
        started = time.monotonic()
        deadline = None if limits.request_timeout_s is None else started + limits.request_timeout_s
        self.per_client[client] += 1
        try:
            await self._take_capacity(deadline)
        except BaseException:
            self._forget_client(client)
            raise
        slot = StreamSlot(client, deadline)
        self.active.add(slot)
        return slot

    async def _take_capacity(self, deadline: float | None) -> None:
        limits = self.limits
        if self._granted < limits.max_concurrent_streams and not self._waiting:
            self._granted += 1
            return
        if len(self._waiting) >= limits.max_queue:
            raise self._reject("queue_full", f"{self._granted} requests running and {len(self._waiting)} queued "
                                             f"(limits {flag('max_concurrent_streams')} {limits.max_concurrent_streams}, "
                                             f"{flag('max_queue')} {limits.max_queue})")
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            await asyncio.wait_for(waiter, timeout)
        except BaseException as exc:  # timed out or cancelled (client gone)
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._give_back_capacity()  # granted at the same moment: pass it on
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
            if isinstance(exc, asyncio.TimeoutError):
                raise self._reject("queue_timeout", f"no slot freed within {flag('request_timeout_s')} "
                                                    f"{limits.request_timeout_s} s") from None
            raise

    def _reject(self, reason: str, message: str) -> TooManyRequestsError:
        self.rejected[reason] += 1
        if self.on_reject is not None:
            self.on_reject(reason)
        return TooManyRequestsError(message, self.limits.retry_after_s)

    def release(self, slot: StreamSlot) -> None:
        if slot.released:
            return
        slot.released = True
        self.active.discard(slot)
        self._forget_client(slot.client)
        self._give_back_capacity()

    def _give_back_capacity(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the capacity passes to the oldest waiter
                return
        self._granted -= 1

    def _forget_client(self, client: str) -> None:
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]

    def close(self) -> None:
        """Admit nothing more: new requests and queued ones get ``ShuttingDownError`` (503)."""
        self.closed = True
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(ShuttingDownError("the server is shutting down and admits no new requests"))

    def abort_all(self, reason: str) -> int:
        for slot in list(self.active):
            slot.abort(reason)
        return len(self.active)


def client_key(request: Request) -> str:
    """Who a request counts against: its remote address (uvicorn's proxy headers may set it)."""
    return request.client.host if request.client else "unknown"


def admission_of(request: Request) -> Admission:
    return request.app.state.admission


class StreamAborted(Exception):
    def __init__(self, error: dict[str, Any]):
        self.error = error
        super().__init__(error.get("message", ""))


async def _until_aborted(slot: StreamSlot, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Items of ``events`` until it ends, the slot's deadline passes or the slot is aborted."""
    abort_wait = asyncio.ensure_future(slot.aborted.wait())
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({step, abort_wait}, timeout=slot.remaining_s(),
                                         return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                raise StreamAborted(_abort_error(slot))
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        abort_wait.cancel()
        if step is not None and not step.done():
            # Cancelled (client gone, shutdown) or aborted while the next event was being made: the
            # cancellation runs down to the engine's submit, which aborts the generation now.
            step.cancel()
            await settle(step)


async def settle(task: asyncio.Future) -> None:
    """Wait for a cancelled task to finish its cleanup, even inside a cancelled scope (Starlette
    cancels a streaming response's scope when the client disconnects)."""
    with anyio.CancelScope(shield=True):
        await asyncio.gather(task, return_exceptions=True)


def _abort_error(slot: StreamSlot) -> dict[str, Any]:
    if slot.aborted.is_set():
        return {"type": slot.abort_reason, "message": f"request aborted: {slot.abort_reason}"}
    return {"type": "timeout", "message": "request exceeded this server's timeout "
                                          f"({flag('request_timeout_s')})"}


async def guarded_stream(admission: Admission, slot: StreamSlot, events: AsyncIterator[bytes],
                         error_event: ErrorEncoder) -> AsyncIterator[bytes]:
    """``events`` ending, whatever happens, with either its own last event or one error event."""
    try:
        async for item in _until_aborted(slot, events):
            yield item
    except StreamAborted as exc:
        yield error_event(exc.error)
    except Exception as exc:  # an engine failure ends this stream only
        log.exception("generation failed")
        yield error_event({"type": "engine_error", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        admission.release(slot)
        with contextlib.suppress(Exception), anyio.CancelScope(shield=True):
            await events.aclose()


async def guarded_call(admission: Admission, slot: StreamSlot, work: Awaitable[T]) -> T:
    """Await ``work`` within the slot's deadline and abort; raise ``RequestTimeoutError`` past it."""
    task = asyncio.ensure_future(work)
    abort_wait = asyncio.ensure_future(slot.aborted.wait())
    try:
        done, _ = await asyncio.wait({task, abort_wait}, timeout=slot.remaining_s(), return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            error = _abort_error(slot)
            raise (ShuttingDownError if error["type"] == "shutdown" else RequestTimeoutError)(error["message"])
        try:
            return task.result()
        except (EngineError, HTTPException):
            raise  # mapped to their own 4xx
        except Exception as exc:
            log.exception("generation failed")
            raise EngineFailureError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        abort_wait.cancel()
        if not task.done():
            task.cancel()
        admission.release(slot)


class GuardedStreamingResponse(StreamingResponse):
    """A streaming response that closes its body iterator however the response ends (so a
    disconnected client's generation is aborted and its slot released at once, not at GC)."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception), anyio.CancelScope(shield=True):
                    await close()


async def _too_many(request: Request, exc: TooManyRequestsError) -> JSONResponse:
    response = error_response(429, "too_many_requests", exc.reason, retry_after_s=exc.retry_after_s)
    response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


async def _shutting_down(request: Request, exc: ShuttingDownError) -> JSONResponse:
    response = error_response(503, "shutting_down", str(exc))
    response.headers["Retry-After"] = str(request.app.state.limits.retry_after_s)
    response.headers["Connection"] = "close"
    return response


async def _timeout(request: Request, exc: RequestTimeoutError) -> JSONResponse:
    return error_response(504, "timeout", str(exc))


async def _engine_failure(request: Request, exc: EngineFailureError) -> JSONResponse:
    return error_response(500, "engine_error", str(exc))


def install_admission(app: FastAPI, limits: Limits, registry: Any | None = None) -> Admission:
    """Create the app's ``Admission`` (``app.state.admission``), its error mapping and, given a
    Prometheus registry, its gauges and rejection counter."""
    admission = Admission(limits)
    app.state.admission = admission
    app.add_exception_handler(TooManyRequestsError, _too_many)
    app.add_exception_handler(ShuttingDownError, _shutting_down)
    app.add_exception_handler(RequestTimeoutError, _timeout)
    app.add_exception_handler(EngineFailureError, _engine_failure)
    if registry is not None:
        _register_metrics(admission, registry)
    return admission


def _register_metrics(admission: Admission, registry: Any) -> None:
    from prometheus_client import Counter, Gauge

    Gauge("sparrow_admitted_streams", "Generation requests holding a slot", registry=registry).set_function(
        lambda: len(admission.active))
    Gauge("sparrow_admission_queue_length", "Generation requests waiting for a slot", registry=registry).set_function(
        lambda: admission.queued)
    rejected = Counter("sparrow_rejected_requests_total", "Requests refused by admission", ["reason"], registry=registry)
    admission.on_reject = lambda reason: rejected.labels(reason).inc()


__all__ = ["Admission", "StreamSlot", "TooManyRequestsError", "ShuttingDownError", "RequestTimeoutError",
           "guarded_stream", "guarded_call", "GuardedStreamingResponse", "install_admission", "client_key",
           "admission_of"]
