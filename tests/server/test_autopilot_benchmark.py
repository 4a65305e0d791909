"""benchmarks/autopilot/run.py's cost accounting counts what the server attends: the report's attended tokens
per decode step, recomputed from a rollout's lengths, equal the mean of the ``kv_budget_tokens`` the server
returned for it (the project's one definition, not ``min(budget, length)``)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
from fastapi.testclient import TestClient

from helpers.server_util import REPO
from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import budget_tokens, schedule_from_dict

_spec = importlib.util.spec_from_file_location("autopilot_benchmark_run", REPO / "benchmarks" / "autopilot" / "run.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PROMPT = [(i * 5 + 1) % (TINY_VOCAB - 1) for i in range(37)]  # ends mid-page: partial last pages occur
SCHEDULE = {"budgets_tokens": [64, 80, 96], "bin_tokens": 32, "dense_layers": [0]}


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_report_cost_equals_the_servers_kv_budget_tokens(model_dir, tmp_path):
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=4096)
    app = create_app(engine, ScheduleRegistry.load(persist_dir=tmp_path / "schedules"), verify_fraction=0.0)
    with TestClient(app) as client:
        assert client.put("/schedules/cost", json=SCHEDULE).status_code == 200
        body = {"input_ids": PROMPT, "schedule": "cost",
                "sampling_params": {"max_new_tokens": 90, "temperature": 1.0, "seed": 3, "ignore_eos": True}}
        res = client.post("/rollout", json=body).json()
        history = client.get("/schedules/cost/history").json()
    record = {"schedule_id": res["meta"]["schedule_id"], "prompt_tokens": len(PROMPT),
              "kv_budget_tokens": res["kv_budget_tokens"]}
    reported = [b for b in record["kv_budget_tokens"] if b is not None]
    assert len(reported) == 89  # every decode step; the prefill's token has none
    schedule = schedule_from_dict({"name": "cost", **SCHEDULE})
    lengths = bench.decode_lengths([record])
    assert bench.attended_cost(schedule, lengths) == pytest.approx(sum(reported) / len(reported))
    assert bench.recount_mismatches({"rollouts": [record], "history": {"cost": history}}) == 0
    # The old count, min(budget, length), is larger on sparse steps whose last page is partial.
    old = sum(min(budget_tokens(schedule, n), n) for n in lengths) / len(lengths)
    assert old > bench.attended_cost(schedule, lengths)


def test_only_steers_the_named_default_start():
    import argparse

    args = argparse.Namespace(start_budgets=None, bins=4, loose_tokens=256, only=[bench.TIGHT], publish_adapter=None)
    assert bench.plan_of(args) == {bench.TIGHT: [64, 64, 64, 64]}
    args.only = None
    assert bench.plan_of(args) == {bench.TIGHT: [64] * 4, bench.LOOSE: [256] * 4}
