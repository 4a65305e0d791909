"""The autopilot's evidence kind (exact acceptance vs the SGLang monitor's top-k lower bound).

The pure controller on scripted paired evidence (the same tokens read exactly and through a bound that
sits lower, as measured in ``benchmarks/results/autopilot/topk_bias/``): exact evidence settles inside
the band, bound evidence drives every bin to the ceiling; evidence of the other kind is refused and
counted. The server refuses a config whose kind differs from its verifier's (422 naming ``acceptance``),
records the kind in its evidence, and the fleet autopilot refuses records of the other kind. The
benchmark's per-k bounds from masks equal the stats functions (a brute-force check)."""
from __future__ import annotations

import sys

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from helpers.server_util import REPO
from helpers.tiny_models import load_plain, save_tiny_model
from sparrow_server.autopilot.controller import (
    EXACT_ACCEPTANCE,
    TOPK_BOUND_ACCEPTANCE,
    AutopilotConfig,
    AutopilotConfigError,
    BudgetController,
)
from sparrow_server.autopilot.fleet import FleetAutopilot
from sparrow_server.monitor import scoring
from sparrow_server.monitor.scoring import AcceptanceScores
from sparrow_server.monitor.verifier import VerificationJob
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.acceptance import (
    logits_to_topk, topk_acceptance_lower_bound, topk_acceptance_upper_bound,
)

sys.path.insert(0, str(REPO / "benchmarks" / "autopilot"))
import topk_bias  # noqa: E402

PAGE, RESERVED, BIN, N_BINS = 16, 3, 64, 5
TARGET, MARGIN, CEILING = 0.89, 0.03, 320
BOUND_GAP = 0.3  # the bound reads this much lower at p5 (0.22-0.66 measured on SmolLM2-135M)


def tokens_with_p5(p5: float, n: int) -> np.ndarray:
    u = np.linspace(0.0, 1.0, n)
    return np.clip(p5 + 0.2 * (u - 0.05), 0.0, 1.0)


def exact_p5(bin_index: int, budget: int) -> float:
    """A tail that falls with length over budget; dense (budget covers the bin) -> 1."""
    length = BIN * (bin_index + 1)
    return 1.0 if budget >= length else 1.0 - 0.16 * (length / budget - 1.0)


def run(kind: str, start: int, rounds: int = 80) -> BudgetController:
    """Feed the controller the plant's tokens for ``rounds`` rounds, read as ``kind``."""
    config = AutopilotConfig(TARGET, MARGIN, ceiling_tokens=CEILING, min_tokens=200, acceptance=kind)
    ctl = BudgetController(config, [start] * N_BINS, PAGE, RESERVED)
    gap = BOUND_GAP if kind == TOPK_BOUND_ACCEPTANCE else 0.0
    for _ in range(rounds):
        for b in range(N_BINS):
            values = tokens_with_p5(exact_p5(b, ctl.budgets[b]) - gap, 200)
            assert ctl.observe(ctl.budgets, values, [b] * 200, kind=kind) == 200
        ctl.step()
    return ctl


@pytest.mark.parametrize("start", [64, 320])
def test_exact_evidence_settles_in_the_band_and_bound_evidence_at_the_ceiling(start):
    exact = run(EXACT_ACCEPTANCE, start)
    for b, budget in enumerate(exact.budgets):
        p5 = exact_p5(b, budget)
        assert p5 >= TARGET - 0.02, (b, budget, p5)
        assert budget < CEILING or b == N_BINS - 1  # bins 0-3 hold below the ceiling on exact evidence
    # The same tokens through the bound: every bin raised to (or held at) the ceiling, and reported there.
    bound = run(TOPK_BOUND_ACCEPTANCE, start)
    assert bound.budgets == (CEILING,) * N_BINS
    assert bound.at_ceiling_below_target() == list(range(N_BINS))  # dense bins too: they read 1 - 0.3 = 0.7
    assert sum(bound.budgets) > sum(exact.budgets)


def test_evidence_of_the_other_kind_is_refused_and_counted():
    config = AutopilotConfig(TARGET, MARGIN, min_tokens=10)
    ctl = BudgetController(config, [64, 128], PAGE, RESERVED, weight_version="w1")
    assert ctl.observe([64, 128], np.full(50, 0.3), [1] * 50, "w2", "adapter-v1", kind=TOPK_BOUND_ACCEPTANCE) == 0
    assert ctl.refused_tokens == {TOPK_BOUND_ACCEPTANCE: 50}
    # Refused evidence neither fills a window nor switches the policy.
    assert ctl.evidence(1) is None and ctl.weight_version == "w1" and ctl.adapter is None
    assert ctl.step() == []
    assert ctl.observe([64, 128], np.full(50, 0.99), [1] * 50, "w1") == 50  # exact is the default kind
    assert ctl.state()["refused_tokens"] == {TOPK_BOUND_ACCEPTANCE: 50}
    assert ctl.state()["config"]["acceptance"] == EXACT_ACCEPTANCE


def test_acceptance_setting_is_checked():
    with pytest.raises(AutopilotConfigError) as err:
        AutopilotConfig(TARGET, acceptance="topk")
    assert err.value.field == "acceptance" and err.value.value == "topk"
    assert AutopilotConfig(TARGET, acceptance=TOPK_BOUND_ACCEPTANCE).to_dict()["acceptance"] == TOPK_BOUND_ACCEPTANCE


def test_the_monitor_names_its_kinds_with_the_autopilot_setting():
    assert (scoring.EXACT, scoring.TOPK_LOWER_BOUND) == (EXACT_ACCEPTANCE, TOPK_BOUND_ACCEPTANCE)


# ----- server ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model"))


def make_client(model_dir, state):
    from sparrow_server.engine.reference import ReferenceEngine
    from sparrow_server.server.app import create_app
    from sparrow_server.sparsity.registry import ScheduleRegistry

    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=1024)
    app = create_app(engine, ScheduleRegistry.load(persist_dir=state / "schedules"), verify_fraction=0.0,
                     autopilot_dir=state / "autopilot")
    return TestClient(app)


def test_the_server_steers_only_on_its_verifiers_kind(model_dir, tmp_path):
    with make_client(model_dir, tmp_path) as client:
        client.put("/schedules/ap", json={"budgets_tokens": [64, 64], "bin_tokens": 32, "dense_layers": [0]})
        pilot = {"target": 0.9, "min_tokens": 10}
        r = client.put("/schedules/ap/autopilot", json={**pilot, "acceptance": "topk"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "acceptance", r.text
        # The reference engine verifies exactly: a bound-kind config is refused, the default accepted.
        r = client.put("/schedules/ap/autopilot", json={**pilot, "acceptance": TOPK_BOUND_ACCEPTANCE})
        assert r.status_code == 422 and r.json()["error"]["field"] == "acceptance", r.text
        assert "'exact'" in r.json()["error"]["message"]
        assert client.put("/schedules/ap/autopilot", json=pilot).json()["config"]["acceptance"] == EXACT_ACCEPTANCE
        # A verifier that records the sparse top-k (SGLang) measures the bound: now the default is refused.
        service = client.app.state.service
        service.verifier.record_topk = 20
        r = client.put("/schedules/ap/autopilot", json=pilot)
        assert r.status_code == 422 and r.json()["error"]["field"] == "acceptance", r.text
        assert TOPK_BOUND_ACCEPTANCE in r.json()["error"]["message"]
        state = client.put("/schedules/ap/autopilot", json={**pilot, "acceptance": TOPK_BOUND_ACCEPTANCE}).json()
        assert state["config"]["acceptance"] == TOPK_BOUND_ACCEPTANCE
        # Its evidence counts; a rollout scored exactly (another kind) is refused, and both are in the evidence log.
        autopilot = client.app.state.autopilot
        schedule = service.schedules.get("ap")
        job = VerificationJob("r1", schedule, (1, 2, 3), tuple(range(4, 44)), 1.0)
        lengths = np.arange(40) + 3
        autopilot.on_verified(job, AcceptanceScores(np.full(40, 0.5), lengths, TOPK_BOUND_ACCEPTANCE))
        raised = client.get("/schedules/ap").json()  # p5 0.5 < 0.9: bin 1 raised (bin 0 is dense at 64 already)
        assert raised["version"] == 2 and raised["budgets_tokens"][1] > 64
        autopilot.on_verified(job, AcceptanceScores(np.full(40, 0.99), lengths, EXACT_ACCEPTANCE))
        assert client.get("/schedules/ap/autopilot").json()["refused_tokens"] == {EXACT_ACCEPTANCE: 40}
        records = autopilot.evidence("ap", 0)["records"]
        assert [r["kind"] for r in records] == [TOPK_BOUND_ACCEPTANCE, EXACT_ACCEPTANCE]


# ----- fleet -----------------------------------------------------------------------------------------
def test_the_fleet_autopilot_refuses_records_of_the_other_kind():
    schedule = Schedule(name="fl", budgets_tokens=(64, 64), bin_tokens=32, dense_layers=(0,)).to_dict()
    record = {"seq": 1, "schedule": "fl", "version": 1, "budgets_tokens": [64, 64], "bin_tokens": 32,
              "weight_version": None, "adapter": None, "acceptance": [0.5] * 40, "basis_lengths": list(range(3, 43))}
    records = [{**record, "kind": TOPK_BOUND_ACCEPTANCE}, {**record, "seq": 2}]  # the second: an older server, exact

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/schedules/fl":
            return httpx.Response(200, json=schedule)
        return httpx.Response(200, json={"next": 2, "records": records})

    pilot = FleetAutopilot(["http://a"], "fl", AutopilotConfig(0.9, min_tokens=1000))
    pilot._http = [httpx.Client(base_url="http://a", transport=httpx.MockTransport(handler))]
    try:
        pilot.poll()
    finally:
        pilot.close()
    assert pilot.controller.refused_tokens == {TOPK_BOUND_ACCEPTANCE: 40}
    assert sum(b["window_tokens"] for b in pilot.controller.state()["bins"]) == 40


# ----- the benchmark's bounds from masks -------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_benchmark_bounds_from_masks_equal_the_stats_functions(seed):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(16, 2500, generator=g, dtype=torch.float64) * 3
    sparse = dense + 1.5 * torch.randn(16, 2500, generator=g, dtype=torch.float64)
    rows = topk_bias.paired_row_stats(sparse, dense)
    for k in (20, 100, 500):  # the [T, k, k] tensors of the stats functions bound k here
        s, d = logits_to_topk(sparse, k), logits_to_topk(dense, k)
        np.testing.assert_allclose(rows[f"lower_{k}"], topk_acceptance_lower_bound(*s, *d).numpy(), atol=1e-12)
        np.testing.assert_allclose(rows[f"upper_{k}"], topk_acceptance_upper_bound(*s, *d).numpy(), atol=1e-12)
        assert (rows[f"lower_{k}"] <= rows["exact"] + 1e-12).all() and (rows[f"upper_{k}"] >= rows["exact"] - 1e-12).all()
