"""Operational bounds of the service: every default defined once, in ``Limits``.

- ``max_body_bytes``: request bodies above it answer 413 before they are parsed
  (``BodySizeLimit``, an ASGI middleware that also counts chunked bodies).
- ``max_prompt_tokens``, ``max_new_tokens_limit``, ``max_n``, ``max_top_logprobs``: per-request
  bounds checked after validation; a request above one answers 422 naming the field, its value
  and the ``serve`` flag that sets the bound (``LimitExceededError``). ``None`` = only the
  model's own context length bounds it.
- ``max_streams_per_client``, ``max_concurrent_streams``, ``max_queue``, ``retry_after_s``,
  ``request_timeout_s``: admission and timeouts (``sparrow_server.server.admission``).
- ``drain_timeout_s``: how long a graceful shutdown lets streams finish before aborting them
  (``sparrow_server.server.shutdown``).

A "stream" is one in-flight generation request (``/rollout`` or ``/generate``, streaming or
not), whatever its ``n``: ``max_n`` bounds the sequences one request may add.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from sparrow_server.engine.base import MAX_TOP_LOGPROBS, InvalidRequestError
from sparrow_server.server.api_models import MAX_N
from sparrow_server.server.errors import error_response

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Bounds of one server (``serve`` flag of each field: ``--`` + the name with dashes)."""

    max_body_bytes: int = 16 * MIB
    max_prompt_tokens: int | None = None
    max_new_tokens_limit: int | None = None
    max_n: int = MAX_N
    max_generate_batch: int = 1024  # prompts in one batched /generate body
    max_top_logprobs: int = MAX_TOP_LOGPROBS
    max_streams_per_client: int = 256
    max_concurrent_streams: int = 512
    max_queue: int = 1024
    retry_after_s: int = 1
    request_timeout_s: float | None = 3600.0
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_generate_batch", "max_streams_per_client", "max_concurrent_streams",
                     "retry_after_s"):
            _check_int(name, getattr(self, name), 1)
        _check_int("max_queue", self.max_queue, 0)
        for name in ("max_prompt_tokens", "max_new_tokens_limit"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        _check_int("max_n", self.max_n, 1, MAX_N)
        _check_int("max_top_logprobs", self.max_top_logprobs, 0, MAX_TOP_LOGPROBS)
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s = {self.request_timeout_s!r}: must be > 0 (or None for no timeout)")
        if not self.drain_timeout_s >= 0:
            raise ValueError(f"drain_timeout_s = {self.drain_timeout_s!r}: must be >= 0")

    @classmethod
    def from_overrides(cls, **overrides: Any) -> "Limits":
        """``Limits`` with the non-``None`` overrides applied (how ``serve`` maps its flags)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in overrides.items() if v is not None and k in known})


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        bound = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} = {value!r}: must be an integer {bound}")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class LimitExceededError(InvalidRequestError):
    """A request field above a configured bound (HTTP 422, type ``limit_exceeded``)."""

    def __init__(self, field_name: str, value: Any, limit: int, limit_name: str):
        self.limit = limit
        self.limit_name = limit_name
        super().__init__(field_name, value, f"exceeds this server's limit {limit} ({flag(limit_name)})")


# Request field names per endpoint of: prompt, max_new_tokens, n, top logprobs.
FIELD_NAMES = {
    "rollout": ("input_ids", "sampling_params.max_new_tokens", "n", "top_logprobs"),
    "generate": ("input_ids", "sampling_params.max_new_tokens", "sampling_params.n", "top_logprobs_num"),
}


def check_request_limits(limits: Limits, prompt_tokens: int, max_new_tokens: int, n: int, top_logprobs: int,
                         endpoint: str = "rollout") -> None:
    """Raise ``LimitExceededError`` for the first bound a request exceeds."""
    names = FIELD_NAMES[endpoint]
    checks = (
        (prompt_tokens, limits.max_prompt_tokens, "max_prompt_tokens"),
        (max_new_tokens, limits.max_new_tokens_limit, "max_new_tokens_limit"),
        (n, limits.max_n, "max_n"),
        (top_logprobs, limits.max_top_logprobs, "max_top_logprobs"),
    )
    for field_name, (value, limit, limit_name) in zip(names, checks):
        if limit is not None and value > limit:
            raise LimitExceededError(field_name, value, limit, limit_name)


def check_rollout_limits(limits: Limits, rollout: Any) -> None:
    """``check_request_limits`` for a prepared ``service.Rollout`` (one engine request per sample)."""
    first = rollout.requests[0]
    check_request_limits(limits, len(first.input_ids), first.sampling.max_new_tokens, len(rollout.requests),
                         first.top_logprobs, rollout.endpoint if rollout.endpoint in FIELD_NAMES else "rollout")


class BodyTooLargeError(HTTPException):
    """Raised while the body is read (an ``HTTPException`` so FastAPI passes it on unchanged)."""

    def __init__(self, size: int, limit: int):
        self.size = size
        self.limit = limit
        message = f"request body of {size} bytes or more exceeds this server's limit {limit} ({flag('max_body_bytes')})"
        super().__init__(status_code=413, detail=message)


Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]


class BodySizeLimit:
    """ASGI middleware: 413 for bodies above ``limit`` bytes (``Content-Length`` checked up front,
    chunked bodies counted as they arrive)."""

    def __init__(self, app: Any, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _send_413(scope, receive, send, declared, self.limit)
            return
        seen = 0
        started = False

        async def counting_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLargeError(seen, self.limit)
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLargeError as exc:
            if started:
                raise
            await _send_413(scope, receive, send, exc.size, self.limit)


def _content_length(scope: dict) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _413(exc: BodyTooLargeError) -> JSONResponse:
    response = error_response(413, "body_too_large", exc.detail, limit=exc.limit)
    response.headers["Connection"] = "close"  # the unread rest of the body must not be parsed as a request
    return response


async def _send_413(scope: dict, receive: Receive, send: Send, size: int, limit: int) -> None:
    await _413(BodyTooLargeError(size, limit))(scope, receive, send)


async def _body_error(request: Request, exc: BodyTooLargeError) -> JSONResponse:
    return _413(exc)


async def _limit_error(request: Request, exc: LimitExceededError) -> JSONResponse:
    return error_response(422, "limit_exceeded", str(exc), field=exc.field, value=exc.value, limit=exc.limit,
                          flag=flag(exc.limit_name))


def install_limits(app: FastAPI, limits: Limits) -> None:
    """Body-size middleware and the 422 mapping of ``LimitExceededError`` (admission: ``install_admission``)."""
    app.state.limits = limits
    app.add_middleware(BodySizeLimit, limit=limits.max_body_bytes)
    app.add_exception_handler(LimitExceededError, _limit_error)
    app.add_exception_handler(BodyTooLargeError, _body_error)


__all__ = ["Limits", "LimitExceededError", "BodySizeLimit", "check_request_limits", "check_rollout_limits",
           "install_limits", "flag"]
