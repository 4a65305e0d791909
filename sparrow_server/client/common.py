"""Shared pieces of the sync and async clients: payloads, retry policy, error decoding, SSE/NDJSON lines."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from sparrow_server.client.types import SparrowError
from sparrow_server.sparsity import wire

DEFAULT_URL = "http://127.0.0.1:30000"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF_S = 0.5
DEFAULT_CONCURRENCY = 8
NDJSON = "application/x-ndjson"
# Connection failures (nothing or an incomplete answer came back): safe to resend with the same rid.
RETRYABLE_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
# 409: the previous attempt with this rid is still being aborted; 408/429/5xx: what SGLang's router
# retries on another worker (it answers with one once its own retries are spent, or a server is full).
RETRYABLE_STATUS = (408, 409, 429, 500, 502, 503, 504)


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


def generate_payload(payload: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
    """A non-streaming ``/generate`` body that works on a server and through SGLang's router: a ``rid``
    is always set (idempotent retries), and the schedule (``schedule``, else the payload's
    ``custom_params.sparrow_schedule``) goes both in ``sampling_params.custom_params``, which a
    server reads, and in ``extra_key`` as ``sparrow_schedule=NAME``, the only one the router keeps."""
    body: dict[str, Any] = {**payload, "stream": False}
    body["rid"] = body.get("rid") or uuid.uuid4().hex  # a batch's prompts become rid_0, rid_1, ... (SGLang's rule)
    given = body.get("sampling_params") or {}
    per_prompt = [dict(p or {}) for p in given] if isinstance(given, list) else [dict(given)]
    named = {(p.get("custom_params") or {}).get(wire.SCHEDULE_PARAM) for p in per_prompt}
    if schedule is None and named == {None}:
        return body
    if len(named - {None}) > 1:
        raise ValueError(f"sampling_params: names several schedules {sorted(named - {None})}; send one request per schedule")
    if schedule is not None and not named <= {None, schedule}:
        raise ValueError(f"sampling_params.custom_params.{wire.SCHEDULE_PARAM} = {named - {None, schedule}}: "
                         f"differs from schedule={schedule!r}")
    schedule = schedule if schedule is not None else (named - {None}).pop()
    key = wire.extra_key_for(schedule)
    if body.get("extra_key") not in (None, key):
        raise ValueError(f"extra_key = {body['extra_key']!r}: would be replaced by {key!r} (the schedule for the router)")
    stamped = [{**p, "custom_params": {**(p.get("custom_params") or {}), wire.SCHEDULE_PARAM: schedule}}
               for p in per_prompt]
    body["sampling_params"] = stamped if isinstance(given, list) else stamped[0]
    body["extra_key"] = key
    return body


def score_payload(prompt_ids: list[int], completion_ids: list[int], adapter: str | None = None) -> dict[str, Any]:
    """A prefill-only ``/generate`` body (SGLang's scoring request) whose answer holds the logprobs
    of ``completion_ids`` after ``prompt_ids``; read them with ``scored_logprobs``."""
    if not prompt_ids:
        raise ValueError("prompt_ids: must not be empty (the first token has nothing to be scored against)")
    body: dict[str, Any] = {"input_ids": list(prompt_ids) + list(completion_ids), "return_logprob": True,
                            "logprob_start_len": len(prompt_ids) - 1, "sampling_params": {"max_new_tokens": 0}}
    if adapter is not None:
        body["lora_path"] = adapter
    return body


def scored_logprobs(response: dict[str, Any]) -> list[float]:
    """The completion's logprobs from the answer to ``score_payload`` (its first entry is the prompt's last token)."""
    return [row[0] for row in response["meta_info"]["input_token_logprobs"][1:]]


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
