"""The fleet's default schedule, changed at run time for trainers that cannot name one per request
(slime main: its ``/generate`` payload has neither ``custom_params.sparrow_schedule`` nor
``extra_key``; see tests/server/test_trainer_compat.py for the payload's source). Fanned out by the client,
visible in each response's ``meta_info``, persisted across a restart, refused for unknown names."""
from __future__ import annotations

import httpx
import pytest

from helpers.live_server import live_server
from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.client import FleetError, set_default_schedule
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.registry import ScheduleRegistry

PROMPT = [(3 * i + 1) % (TINY_VOCAB - 1) + 1 for i in range(70)]
SPARSE = {"budgets_tokens": [48], "dense_layers": [0], "sink_pages": 1, "recent_pages": 1}
SLIME_PAYLOAD = {"input_ids": PROMPT, "return_logprob": True,
                 "sampling_params": {"temperature": 0.0, "max_new_tokens": 12, "no_stop_trim": True,
                                     "spaces_between_special_tokens": False, "skip_special_tokens": True}}


def make_app(model_dir, state_dir):
    registry = ScheduleRegistry.load(persist_dir=state_dir / "schedules")
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=2048)
    return create_app(engine, registry)


def slime_rollout(url: str) -> dict:
    r = httpx.post(f"{url}/generate", json=SLIME_PAYLOAD, timeout=60)
    r.raise_for_status()
    return r.json()


def test_fan_out_switches_the_fleet_and_survives_a_restart(model_dir, tmp_path, one_torch_thread):
    states = [tmp_path / "a", tmp_path / "b"]
    with live_server(make_app(model_dir, states[0])) as a, live_server(make_app(model_dir, states[1])) as b:
        urls = [a.url, b.url]
        dense = [slime_rollout(u) for u in urls]
        assert all(o["meta_info"]["sparrow"]["schedule"] == "dense" for o in dense)
        for u in urls:
            httpx.put(f"{u}/schedules/trainer-sparse", json=SPARSE, timeout=10).raise_for_status()
        replies = set_default_schedule(urls, "trainer-sparse")
        assert {r["name"] for r in replies.values()} == {"trainer-sparse"}
        assert all(r["previous"] == "dense" and r["persisted"] for r in replies.values())
        sparse = [slime_rollout(u) for u in urls]
        for after in sparse:
            assert after["meta_info"]["sparrow"]["schedule"] == "trainer-sparse"
            mean = after["meta_info"]["sparrow"]["kv_budget_tokens_mean"]
            assert mean < dense[0]["meta_info"]["sparrow"]["kv_budget_tokens_mean"]  # it really ran sparse
        with pytest.raises(FleetError):
            set_default_schedule(urls, "no-such-schedule")
        assert httpx.get(f"{a.url}/default_schedule").json()["name"] == "trainer-sparse"  # unchanged by the 404
    with live_server(make_app(model_dir, states[0])) as restarted:
        assert httpx.get(f"{restarted.url}/default_schedule").json()["name"] == "trainer-sparse"
        assert slime_rollout(restarted.url)["meta_info"]["sparrow"]["schedule"] == "trainer-sparse"
        reset = httpx.delete(f"{restarted.url}/default_schedule", timeout=10).json()
        assert reset["name"] == "dense" == reset["startup_default"]
        assert slime_rollout(restarted.url)["meta_info"]["sparrow"]["schedule"] == "dense"
    with live_server(make_app(model_dir, states[0])) as again:  # the reset is persisted too
        assert httpx.get(f"{again.url}/default_schedule").json()["name"] == "dense"


def test_an_engine_that_fixes_its_default_at_start_refuses_the_change(tmp_path):
    """The SGLang engine's schedulers read the default once: a change would only reach /rollout."""
    from helpers.fake_engine import FakeEngine
    from fastapi.testclient import TestClient

    engine = FakeEngine()
    engine.default_schedule_fixed_at_start = True
    with TestClient(create_app(engine, ScheduleRegistry.load(persist_dir=tmp_path / "schedules"))) as client:
        r = client.post("/default_schedule", json={"name": "dense"})
        assert r.status_code == 409 and "fix the default schedule" in r.json()["error"]["message"]
        assert client.delete("/default_schedule").status_code == 409
        assert client.get("/default_schedule").json()["name"] == "dense"
