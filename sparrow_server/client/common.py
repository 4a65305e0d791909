"""Shared pieces of the sync and async clients: payloads, retry policy, error decoding, SSE/NDJSON lines."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from sparrow_server.client.types import SparrowError

DEFAULT_URL = "http://127.0.0.1:30000"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF_S = 0.5
DEFAULT_CONCURRENCY = 8
NDJSON = "application/x-ndjson"
# Connection failures (nothing or an incomplete answer came back): safe to resend with the same rid.
RETRYABLE_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
RETRYABLE_STATUS = (409, 503)  # 409: the previous attempt with this rid is still being aborted


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = DEFAULT_RETRIES
    backoff_s: float = DEFAULT_BACKOFF_S

    def delay(self, attempt: int) -> float:
        return self.backoff_s * (2 ** attempt)


def rollout_payload(input_ids: list[int] | None = None, text: str | None = None, *, sampling_params: dict | None = None,
                    schedule: str | None = None, adapter: str | None = None, top_logprobs: int = 0, n: int = 1,
                    rid: str | None = None, stream: bool = False, **extra: Any) -> dict[str, Any]:
    """A ``/rollout`` body; a ``rid`` is always set so that retries are idempotent."""
    body: dict[str, Any] = {"sampling_params": dict(sampling_params or {}), "top_logprobs": top_logprobs, "n": n,
                            "rid": rid or uuid.uuid4().hex, "stream": stream, **extra}
    if input_ids is not None:
        body["input_ids"] = list(input_ids)
    if text is not None:
        body["text"] = text
    if schedule is not None:
        body["schedule"] = schedule
    if adapter is not None:
        body["adapter"] = adapter
    return body


def raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        message = body.get("detail") if isinstance(body, dict) else str(body)
    except (ValueError, json.JSONDecodeError):
        body, message = None, response.text
    raise SparrowError(response.status_code, str(message), body)


def parse_stream_line(line: str) -> dict[str, Any] | None:
    """A JSON event from an SSE ``data:`` line or an NDJSON line; None for blank lines and ``[DONE]``."""
    line = line.strip()
    if line.startswith("data:"):
        line = line[5:].strip()
    if not line or line == "[DONE]":
        return None
    return json.loads(line)
