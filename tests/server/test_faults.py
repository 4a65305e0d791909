"""Faults: an engine exception ends only its own request (with an error event) and the server
keeps serving; graceful shutdown drains, aborts with a final event, refuses new work (503)."""
from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from helpers.fake_engine import FakeEngine, FaultyEngine
from helpers.live_server import LiveServer, live_server, wait_until
from helpers.shifted_clock import ShiftedClock
from helpers.tiny_models import load_plain, save_tiny_model
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server import shutdown
from sparrow_server.server.limits import Limits

PROMPT = list(range(1, 9))


def events_of(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: {")]


def body(rid: str, tokens: int = 12, stream: bool = True) -> dict:
    return {"input_ids": PROMPT, "rid": rid, "stream": stream, "sampling_params": {"max_new_tokens": tokens}}


def test_engine_exception_ends_only_that_stream():
    engine = FaultyEngine(FakeEngine(token_delay_s=0.01), should_fail=lambda r: r.rid.startswith("bad"), after_chunks=3)
    app = create_app(engine)
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        results: dict[str, httpx.Response] = {}

        def run(rid: str) -> None:
            results[rid] = httpx.post(f"{server.url}/rollout", json=body(rid), timeout=30)

        threads = [threading.Thread(target=run, args=(rid,)) for rid in ("good-0", "bad-0", "good-1", "good-2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for rid, response in results.items():
            assert response.status_code == 200
            events = events_of(response.text)
            assert events[-1]["done"] is True
            if rid.startswith("bad"):
                assert len(events) == 4 and events[-1]["error"]["type"] == "engine_error"
                assert "InjectedFault" in events[-1]["error"]["message"]
            else:
                assert "error" not in events[-1] and events[-1]["meta"]["completion_tokens"] == 12
        r = client.post("/rollout", json=body("bad-sync", stream=False))  # non-streaming: a JSON 500
        assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"
        with client.stream("POST", "/generate", json={"input_ids": PROMPT, "rid": "bad-gen", "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["error"]["type"] == "engine_error"
        assert client.post("/rollout", json=body("good-after", stream=False)).json()["meta"]["completion_tokens"] == 12
        assert client.get("/health").status_code == 200
        assert engine.faults == 3
        wait_until(lambda: not engine.live_requests() and not app.state.admission.active, what="everything freed")


@pytest.fixture(scope="module")
def reference_client(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    model_dir = save_tiny_model(tmp_path_factory.mktemp("model"))
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=2048)
    with TestClient(create_app(engine)) as client:
        yield client, engine
    torch.set_num_threads(previous)


POISON = 99  # a prompt starting with this token makes the injected prefill fail


def test_reference_engine_step_failure_is_contained(reference_client, monkeypatch):
    client, engine = reference_client
    real_prefill, real_decode = engine.runner.prefill, engine.runner.decode

    def prefill(prompt, adapter, ctx, **kw):
        if prompt[0] == POISON:
            raise RuntimeError("injected prefill failure")
        return real_prefill(prompt, adapter, ctx, **kw)

    failures = {"decode": 1}

    def decode(tokens, adapters, ctx):
        if failures["decode"]:
            failures["decode"] -= 1
            raise RuntimeError("injected decode failure")
        return real_decode(tokens, adapters, ctx)

    monkeypatch.setattr(engine.runner, "prefill", prefill)
    sampling = {"max_new_tokens": 4, "temperature": 0}
    r = client.post("/rollout", json={"input_ids": [POISON, 1, 2], "sampling_params": sampling})
    assert r.status_code == 200 and r.json()["meta"]["finish_reason"]["type"] == "error"
    assert r.json()["error"] == {"type": "engine_error", "message": "RuntimeError: injected prefill failure"}
    monkeypatch.setattr(engine.runner, "decode", decode)
    with client.stream("POST", "/rollout", json={"input_ids": [1, 2, 3], "stream": True, "sampling_params": sampling}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line]
    assert events[-1]["done"] and events[-1]["error"]["message"] == "RuntimeError: injected decode failure"
    ok = client.post("/rollout", json={"input_ids": [1, 2, 3], "sampling_params": sampling})  # still serving
    assert ok.status_code == 200 and ok.json()["meta"]["completion_tokens"] == 4 and "error" not in ok.json()
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["live_requests"] == 0 and health["free_pages"] == health["total_pages"]


class HeldEngine(FakeEngine):
    """A ``FakeEngine`` (no token delay) whose request ``rid`` stops after ``holds[rid]``'s token counts:
    after ``n`` tokens it waits for the ``threading.Event`` ``holds[rid][n]`` (or its abort). ``held[rid]``:
    how many tokens it had sent when it last stopped."""

    def __init__(self, holds: dict[str, dict[int, threading.Event]]):
        super().__init__()
        self.holds = holds
        self.held: dict[str, int] = {}

    async def before_token(self, request, i: int, aborted: asyncio.Event) -> None:
        hold = self.holds.get(request.rid, {}).get(i)
        if hold is not None:
            self.held[request.rid] = i
            while not (hold.is_set() or aborted.is_set()):
                await asyncio.sleep(0.005)


DRAIN_S = 600.0  # never reached in real time: the test moves the drain's clock (shutdown.time) past it


def test_graceful_shutdown_drains_then_aborts_with_a_final_event(monkeypatch):
    clock = ShiftedClock()
    monkeypatch.setattr(shutdown, "time", clock)
    go, never = threading.Event(), threading.Event()
    # "short" sends 1 token, "long" 5, and both wait until admission has closed; then "short" runs to
    # its end within the drain while "long" sends 10 more and stays running until the drain aborts it.
    engine = HeldEngine({"short": {1: go}, "long": {5: go, 15: never}})
    app = create_app(engine, limits=Limits(retry_after_s=2))
    server = LiveServer(app, drain_timeout_s=DRAIN_S).start()
    admission = app.state.admission
    out: dict = {}

    def long_stream() -> None:
        out["long"] = httpx.post(f"{server.url}/rollout", json=body("long", tokens=1000), timeout=60).text

    def short_request() -> None:
        out["short"] = httpx.post(f"{server.url}/rollout", json=body("short", tokens=60, stream=False), timeout=60)

    threads = [threading.Thread(target=long_stream), threading.Thread(target=short_request)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: engine.held == {"long": 5, "short": 1}, timeout_s=30, what="both requests running")
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        wait_until(lambda: admission.closed, what="admission closed")
        refused = httpx.post(f"{server.url}/rollout", json=body("late"), timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "2"
        assert refused.json()["error"]["type"] == "shutting_down"
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 503
        assert set(engine.live_requests()) == {"long", "short"}  # both in flight when the drain began
        go.set()  # the in-flight requests go on during the drain
        threads[1].join(30)
        assert out["short"].status_code == 200 and out["short"].json()["meta"]["completion_tokens"] == 60  # finished in the drain
        wait_until(lambda: engine.held.get("long") == 15, what="long streaming during the drain")
        assert server.thread.is_alive() and engine.live_requests() == ("long",)  # the drain still waits for it
    finally:
        go.set()
        clock.offset = DRAIN_S  # the drain's timeout passes: what is still running is aborted
    for t in threads:
        t.join(30)
    stopper.join(30)
    assert not server.thread.is_alive()
    events = events_of(out["long"])
    assert 10 < len(events) < 1000 and events[-1]["done"] is True and events[-1]["error"]["type"] == "shutdown"
    assert len(events) == 16 and all(not e["done"] for e in events[:-1])  # its 15 tokens, then the final event
    assert not engine.live_requests() and not admission.active
