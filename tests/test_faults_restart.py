"""A killed (SIGKILL) server restarts with its registered schedules; SIGTERM drains and exits 0.
Real ``serve`` subprocesses on a tiny random model."""
from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from helpers.server_util import ServerProcess
from helpers.tiny_models import save_tiny_model

pytestmark = pytest.mark.slow

SCHEDULE_A = {"budgets_tokens": [64, 128], "dense_layers": [0], "description": "survives kill -9"}
SCHEDULE_B = {"budgets_tokens": [96], "dense_layers": [1]}


def test_kill_restart_restores_schedules_and_sigterm_drains(tmp_path):
    model = save_tiny_model(tmp_path / "model")
    state = tmp_path / "state"
    first = ServerProcess(model, state)
    try:
        assert httpx.put(f"{first.url}/schedules/persist-a", json=SCHEDULE_A, timeout=30).status_code == 200
        expected_a = httpx.get(f"{first.url}/schedules/persist-a", timeout=30).json()
    finally:
        first.proc.kill()  # no shutdown code runs
        first.proc.wait(30)
        first.log.close()
    (state / "schedules" / ".persist-c.crash.tmp").write_text('{"name": "persist-c", "budg')  # a write cut by a crash

    second = ServerProcess(model, state, "--drain-timeout-s", "0.5")
    try:
        assert httpx.get(f"{second.url}/schedules/persist-a", timeout=30).json() == expected_a
        assert httpx.get(f"{second.url}/schedules/persist-c", timeout=30).status_code == 404
        assert httpx.put(f"{second.url}/schedules/persist-b", json=SCHEDULE_B, timeout=30).status_code == 200
        rollout = httpx.post(f"{second.url}/rollout", json={"input_ids": [1, 2, 3], "schedule": "persist-a",
                                                            "sampling_params": {"max_new_tokens": 3}}, timeout=30)
        assert rollout.json()["meta"]["schedule"] == "persist-a"
        events: list[dict] = []
        started = threading.Event()

        def stream() -> None:
            body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
            with httpx.stream("POST", f"{second.url}/rollout", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        second.proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert second.proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    finally:
        second.stop()
    last = events[-1]
    assert last["done"] is True
    assert last.get("error", {}).get("type") == "shutdown" or last["meta"]["finish_reason"]["type"] == "length"
    assert "persist-b.json" in {p.name for p in (state / "schedules").iterdir()}
