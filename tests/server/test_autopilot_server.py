"""The autopilot inside one server (tiny model, exact verification): it publishes new versions with their
evidence, requests finish on the version they were admitted on, versions and configs survive a restart,
bad settings get a 4xx naming the field, and the admin token guards the state-changing routes."""
from __future__ import annotations

import json
import threading

import pytest
import torch
from fastapi.testclient import TestClient

from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.monitor.scoring import AcceptanceScores
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.security import SecurityConfig
from sparrow_server.sparsity.registry import ScheduleRegistry

PROMPT = [(i * 7 + 3) % (TINY_VOCAB - 1) for i in range(40)]
NAME = "steered"
# 3 bins of 32 tokens; every budget is the smallest valid one (1 page + 3 reserved), far too tight for a
# target of 0.999 on a random tiny model: the autopilot has to raise.
SCHEDULE = {"budgets_tokens": [64, 64, 64], "bin_tokens": 32, "dense_layers": [0]}
PILOT = {"target": 0.999, "margin": 0.0005, "min_tokens": 30, "ceiling_tokens": 160}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def make_client(model_dir, state, security=None):
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=4096)
    schedules = ScheduleRegistry.load(persist_dir=state / "schedules")
    app = create_app(engine, schedules, verify_fraction=0.0, autopilot_dir=state / "autopilot", security=security)
    return TestClient(app)


def rollout(client, max_new_tokens=60, seed=0, **body):
    body = {"input_ids": PROMPT, "schedule": NAME, "verify": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0, "seed": seed, "ignore_eos": True},
            **body}
    r = client.post("/rollout", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def metric(client, name: str, **labels) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_autopilot_publishes_versions_with_evidence_and_survives_a_restart(model_dir, tmp_path):
    with make_client(model_dir, tmp_path) as client:
        assert client.put(f"/schedules/{NAME}", json=SCHEDULE).json()["version"] == 1
        state = client.put(f"/schedules/{NAME}/autopilot", json=PILOT).json()
        assert state["config"]["target"] == 0.999 and state["budgets_tokens"] == [64, 64, 64]
        first = rollout(client)
        assert first["meta"]["schedule_id"] == f"{NAME}@1"
        for seed in range(1, 4):
            rollout(client, seed=seed)
        current = client.get(f"/schedules/{NAME}").json()
        assert current["version"] > 1 and current["budgets_tokens"] != [64, 64, 64]
        assert current["budgets_tokens"] == sorted(current["budgets_tokens"])
        assert all(b % 16 == 0 and 64 <= b <= 160 for b in current["budgets_tokens"])
        history = client.get(f"/schedules/{NAME}/history").json()
        assert [v["version"] for v in history["versions"]] == list(range(1, current["version"] + 1))
        assert history["versions"][0]["source"] == "put"
        change = history["versions"][1]["changes"][0]
        assert change["reason"] == "raise" and change["old_tokens"] == 64 and change["new_tokens"] > 64
        assert change["evidence"]["n_tokens"] >= 30 and change["evidence"]["p5_high"] < 0.999
        assert client.get(f"/schedules/{NAME}@1").json()["budgets_tokens"] == [64, 64, 64]  # an older version
        assert metric(client, "sparrow_schedule_version", schedule=NAME) == current["version"]
        for b, tokens in enumerate(current["budgets_tokens"]):
            assert metric(client, "sparrow_schedule_budget_tokens", schedule=NAME, length_bin=str(b)) == tokens
        assert metric(client, "sparrow_autopilot_changes_total", schedule=NAME, reason="raise") >= 1
        assert metric(client, "sparrow_autopilot_active", schedule=NAME) == 1
        assert metric(client, "sparrow_autopilot_target", schedule=NAME) == 0.999
        latest = rollout(client, seed=9)
        assert latest["meta"]["schedule_id"] == f"{NAME}@{client.get(f'/schedules/{NAME}').json()['version']}"
        served = client.get(f"/schedules/{NAME}").json()
        pilot = client.get(f"/schedules/{NAME}/autopilot").json()
    with make_client(model_dir, tmp_path) as client:  # a restart on the same state directory
        assert client.get(f"/schedules/{NAME}").json() == served
        again = client.get(f"/schedules/{NAME}/history").json()
        assert again["versions"] == history["versions"] + [v for v in again["versions"][len(history["versions"]):]]
        assert again["versions"][-1]["schedule"] == served
        resumed = client.get(f"/schedules/{NAME}/autopilot").json()
        assert resumed["config"] == pilot["config"] and resumed["budgets_tokens"] == served["budgets_tokens"]
        assert client.delete(f"/schedules/{NAME}/autopilot").json() == {"schedule": NAME, "stopped": True}
        assert client.get(f"/schedules/{NAME}/autopilot").status_code == 404
    with make_client(model_dir, tmp_path) as client:  # stopping is persisted too
        assert client.get(f"/schedules/{NAME}/autopilot").status_code == 404


def test_a_request_finishes_on_the_version_it_was_admitted_on(model_dir, tmp_path):
    with make_client(model_dir, tmp_path) as client:
        client.put(f"/schedules/{NAME}", json={**SCHEDULE, "budgets_tokens": [64, 64, 64]})
        results: dict[str, dict] = {}
        started = threading.Event()

        def long_rollout():
            body = {"input_ids": PROMPT, "schedule": NAME, "stream": True,
                    "sampling_params": {"max_new_tokens": 120, "seed": 1, "ignore_eos": True}}
            with client.stream("POST", "/rollout", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                        event = json.loads(line[5:])
                        results.setdefault("old_budgets", set()).update(b for b in event["kv_budget_tokens"] if b)
                        if results["old_budgets"]:
                            started.set()  # decoding sparse steps of version 1
                        if event.get("done"):
                            results["old"] = event

        thread = threading.Thread(target=long_rollout)
        thread.start()
        assert started.wait(120)
        r = client.post(f"/schedules/{NAME}/versions", json={"version": 2, "budgets_tokens": [96, 128, 160]})
        assert r.status_code == 200 and r.json()["version"] == 2
        results["new"] = rollout(client, max_new_tokens=120, verify=False, seed=1)
        thread.join(300)
        old, new = results["old"], results["new"]
        assert old["meta"]["schedule_id"] == f"{NAME}@1" and new["meta"]["schedule_id"] == f"{NAME}@2"
        # KV tokens attended per step (the length while it fits the budget): version 1 caps them at 64 to the end
        assert max(results["old_budgets"]) == 64
        assert max(b for b in new["kv_budget_tokens"] if b) > 64  # version 2's budgets
        history = client.get(f"/schedules/{NAME}/history").json()["versions"]
        assert history[-1]["source"] == "fleet" and history[-1]["version"] == 2
        again = client.post(f"/schedules/{NAME}/versions", json={"version": 2, "budgets_tokens": [96, 128, 160]})
        assert again.status_code == 200  # the version already served: idempotent
        stale = client.post(f"/schedules/{NAME}/versions", json={"version": 2, "budgets_tokens": [96, 96, 96]})
        assert stale.status_code == 422 and stale.json()["error"]["field"] == "version"


def test_a_put_of_new_content_publishes_the_next_version(model_dir, tmp_path):
    with make_client(model_dir, tmp_path) as client:
        assert client.put(f"/schedules/{NAME}", json=SCHEDULE).json()["version"] == 1
        assert client.put(f"/schedules/{NAME}", json=SCHEDULE).json()["version"] == 1  # same content
        assert client.put(f"/schedules/{NAME}", json={**SCHEDULE, "budgets_tokens": [64, 80, 96]}).json()["version"] == 2
        assert [v["version"] for v in client.get(f"/schedules/{NAME}/history").json()["versions"]] == [1, 2]


def test_bad_settings_name_the_field_and_admin_routes_need_the_token(model_dir, tmp_path):
    with make_client(model_dir, tmp_path) as client:
        client.put(f"/schedules/{NAME}", json=SCHEDULE)
        for body, field in (({**PILOT, "target": 1.5}, "target"), ({**PILOT, "ceiling_tokens": 100}, "ceiling_tokens"),
                            ({**PILOT, "min_tokens": 0}, "min_tokens"), ({**PILOT, "floor_tokens": 200}, "floor_tokens"),
                            ({**PILOT, "retry_windows": -1}, "retry_windows")):
            r = client.put(f"/schedules/{NAME}/autopilot", json=body)
            assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
        r = client.put(f"/schedules/{NAME}/autopilot", json={**PILOT, "targt": 0.9})
        assert r.status_code == 422 and "targt" in r.text
        assert client.put("/schedules/dense/autopilot", json=PILOT).status_code == 422  # built-in
        assert client.put("/schedules/nope/autopilot", json=PILOT).status_code == 404
        assert client.get(f"/schedules/{NAME}/history").status_code == 200
    key = SecurityConfig(api_key="sekret")
    with make_client(model_dir, tmp_path, key) as client:
        assert client.put(f"/schedules/{NAME}/autopilot", json=PILOT).status_code == 401
        assert client.post(f"/schedules/{NAME}/versions", json={"version": 5, "budgets_tokens": [64, 64, 64]}).status_code == 401
        assert client.get("/autopilot/evidence").status_code == 401
        auth = {"Authorization": "Bearer sekret"}
        assert client.put(f"/schedules/{NAME}/autopilot", json=PILOT, headers=auth).status_code == 200
        r = client.post(f"/schedules/{NAME}/versions", json={"version": 5, "budgets_tokens": [64, 64, 64]}, headers=auth)
        assert r.status_code == 409  # the server's own autopilot steers it


def test_evidence_lists_verified_rollouts_after_a_cursor(model_dir, tmp_path):
    with make_client(model_dir, tmp_path) as client:
        client.put(f"/schedules/{NAME}", json=SCHEDULE)
        out = rollout(client, max_new_tokens=30)
        first = client.get("/autopilot/evidence", params={"schedule": NAME}).json()
        (record,) = first["records"]
        assert record["version"] == 1 and record["budgets_tokens"] == [64, 64, 64] and record["bin_tokens"] == 32
        assert len(record["acceptance"]) == len(out["token_ids"]) == len(record["basis_lengths"])
        assert record["basis_lengths"][0] == len(PROMPT)
        assert record["rid"] == out["rid"]  # joins the evidence to the response it verified
        rollout(client, max_new_tokens=30, seed=3)
        later = client.get("/autopilot/evidence", params={"schedule": NAME, "after": first["next"]}).json()
        assert [r["seq"] for r in later["records"]] == [first["next"] + 1]


def test_tokens_verified_on_new_weights_reset_the_evidence(model_dir, tmp_path):
    from types import SimpleNamespace

    import numpy as np

    with make_client(model_dir, tmp_path) as client:
        client.put(f"/schedules/{NAME}", json=SCHEDULE)
        client.put(f"/schedules/{NAME}/autopilot", json={**PILOT, "min_tokens": 1000})
        pilot = client.app.state.autopilot
        schedule = pilot.service.schedules.get(NAME)
        scores = AcceptanceScores(np.full(30, 0.5), np.arange(70, 100), "exact")  # bin 2

        def verified(weights):
            pilot.on_verified(SimpleNamespace(rid=f"r-{weights}", schedule=schedule, weight_version=weights, adapter=None), scores)
            return client.get(f"/schedules/{NAME}/autopilot").json()["bins"][2]["window_tokens"]

        start = client.get(f"/schedules/{NAME}/autopilot").json()["weight_version"]
        assert verified(start) == 30 and verified(start) == 60
        assert verified("step-2") == 30  # new weights: the old policy's 60 tokens are gone
        assert verified(start) == 30  # a late result on the replaced weights does not count
        assert client.get(f"/schedules/{NAME}/autopilot").json()["weight_version"] == "step-2"


def test_a_republished_adapter_resets_the_evidence(model_dir, tmp_path):
    """Requests name the alias; each resolves its adapter version at admission, and the autopilot keys its
    evidence on that version: a new version (distill --publish moves the alias) empties the windows, and a
    late result of a rollout admitted on the old version never counts."""
    from types import SimpleNamespace

    import numpy as np
    from test_adapter_lifecycle import make_adapter

    for i in (1, 2):
        make_adapter(tmp_path / "adapters" / f"d{i}", seed=i, fingerprint=None)  # (no base check)
    security = SecurityConfig(adapter_roots=(tmp_path / "adapters",))
    with make_client(model_dir, tmp_path / "state", security=security) as client:
        client.put(f"/schedules/{NAME}", json=SCHEDULE)
        client.put(f"/schedules/{NAME}/autopilot", json={**PILOT, "min_tokens": 10_000})
        pilot = client.app.state.autopilot

        def publish(version):
            assert client.post("/adapters", json={"name": version, "path": version}).status_code == 200
            assert client.put("/adapters/aliases/distill-latest", json={"name": version}).status_code == 200

        def window_tokens():
            state = client.get(f"/schedules/{NAME}/autopilot").json()
            return state["adapter"], sum(b["window_tokens"] for b in state["bins"])

        rollout(client, max_new_tokens=20)
        assert window_tokens() == (None, 20)
        publish("d1")
        rollout(client, max_new_tokens=20, adapter="distill-latest")
        rollout(client, max_new_tokens=20, seed=1, adapter="distill-latest")
        assert window_tokens() == ("d1", 40)  # the 20 tokens without the adapter are gone
        records = client.get("/autopilot/evidence", params={"schedule": NAME}).json()["records"]
        assert [r["adapter"] for r in records] == [None, "d1", "d1"]
        publish("d2")
        rollout(client, max_new_tokens=20, adapter="distill-latest")
        assert window_tokens() == ("d2", 20)
        schedule = pilot.service.schedules.get(NAME)
        late = AcceptanceScores(np.full(30, 0.5), np.arange(40, 70), "exact")
        pilot.on_verified(SimpleNamespace(rid="late", schedule=schedule, weight_version=None, adapter="d1"), late)
        assert window_tokens() == ("d2", 20)  # admitted on d1 before the republish: ignored
