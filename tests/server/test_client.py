"""Client: retries keep the rid (idempotent), error decoding, stream parsing, typed results, helpers."""
from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from sparrow_server.client import (
    AsyncSparrowClient, RetryPolicy, RolloutResult, SparrowClient, SparrowError, acceptance_estimate,
    results_from_events, sampled_acceptance, truncated_importance_weights,
)
from sparrow_server.client.common import parse_stream_line

NO_WAIT = RetryPolicy(retries=3, backoff_s=0.0)


def result_json(rid: str, tokens=(5, 6)) -> dict:
    return {"index": 0, "rid": rid, "token_ids": list(tokens), "logprobs": [-0.5] * len(tokens),
            "kv_budget_tokens": [None] + [32] * (len(tokens) - 1), "done": True,
            "meta": {"rid": rid, "finish_reason": {"type": "length", "length": len(tokens)}, "prompt_tokens": 3,
                     "completion_tokens": len(tokens), "schedule": "dense", "adapter": None,
                     "kv_budget_tokens_mean": 32.0, "weight_version": "default"}}


class Flaky:
    """Fails the first ``failures`` calls with a connection error, then answers 409 once, then succeeds."""

    def __init__(self, failures: int, conflict: bool = True):
        self.failures, self.conflict, self.rids = failures, conflict, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.rids.append(body["rid"])
        if len(self.rids) <= self.failures:
            raise httpx.ConnectError("connection refused", request=request)
        if self.conflict:
            self.conflict = False
            return httpx.Response(409, json={"detail": "rid is already live"})
        return httpx.Response(200, json=result_json(body["rid"]))


def test_sync_retries_reuse_the_rid():
    handler = Flaky(failures=2)
    client = SparrowClient(http=httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x"), retry=NO_WAIT)
    result = client.rollout(input_ids=[1, 2, 3])
    assert isinstance(result, RolloutResult) and len(handler.rids) == 4 and len(set(handler.rids)) == 1
    assert result.rid == handler.rids[0] and result.meta.kv_budget_tokens_mean == 32.0


def test_retries_give_up_after_the_limit():
    handler = Flaky(failures=10)
    client = SparrowClient(http=httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x"), retry=NO_WAIT)
    with pytest.raises(httpx.ConnectError):
        client.rollout(input_ids=[1])
    assert len(handler.rids) == NO_WAIT.retries + 1


def test_async_batch_concurrency_and_order():
    active, peak = 0, 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        body = json.loads(request.content)
        return httpx.Response(200, json=result_json(body["rid"], tokens=body["input_ids"]))

    async def main():
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x")
        async with AsyncSparrowClient(http=http, retry=NO_WAIT) as c:
            return await c.rollout_batch([{"input_ids": [i]} for i in range(10)], concurrency=3)

    results = asyncio.run(main())
    assert [r.token_ids for r in results] == [[i] for i in range(10)] and peak <= 3


def test_http_errors_are_typed():
    def handler(request):
        return httpx.Response(404, json={"error": {"type": "unknown_schedule", "name": "x"}, "detail": "unknown schedule 'x'"})

    client = SparrowClient(http=httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x"), retry=NO_WAIT)
    with pytest.raises(SparrowError) as e:
        client.rollout(input_ids=[1], schedule="x")
    assert e.value.status == 404 and "unknown schedule 'x'" in str(e.value) and e.value.body["error"]["name"] == "x"


def test_stream_parsing_and_assembly():
    events = [
        {"index": 0, "rid": "r", "token_ids": [1], "logprobs": [-0.1], "kv_budget_tokens": [None], "done": False, "text": "a"},
        {"index": 0, "rid": "r", "token_ids": [2, 3], "logprobs": [-0.2, -0.3], "kv_budget_tokens": [48, 64],
         "done": True, "text": "bc", "meta": result_json("r")["meta"]},
    ]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events)

    def handler(request):
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    client = SparrowClient(http=httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x"))
    result, = results_from_events(list(client.stream(input_ids=[9])))
    assert result.token_ids == [1, 2, 3] and result.logprobs == [-0.1, -0.2, -0.3] and result.text == "abc"
    assert result.kv_budget_tokens == [None, 48, 64] and result.meta.schedule == "dense"
    assert parse_stream_line("data: [DONE]") is None and parse_stream_line("") is None
    assert parse_stream_line('{"a": 1}') == {"a": 1}


def test_importance_weight_and_acceptance_helpers():
    dense, sparse = [-1.0, -0.5, -3.0], [-1.2, -0.5, -1.0]
    assert truncated_importance_weights(dense, sparse, cap=2.0) == pytest.approx([min(math.exp(0.2), 2.0), 1.0, math.exp(-2.0)])
    assert truncated_importance_weights([0.0], [-5.0], cap=2.0) == [2.0]
    assert sampled_acceptance(dense, sparse) == pytest.approx([1.0, 1.0, math.exp(-2.0)])
    assert acceptance_estimate(dense, sparse) == pytest.approx((2 + math.exp(-2.0)) / 3)
    with pytest.raises(ValueError):
        truncated_importance_weights([0.0], [0.0, 1.0], cap=1.0)
