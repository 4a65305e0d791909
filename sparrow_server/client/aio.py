"""Async client (httpx)."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable

import httpx

from sparrow_server.client.common import (
    DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_S, DEFAULT_URL, NDJSON, RETRYABLE_ERRORS, RETRYABLE_STATUS, RetryPolicy,
    generate_payload, parse_stream_line, raise_for_status, rollout_payload, score_payload, scored_logprobs,
)
from sparrow_server.client.types import RolloutEvent, RolloutResult, SparrowError, results_from_json


class AsyncSparrowClient:
    """``async with AsyncSparrowClient(url) as c: result = await c.rollout(input_ids=[...])``."""

    def __init__(self, base_url: str = DEFAULT_URL, timeout: float = DEFAULT_TIMEOUT_S, retry: RetryPolicy | None = None,
                 http: httpx.AsyncClient | None = None):
        self.retry = retry or RetryPolicy()
        self.http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)

    async def __aenter__(self) -> "AsyncSparrowClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.retry.retries + 1):
            last = attempt == self.retry.retries
            try:
                response = await self.http.request(method, path, json=body)
            except RETRYABLE_ERRORS:
                if last:
                    raise
            else:
                if response.status_code not in RETRYABLE_STATUS or last:
                    raise_for_status(response)
                    return response.json() if response.headers.get("content-type", "").startswith("application/json") else response.text
            await asyncio.sleep(self.retry.delay(attempt))
        raise AssertionError("unreachable")

    async def rollout(self, input_ids: list[int] | None = None, text: str | None = None, **kwargs: Any) -> RolloutResult | list[RolloutResult]:
        """Non-streaming rollout: a ``RolloutResult`` (a list of them when ``n > 1``)."""
        kwargs.pop("stream", None)
        results = results_from_json(await self._request("POST", "/rollout", rollout_payload(input_ids, text, **kwargs)))
        return results[0] if kwargs.get("n", 1) == 1 else results

    async def stream(self, input_ids: list[int] | None = None, text: str | None = None, ndjson: bool = False,
                     **kwargs: Any) -> AsyncIterator[RolloutEvent]:
        """Streamed rollout events (SSE, or NDJSON with ``ndjson=True``). Not retried once events flow."""
        kwargs.pop("stream", None)
        headers = {"accept": NDJSON} if ndjson else {}
        body = rollout_payload(input_ids, text, stream=True, **kwargs)
        async with self.http.stream("POST", "/rollout", json=body, headers=headers) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_status(response)
            async for line in response.aiter_lines():
                event = parse_stream_line(line)
                if event is not None:
                    yield RolloutEvent.from_json(event)

    async def rollout_batch(self, requests: Iterable[dict[str, Any]], concurrency: int = DEFAULT_CONCURRENCY,
                            return_exceptions: bool = False) -> list[Any]:
        """Run many rollouts (each a dict of ``rollout`` keyword arguments), at most ``concurrency`` at a time,
        in order. Connection errors are retried with the same ``rid``."""
        semaphore = asyncio.Semaphore(concurrency)

        async def one(kwargs: dict[str, Any]) -> Any:
            async with semaphore:
                return await self.rollout(**kwargs)

        return await asyncio.gather(*(one(dict(r)) for r in requests), return_exceptions=return_exceptions)

    async def generate(self, payload: dict[str, Any], schedule: str | None = None) -> dict[str, Any]:
        """SGLang ``/generate`` (non-streaming), schedule sent so that it survives the router (``generate_payload``)."""
        return await self._request("POST", "/generate", generate_payload(payload, schedule))

    async def score(self, prompt_ids: list[int], completion_ids: list[int], adapter: str | None = None) -> list[float]:
        """Logprobs of ``completion_ids`` after ``prompt_ids`` from one dense prefill (no decoding), at
        temperature 1, with ``adapter`` or the base model: the target policy's logprobs of a sparse rollout."""
        return scored_logprobs(await self.generate(score_payload(prompt_ids, completion_ids, adapter)))

    async def schedules(self) -> dict[str, Any]:
        return await self._request("GET", "/schedules")

    async def get_schedule(self, name: str) -> dict[str, Any]:
        return await self._request("GET", f"/schedules/{name}")

    async def put_schedule(self, name: str, schedule: dict[str, Any]) -> dict[str, Any]:
        return await self._request("PUT", f"/schedules/{name}", schedule)

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health")

    async def metrics(self) -> str:
        return await self._request("GET", "/metrics")


__all__ = ["AsyncSparrowClient", "SparrowError"]
