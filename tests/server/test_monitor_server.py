"""Dense verification through the HTTP service: ``verify: true`` puts the exact acceptance p5/mean
in ``meta`` (checked against an independent scorer on a separate copy of the model), sampled
verification feeds only the metrics, unverified requests are not verified."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.monitor.scoring import HFScorer
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule

PROMPT = [(i * 5 + 2) % (TINY_VOCAB - 1) for i in range(40)]
SCHEDULE = Schedule(name="tiny-sparse", budgets_tokens=(64,), dense_layers=(0,), threshold=0.9)


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=4096)
    schedules = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("state") / "schedules")
    schedules.register(SCHEDULE)
    app = create_app(engine, schedules, verify_fraction=0.0)
    with TestClient(app) as c:
        yield c
    torch.set_num_threads(previous)


def metric(client, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def rollout(client, **body):
    body.setdefault("input_ids", PROMPT)
    body.setdefault("schedule", SCHEDULE.name)
    body.setdefault("sampling_params", {"max_new_tokens": 50, "temperature": 1.0, "seed": 7, "ignore_eos": True})
    r = client.post("/rollout", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_verify_true_puts_exact_acceptance_in_meta(client, model_dir):
    before = metric(client, "sparrow_verified_requests_total", schedule=SCHEDULE.name)
    out = rollout(client, verify=True)
    meta = out["meta"]
    expected = HFScorer(load_plain(model_dir, "eager")).exact(PROMPT, out["token_ids"], SCHEDULE, 1.0).acceptance
    assert meta["acceptance_kind"] == "exact" and meta["verified_tokens"] == len(out["token_ids"])
    assert meta["acceptance_p5"] == pytest.approx(float(np.quantile(expected, 0.05)), abs=1e-5)
    assert meta["acceptance_mean"] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert meta["acceptance_p5"] < 1.0  # 90 tokens under a 64-token budget: really sparse
    assert metric(client, "sparrow_verified_requests_total", schedule=SCHEDULE.name) == before + 1
    assert metric(client, "sparrow_acceptance_threshold", schedule=SCHEDULE.name) == 0.9
    assert metric(client, "sparrow_acceptance_count", schedule=SCHEDULE.name, length_bin="0") >= 50


def test_streamed_verified_rollout_carries_acceptance_on_its_last_event(client):
    import json

    with client.stream("POST", "/rollout", json={"input_ids": PROMPT, "schedule": SCHEDULE.name, "verify": True,
                                                 "stream": True, "sampling_params": {"max_new_tokens": 30, "seed": 1,
                                                                                     "ignore_eos": True}}) as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[-1]["done"] and 0.0 <= events[-1]["meta"]["acceptance_p5"] <= 1.0


def test_unverified_requests_are_not_verified(client):
    before = metric(client, "sparrow_verified_tokens_total", schedule=SCHEDULE.name)
    out = rollout(client)
    assert "acceptance_p5" not in out["meta"]
    assert metric(client, "sparrow_verified_tokens_total", schedule=SCHEDULE.name) == before


def test_sampled_verification_feeds_metrics_only(client):
    verifier = client.app.state.service.verifier
    before = metric(client, "sparrow_verified_tokens_total", schedule=SCHEDULE.name)
    verifier.sample_fraction = 1.0
    try:
        out = rollout(client)
    finally:
        verifier.sample_fraction = 0.0
    assert "acceptance_p5" not in out["meta"]  # sampled, not requested: the response does not wait
    deadline = time.monotonic() + 60
    while metric(client, "sparrow_verified_tokens_total", schedule=SCHEDULE.name) == before:
        assert time.monotonic() < deadline, "the background verification never finished"
        time.sleep(0.2)
    assert metric(client, "sparrow_verified_tokens_total", schedule=SCHEDULE.name) == before + len(out["token_ids"])


def test_serve_refuses_a_bad_verify_fraction(tmp_path, capsys):
    from sparrow_server.cli import main

    assert main(["serve", "--verify-fraction", "1.5", "--state-dir", str(tmp_path)]) == 2
    assert "--verify-fraction" in capsys.readouterr().err
