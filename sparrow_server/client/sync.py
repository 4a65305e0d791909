"""Synchronous client (httpx)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator

import httpx

from sparrow_server.client.common import (
    DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S, DEFAULT_URL, NDJSON, RETRYABLE_ERRORS, RETRYABLE_STATUS, RetryPolicy,
    generate_payload, parse_stream_line, raise_for_status, rollout_payload, score_payload, scored_logprobs,
)
from sparrow_server.client.types import RolloutEvent, RolloutResult, results_from_events, results_from_json


class SparrowClient:
    """``SparrowClient(url).rollout(input_ids=[...], schedule="qwen3-1.7b-0.86")``; also a context manager."""

    def __init__(self, base_url: str = DEFAULT_URL, timeout: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 http: httpx.Client | None = None):
        self.retry = retry or RetryPolicy()
        self.http = http or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)

    def __enter__(self) -> "SparrowClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.retry.retries + 1):
            last = attempt == self.retry.retries
            try:
                response = self.http.request(method, path, json=body)
            except RETRYABLE_ERRORS:
                if last:
                    raise
            else:
                if response.status_code not in RETRYABLE_STATUS or last:
                    raise_for_status(response)
                    return response.json() if response.headers.get("content-type", "").startswith("application/json") else response.text
            time.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable")

    def rollout(self, input_ids: list[int] | None = None, text: str | None = None, **kwargs: Any) -> RolloutResult | list[RolloutResult]:
        kwargs.pop("stream", None)
        results = results_from_json(self._request("POST", "/rollout", rollout_payload(input_ids, text, **kwargs)))
        return results[0] if kwargs.get("n", 1) == 1 else results

    def stream(self, input_ids: list[int] | None = None, text: str | None = None, ndjson: bool = False,
               **kwargs: Any) -> Iterator[RolloutEvent]:
        kwargs.pop("stream", None)
        headers = {"accept": NDJSON} if ndjson else {}
        body = rollout_payload(input_ids, text, stream=True, **kwargs)
        with self.http.stream("POST", "/rollout", json=body, headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                raise_for_status(response)
            for line in response.iter_lines():
                event = parse_stream_line(line)
                if event is not None:
                    yield RolloutEvent.from_json(event)

    def stream_result(self, input_ids: list[int] | None = None, text: str | None = None, **kwargs: Any) -> list[RolloutResult]:
        """Stream a rollout and assemble its samples."""
        return results_from_events(list(self.stream(input_ids, text, **kwargs)))

    def rollout_batch(self, requests: Iterable[dict[str, Any]], concurrency: int = DEFAULT_CONCURRENCY) -> list[Any]:
        """Many rollouts (dicts of ``rollout`` keyword arguments), ``concurrency`` at a time, results in order."""
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(lambda kwargs: self.rollout(**kwargs), [dict(r) for r in requests]))

    def generate(self, payload: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
        """SGLang ``/generate`` (non-streaming), schedule sent so that it survives the router (``generate_payload``)."""
        return self._request("POST", "/generate", generate_payload(payload, schedule))

    def score(self, prompt_ids: list[int], completion_ids: list[int], adapter: str | None = None) -> list[float]:
        """Logprobs of ``completion_ids`` after ``prompt_ids`` from one dense prefill (no decoding), at
        temperature 1, with ``adapter`` or the base model: the target policy's logprobs of a sparse rollout."""
        return scored_logprobs(self.generate(score_payload(prompt_ids, completion_ids, adapter)))

    def schedules(self) -> dict[str, Any]:
        return self._request("GET", "/schedules")

    def get_schedule(self, name: str) -> dict[str, Any]:
        return self._request("GET", f"/schedules/{name}")

    def put_schedule(self, name: str, schedule: dict[str, Any]) -> dict[str, Any]:
        return self._request("PUT", f"/schedules/{name}", schedule)

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def metrics(self) -> str:
        return self._request("GET", "/metrics")


__all__ = ["SparrowClient"]
