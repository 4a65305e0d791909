"""Limits: body size (413), per-request bounds (422), concurrency slots and the bounded queue
(429 + Retry-After), timeouts, and slots freed by disconnects. Fake engine: no model needed."""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Callable

import httpx
import pytest
from fastapi.testclient import TestClient

from helpers.fake_engine import FakeEngine
from helpers.live_server import live_server, wait_until
from helpers.shifted_clock import ShiftedClock
from sparrow_server.server import admission as admission_module
from sparrow_server.server.admission import Admission, ShuttingDownError, TooManyRequestsError
from sparrow_server.server.app import create_app
from sparrow_server.server.limits import Limits

PROMPT = list(range(1, 9))


def app_with(limits: Limits, engine: FakeEngine | None = None):
    engine = engine or FakeEngine()
    return create_app(engine, limits=limits), engine


STALL_AFTER = 6  # tokens a StallingEngine sends before it holds a longer request


class StallingEngine(FakeEngine):
    """A ``FakeEngine`` (no token delay) that sends a request's first ``stall_after`` tokens at once and then
    nothing until the request is aborted: a longer request never ends on its own. ``on_stall()`` runs just
    before the last of those tokens goes out."""

    def __init__(self, stall_after: int, on_stall: Callable[[], None] = lambda: None):
        super().__init__()
        self.stall_after, self.on_stall = stall_after, on_stall

    async def before_token(self, request, i: int, aborted: asyncio.Event) -> None:
        if i == self.stall_after - 1 and request.sampling.max_new_tokens > self.stall_after:
            self.on_stall()
        if i == self.stall_after:
            await aborted.wait()


def rollout_body(**overrides):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    body.update(overrides)
    return body


def events_of(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: {")]


# ----- Limits itself --------------------------------------------------------------------------
def test_limits_validation_and_overrides():
    assert Limits.from_overrides(max_n=4, max_queue=None).max_n == 4
    assert Limits.from_overrides(max_queue=None).max_queue == Limits().max_queue
    for bad in ({"max_n": 0}, {"max_n": 65}, {"max_top_logprobs": 21}, {"max_body_bytes": 0},
                {"request_timeout_s": 0}, {"max_concurrent_streams": True}, {"max_prompt_tokens": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Limits(**bad)


# ----- body size --------------------------------------------------------------------------------
def test_body_too_large_413_declared_and_chunked():
    app, _ = app_with(Limits(max_body_bytes=2000))
    with TestClient(app) as client:
        big = rollout_body(input_ids=[1] * 1000)
        r = client.post("/rollout", json=big)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["type"] == "body_too_large" and "--max-body-bytes" in r.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            data = json.dumps(big).encode()
            for i in range(0, len(data), 500):
                yield data[i:i + 500]

        r = client.post("/rollout", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413, r.text
        assert client.post("/rollout", json=rollout_body()).status_code == 200
        r = client.put("/schedules/big", json={"budgets_tokens": [64] * 1000})
        assert r.status_code == 413


# ----- per-request bounds ---------------------------------------------------------------------
@pytest.mark.parametrize("body,field,value,flag", [
    (rollout_body(input_ids=[1] * 33), "input_ids", 33, "--max-prompt-tokens"),
    (rollout_body(sampling_params={"max_new_tokens": 17}), "sampling_params.max_new_tokens", 17, "--max-new-tokens-limit"),
    (rollout_body(n=3), "n", 3, "--max-n"),
    (rollout_body(top_logprobs=6), "top_logprobs", 6, "--max-top-logprobs"),
])
def test_request_bounds_422(body, field, value, flag):
    limits = Limits(max_prompt_tokens=32, max_new_tokens_limit=16, max_n=2, max_top_logprobs=5)
    app, _ = app_with(limits)
    with TestClient(app) as client:
        r = client.post("/rollout", json=body)
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert (error["type"], error["field"], error["value"], error["flag"]) == ("limit_exceeded", field, value, flag)
        assert field in error["message"] and str(value) in error["message"]
        at_limit = rollout_body(input_ids=[1] * 32, n=2, top_logprobs=5, sampling_params={"max_new_tokens": 16})
        assert client.post("/rollout", json=at_limit).status_code == 200


def test_generate_bounds_name_sglang_fields():
    app, _ = app_with(Limits(max_n=2, max_top_logprobs=1))
    with TestClient(app) as client:
        r = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"n": 3}})
        assert r.json()["error"]["field"] == "sampling_params.n"
        r = client.post("/generate", json={"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 2})
        assert r.json()["error"]["field"] == "top_logprobs_num"


# ----- Admission (unit, asyncio) --------------------------------------------------------------
def test_admission_fifo_queue_and_rejections():
    async def main():
        admission = Admission(Limits(max_concurrent_streams=2, max_queue=2, max_streams_per_client=3, retry_after_s=7))
        a = await admission.acquire("x")
        b = await admission.acquire("y")
        waiters = [asyncio.ensure_future(admission.acquire(c)) for c in ("x", "z")]
        await asyncio.sleep(0)
        assert admission.queued == 2 and not any(w.done() for w in waiters)
        with pytest.raises(TooManyRequestsError) as full:
            await admission.acquire("w")
        assert full.value.retry_after_s == 7 and "queued" in full.value.reason
        admission.release(a)
        admission.release(a)  # idempotent
        first = await waiters[0]  # FIFO: the oldest waiter gets the freed slot
        assert first.client == "x" and not waiters[1].done()
        admission.release(b)
        second = await waiters[1]
        admission.release(first)
        admission.release(second)
        await asyncio.sleep(0)
        assert len(admission.active) == 0 and admission.queued == 0 and not admission.per_client
        assert admission._granted == 0
        assert admission.rejected["queue_full"] == 1

    asyncio.run(main())


def test_admission_per_client_counts_queued_requests():
    async def main():
        admission = Admission(Limits(max_concurrent_streams=1, max_streams_per_client=2))
        held = await admission.acquire("x")
        waiting = asyncio.ensure_future(admission.acquire("x"))  # queued: counts against x
        await asyncio.sleep(0)
        with pytest.raises(TooManyRequestsError, match="client x has 2"):
            await admission.acquire("x")
        other = asyncio.ensure_future(admission.acquire("y"))  # another client may still queue
        await asyncio.sleep(0)
        assert admission.queued == 2 and admission.rejected["per_client"] == 1
        admission.release(held)
        admission.release(await waiting)
        admission.release(await other)
        assert admission._granted == 0 and not admission.per_client

    asyncio.run(main())


def test_admission_cancelled_and_timed_out_waiters_do_not_leak():
    async def main():
        admission = Admission(Limits(max_concurrent_streams=1, max_queue=4, request_timeout_s=0.05))
        held = await admission.acquire("a")
        cancelled = asyncio.ensure_future(admission.acquire("b"))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(TooManyRequestsError, match="no slot freed"):
            await admission.acquire("c")
        await asyncio.gather(cancelled, return_exceptions=True)
        admission.release(held)
        again = await admission.acquire("d")  # capacity not lost to the cancelled waiter
        admission.release(again)
        assert admission._granted == 0 and not admission.per_client and admission.queued == 0

    asyncio.run(main())


def test_admission_close_rejects_queued_and_new():
    async def main():
        admission = Admission(Limits(max_concurrent_streams=1))
        held = await admission.acquire("a")
        waiter = asyncio.ensure_future(admission.acquire("b"))
        await asyncio.sleep(0)
        admission.close()
        with pytest.raises(ShuttingDownError):
            await waiter
        with pytest.raises(ShuttingDownError):
            await admission.acquire("c")
        admission.release(held)
        assert admission._granted == 0 and not admission.per_client

    asyncio.run(main())


# ----- over real HTTP (uvicorn in a thread) -----------------------------------------------------
def open_stream(client: httpx.Client, body: dict):
    """Start a streaming rollout and read its first event; returns the open response.

    (A half-consumed line iterator closes the connection when collected: keep it on the response.)"""
    response = client.send(client.build_request("POST", "/rollout", json=body), stream=True)
    assert response.status_code == 200, response.read()
    response.lines = response.iter_lines()
    first = next(line for line in response.lines if line)
    assert json.loads(first[len("data: "):])["done"] is False
    return response


def long_body(tokens: int = 400) -> dict:
    return rollout_body(stream=True, sampling_params={"max_new_tokens": tokens, "temperature": 0})


def test_concurrency_queue_429_and_disconnect_frees_slots():
    limits = Limits(max_concurrent_streams=2, max_queue=1, max_streams_per_client=10, retry_after_s=3)
    app, engine = app_with(limits, StallingEngine(STALL_AFTER))  # open streams end only when their clients go
    admission = app.state.admission
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        streams = [open_stream(client, long_body()) for _ in range(2)]
        queued_result: dict = {}
        queued = threading.Thread(target=lambda: queued_result.update(
            r=httpx.post(f"{server.url}/rollout", json=rollout_body(), timeout=30)))
        queued.start()
        wait_until(lambda: admission.queued == 1, what="a queued request")
        r = client.post("/rollout", json=rollout_body())
        assert r.status_code == 429 and r.headers["retry-after"] == "3", r.text
        assert r.json()["error"]["type"] == "too_many_requests"
        streams[0].close()  # the client goes away: its slot passes to the queued request
        queued.join(10)
        assert queued_result["r"].status_code == 200 and queued_result["r"].json()["meta"]["completion_tokens"] == 4
        streams[1].close()
        wait_until(lambda: not admission.active and not engine.live, what="slots and engine requests freed")
        assert admission._granted == 0 and not admission.per_client
        metrics = client.get("/metrics").text
        assert 'sparrow_rejected_requests_total{reason="queue_full"} 1.0' in metrics
        assert "sparrow_admitted_streams 0.0" in metrics


def test_per_client_limit_429():
    app, _ = app_with(Limits(max_streams_per_client=1), StallingEngine(STALL_AFTER))
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        stream = open_stream(client, long_body())
        r = client.post("/generate", json={"input_ids": PROMPT})
        assert r.status_code == 429 and "--max-streams-per-client" in r.json()["error"]["message"]
        assert "retry-after" in r.headers
        stream.close()
        wait_until(lambda: not app.state.admission.active, what="slot freed")
        assert client.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}).status_code == 200


def test_request_timeout_ends_stream_with_error_event_and_504(monkeypatch):
    clock = ShiftedClock()
    monkeypatch.setattr(admission_module, "time", clock)
    # Streams: a 60 s timeout that passes (the clock jumps) as the engine sends its 6th token, after which
    # it sends nothing: the timeout ends each stream right after those 6 tokens, long before its 400.
    engine = StallingEngine(STALL_AFTER, on_stall=clock.jump)
    app = create_app(engine, limits=Limits(request_timeout_s=60))
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        events = events_of(client.post("/rollout", json=long_body()).text)
        assert events[-1]["done"] is True and events[-1]["error"]["type"] == "timeout"
        assert 3 < len(events) < 400
        assert len(events) == STALL_AFTER + 1 and not any(e["done"] for e in events[:-1])  # its 6 tokens, then the error
        with client.stream("POST", "/generate", json={"input_ids": PROMPT, "stream": True,
                                                      "sampling_params": {"max_new_tokens": 400}}) as s:
            lines = [line for line in s.iter_lines() if line]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["error"]["type"] == "timeout"
        assert len(lines) == STALL_AFTER + 2
        wait_until(lambda: not engine.live and not app.state.admission.active, what="timed-out requests aborted")
    # Non-streaming: the engine never finishes the request, so only the timeout (0.3 s, real time) ends it.
    engine = StallingEngine(STALL_AFTER)
    app = create_app(engine, limits=Limits(request_timeout_s=0.3))
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/rollout", json=rollout_body(sampling_params={"max_new_tokens": 400}))
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        # aborted: the engine would hold it forever
        wait_until(lambda: not engine.live and not app.state.admission.active, what="504 request aborted")
