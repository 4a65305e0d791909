"""A killed (SIGKILL) server restarts with its registered schedules and its adapter registry
(versions and aliases); SIGTERM drains and exits.
The restarted server also runs with an API key (one subprocess start serves both checks): admin
and, under ``--require-auth-for-rollouts``, generation routes need it, and it is never logged.
Real ``serve`` subprocesses on a tiny random model."""
from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model

from helpers.server_util import ServerProcess
from helpers.tiny_models import save_tiny_model, tiny_model

pytestmark = pytest.mark.slow

SCHEDULE_A = {"budgets_tokens": [64, 128], "dense_layers": [0], "description": "survives kill -9"}
SCHEDULE_B = {"budgets_tokens": [96], "dense_layers": [1]}
KEY = "restart-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}


def make_adapter(directory):
    """A random (non-zero) PEFT LoRA for the tiny model."""
    torch.manual_seed(7)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(tiny_model(), lora).save_pretrained(str(directory))
    return directory


def load_adapter_with_alias(url: str) -> None:
    """Load ``crash-v1`` (a path relative to the adapter root) under the alias ``crash-latest``."""
    r = httpx.post(f"{url}/adapters", json={"name": "crash-v1", "path": "v1"}, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.put(f"{url}/adapters/aliases/crash-latest", json={"name": "crash-v1"}, timeout=30).status_code == 200


def check_adapters_restored(url: str) -> None:
    listing = httpx.get(f"{url}/adapters", timeout=30).json()
    assert "crash-v1" in json.dumps(listing["adapters"]) and listing["aliases"].get("crash-latest") == "crash-v1"
    body = {"input_ids": [1, 2, 3], "adapter": "crash-latest", "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(f"{url}/rollout", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["meta"]["adapter"] == "crash-v1", r.text


def check_auth(url: str) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/health").status_code == 200 and c.get("/schedules").status_code == 200  # reads stay open
        for path in ("/rollout", "/generate"):
            assert c.post(path, json=body).status_code == 401
            assert c.post(path, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
            assert c.post(path, json=body, headers=AUTH).status_code == 200
        assert c.put("/schedules/persist-b", json=SCHEDULE_B).status_code == 401
        assert c.put("/schedules/persist-b", json=SCHEDULE_B, headers={"Authorization": "Bearer " + KEY[:-1]}).status_code == 401
        assert c.put("/schedules/persist-b", json=SCHEDULE_B, headers=AUTH).status_code == 200


def test_kill_restart_restores_schedules_and_sigterm_drains(tmp_path, monkeypatch):
    model = save_tiny_model(tmp_path / "model")
    roots = ("--adapter-root", str(make_adapter(tmp_path / "adapters" / "v1").parent))
    state = tmp_path / "state"
    first = ServerProcess(model, state, *roots)
    try:
        assert httpx.put(f"{first.url}/schedules/persist-a", json=SCHEDULE_A, timeout=30).status_code == 200
        expected_a = httpx.get(f"{first.url}/schedules/persist-a", timeout=30).json()
        load_adapter_with_alias(first.url)
    finally:
        first.proc.kill()  # no shutdown code runs
        first.proc.wait(30)
        first.log.close()
    (state / "schedules" / ".persist-c.crash.tmp").write_text('{"name": "persist-c", "budg')  # a write cut by a crash

    monkeypatch.setenv("SPARROW_API_KEY", KEY)  # inherited by the server
    second = ServerProcess(model, state, *roots, "--drain-timeout-s", "0.5", "--require-auth-for-rollouts",
                           "--log-level", "info")
    try:
        assert httpx.get(f"{second.url}/schedules/persist-a", timeout=30).json() == expected_a
        check_adapters_restored(second.url)
        assert httpx.get(f"{second.url}/schedules/persist-c", timeout=30).status_code == 404
        check_auth(second.url)
        rollout = httpx.post(f"{second.url}/rollout", json={"input_ids": [1, 2, 3], "schedule": "persist-a",
                                                            "sampling_params": {"max_new_tokens": 3}}, headers=AUTH,
                             timeout=30)
        assert rollout.json()["meta"]["schedule"] == "persist-a"
        events: list[dict] = []
        started = threading.Event()

        def stream() -> None:
            body = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
            with httpx.stream("POST", f"{second.url}/rollout", json=body, headers=AUTH, timeout=60) as r:
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
    log = (state.parent / f"server-{second.port}.log").read_text()
    assert "API key set" in log and "POST /rollout" in log and KEY not in log  # access log on, key never in it
