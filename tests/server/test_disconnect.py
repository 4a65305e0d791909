"""Disconnects under concurrency: many clients drop their streams at once; within a bound the
reference engine holds no live request and no page, and every gauge and counter settles."""
from __future__ import annotations

import gc
import socket
import threading
import time
from typing import Callable

import httpx
import pytest

from helpers.fuzz_app import running_engine
from helpers.live_server import live_server, wait_until
from helpers.pause_util import continue_generation, pause_in_place, run_one_step_then_freeze
from sparrow_server.server.app import create_app

CLIENTS = 16
EVENTS_BEFORE_DROP = 2
# Bound on the engine's cleanup after the last client left: a handful of decode steps of a
# 16-request batch on a loaded 2-core box (one step is ~10 ms here), not the generations' length.
SETTLE_S = 3.0
# The same bound for the reference engine's requests, which the tests pin in place (paused after one
# decode step): there nothing can finish by length however long it takes, so this bound only catches
# an abort that never comes, and it is generous for a loaded CI box rather than a race.
FROZEN_SETTLE_S = 30.0


@pytest.fixture(autouse=True)
def no_cycle_collector():
    """Cleanup must not depend on the garbage collector finding a suspended generator in a cycle
    (that happens at some later time, or never): with it off, only deterministic cleanup counts."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory) as engine:
        yield engine


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _requests_total(text: str, endpoint: str, status: str | None = None) -> float:
    """``sparrow_requests_total`` of one endpoint (and one status, when given)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f'sparrow_requests_total{{endpoint="{endpoint}"') and (
                status is None or f'status="{status}"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _drop_after_events(url: str, path: str, body: dict, events: int, dropped: list,
                       before_drop: Callable[[], object] = lambda: None) -> None:
    with httpx.Client(base_url=url, timeout=60) as client, client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen += 1
                if seen >= events:
                    break
        before_drop()
        # leaving the block closes the connection with the rest of the stream unread
    dropped.append(time.monotonic())


@pytest.mark.parametrize("path", ["/rollout", "/generate"])
def test_sixteen_clients_drop_at_once(engine, path):
    """The requests are pinned (paused in place after their first decode step: nothing can finish by
    length, however slow the machine), every client has read its events, then all drop together:
    every request must be aborted, with no decode step run meanwhile."""
    app = create_app(engine)
    with live_server(app) as server:
        start, drop = threading.Barrier(CLIENTS), threading.Barrier(CLIENTS)
        dropped: list[float] = []

        def client(i: int) -> None:
            body = {"input_ids": [1 + i, 2, 3, 4], "stream": True,
                    "sampling_params": {"max_new_tokens": 200, "ignore_eos": True, "seed": i}}
            start.wait(30)
            _drop_after_events(server.url, path, body, EVENTS_BEFORE_DROP, dropped, lambda: drop.wait(60))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        pause_in_place(server.url)  # the requests queue, then start together
        try:
            for t in threads:
                t.start()
            run_one_step_then_freeze(engine, server.url, CLIENTS)  # two tokens each streamed, then frozen
            steps_at_freeze = engine.steps
            for t in threads:
                t.join(60)
            assert len(dropped) == CLIENTS
            wait_until(lambda: not engine.live_requests(), timeout_s=FROZEN_SETTLE_S, what="no live request")
            # aborted, not run out: paused in place, no decode step ran between the freeze and the cleanup
            assert engine.steps == steps_at_freeze
            health = engine.health()
            assert health.free_pages == health.total_pages
            wait_until(lambda: not app.state.admission.active, timeout_s=FROZEN_SETTLE_S, what="admission slots released")
            text = httpx.get(f"{server.url}/metrics", timeout=10).text
            assert _metric(text, "sparrow_adapter_inflight_requests") == 0
            assert _metric(text, "sparrow_admitted_streams") == 0
            assert _metric(text, "sparrow_running_requests") == 0
            endpoint = path.strip("/")
            assert _requests_total(text, endpoint) == CLIENTS, text
            assert _requests_total(text, endpoint, "aborted") == CLIENTS, text  # none finished by length
        finally:
            continue_generation(server.url)  # the engine is shared by the module's tests


def test_raw_socket_reset_mid_stream_aborts(engine):
    """A client that vanishes without reading (TCP reset) is noticed and aborted too."""
    app = create_app(engine)
    with live_server(app) as server:
        payload = (b'{"input_ids": [5, 6, 7], "stream": true, '
                   b'"sampling_params": {"max_new_tokens": 200, "ignore_eos": true}}')
        request = (b"POST /rollout HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        socks = []
        pause_in_place(server.url)  # the requests queue, then start together
        try:
            for _ in range(4):
                s = socket.create_connection(("127.0.0.1", server.port))
                s.sendall(request)
                socks.append(s)
            # all four live and streaming (two tokens each), then frozen: none can finish before the resets
            run_one_step_then_freeze(engine, server.url, 4)
            steps_at_freeze = engine.steps
            for s in socks:
                assert s.recv(64)  # the response started: the generation is live
            assert len(engine.live_requests()) == 4
            for s in socks:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
                s.close()
            wait_until(lambda: not engine.live_requests(), timeout_s=FROZEN_SETTLE_S, what="no live request after resets")
            assert engine.steps == steps_at_freeze  # aborted, not run out: no decode step ran meanwhile
            assert engine.health().free_pages == engine.health().total_pages
            wait_until(lambda: not app.state.admission.active, timeout_s=FROZEN_SETTLE_S, what="slots released")
            text = httpx.get(f"{server.url}/metrics", timeout=10).text
            assert _requests_total(text, "rollout", "aborted") == 4, text
        finally:
            for s in socks:
                s.close()
            continue_generation(server.url)  # the engine is shared by the module's tests


def test_sglang_engine_aborts_its_sglang_requests_when_clients_drop():
    """The SGLang engine's path: each dropped stream aborts its request in SGLang (the runtime's
    ``abort``), and the engine forgets it."""
    from helpers.fake_sglang import FakeRuntime
    from sparrow_server.sglang_plugin.frontend.engine import SGLangEngine

    runtime = FakeRuntime(chunk_tokens=1)
    runtime.token_delay_s = 0.02  # 200 tokens: 4 s if nobody aborted
    engine = SGLangEngine(runtime)
    app = create_app(engine)
    with live_server(app) as server:
        barrier = threading.Barrier(CLIENTS)
        dropped: list[float] = []

        def client(i: int) -> None:
            body = {"input_ids": [1 + i, 2, 3], "rid": f"drop-{i}", "stream": True,
                    "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
            barrier.wait(30)
            _drop_after_events(server.url, "/rollout", body, EVENTS_BEFORE_DROP, dropped)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(dropped) == CLIENTS
        wait_until(lambda: not engine.live_requests(), timeout_s=SETTLE_S, what="SGLang engine forgot every request")
        assert sorted(runtime.aborted) == sorted(f"drop-{i}" for i in range(CLIENTS))
        wait_until(lambda: not app.state.admission.active, timeout_s=SETTLE_S, what="admission slots released")
