"""The fidelity study's cost (benchmarks/fidelity/analyze.py): mean KV tokens a sparse layer attends per
generated token, counted as ``kv_budget_tokens``. Recounted on the committed rollouts it keeps the same-cost
fixed budgets the committed held-out comparisons were scored with (fidelity.md (c) and the long run)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "fidelity"))

import analyze  # noqa: E402
from sparrow_server.sparsity.schedule import Schedule, load_schedule  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "fidelity"


def test_mean_attended_counts_the_current_page_at_its_real_tokens():
    schedule = Schedule(name="s", budgets_tokens=(64,), page_size=16)
    # dense to 64 tokens, then 3 full pages + the current page's tokens (65 -> 49, 70 -> 54)
    assert analyze.mean_attended(schedule, np.array([61, 64, 65, 70])) == pytest.approx((61 + 64 + 49 + 54) / 4)


@pytest.mark.parametrize(("run", "rollouts", "budgets"), [
    (RESULTS, RESULTS, (64, 128, 192, 256)),
    (RESULTS / "fine", RESULTS, (64, 128, 160, 192, 224, 256)),
    (RESULTS / "long", RESULTS / "long", (128, 256)),
])
def test_recount_keeps_the_committed_same_cost_budget(run, rollouts, budgets):
    committed = json.loads((run / "calibration.json").read_text())
    held = [r for r in analyze.load(rollouts) if r["split"] == "heldout"]
    match = analyze.cost_match(load_schedule(run / "calibrated_schedule.json"), analyze.step_lengths(held), max(budgets))
    assert match["matched_budget"] == committed["matched_budget"]
    assert match["schedule_mean_attended"] < committed["schedule_mean_attended"]  # min(budget, L) over-counted
