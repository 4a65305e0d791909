"""Schedule search from a p5[budget][bin] table against a brute-force enumeration."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from sparrow_server.cost.model_shape import MODEL_PRESETS
from sparrow_server.cost.roofline import predicted_speedup
from sparrow_server.cost.search import (
    BIN_INFEASIBLE, BIN_NO_DATA, BIN_OK, BIN_RAISED, search_schedule, tables_from_bin_quantiles,
)
from sparrow_server.stats.tail import binned_quantiles
from sparrow_server.sparsity.schedule import ScheduleError

BUDGETS = [512, 1024, 2048, 4096]


def _table(rows):
    return {b: row for b, row in zip(BUDGETS, rows)}


def test_cheapest_budget_per_bin_and_running_max():
    p5 = _table([
        [0.90, 0.80, 0.70, 0.88],
        [0.95, 0.87, 0.80, 0.90],
        [0.97, 0.90, 0.86, 0.93],
        [0.99, 0.95, 0.90, 0.96],
    ])
    res = search_schedule(p5, 0.86, "found")
    assert res.schedule.budgets_tokens == (512, 1024, 2048, 2048)
    assert [b.status for b in res.bins] == [BIN_OK, BIN_OK, BIN_OK, BIN_RAISED]
    assert [b.cheapest_feasible for b in res.bins] == [512, 1024, 2048, 512]
    assert res.bins[3].statistic == 0.93  # p5 at the raised budget
    assert res.schedule.threshold == 0.86 and res.infeasible_bins == ()
    assert res.predicted_speedup is None


def test_lower_bounds_are_used_when_given():
    p5 = _table([[0.87], [0.90], [0.95], [0.97]])
    lb = _table([[0.84], [0.86], [0.93], [0.96]])
    assert search_schedule(p5, 0.86, "a").schedule.budgets_tokens == (512,)
    res = search_schedule(p5, 0.86, "b", lower_bounds=lb)
    assert res.schedule.budgets_tokens == (1024,) and res.bins[0].statistic == 0.86


def test_infeasible_and_missing_bins():
    nan = math.nan
    p5 = _table([
        [0.90, nan, 0.50, 0.70, nan, nan],
        [0.95, nan, 0.60, 0.80, nan, nan],
        [0.97, nan, 0.70, 0.87, nan, nan],
        [0.99, nan, 0.80, 0.90, nan, nan],
    ])
    res = search_schedule(p5, 0.86, "flagged")
    # trailing no-data bins are dropped; bin 1 takes bin 2's choice; bin 2 is infeasible -> largest
    assert res.schedule.budgets_tokens == (512, 4096, 4096, 4096)
    assert [b.status for b in res.bins] == [BIN_OK, BIN_NO_DATA, BIN_INFEASIBLE, BIN_RAISED]
    assert res.infeasible_bins == (2,)
    assert res.to_dict()["infeasible_bins"] == [2]


def _brute_force(values, threshold):
    """Enumerate all non-decreasing budget sequences in which every bin meets the threshold or
    has the largest budget; return the cheapest (it is unique and element-wise minimal)."""
    k, n = values.shape
    best = None
    for combo in itertools.product(range(k), repeat=n):
        if any(a > b for a, b in zip(combo, combo[1:])):
            continue
        if all(values[c, j] >= threshold or c == k - 1 for j, c in enumerate(combo)):
            if best is None or sum(combo) < sum(best):
                best = combo
    return tuple(BUDGETS[c] for c in best)


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_on_random_monotone_tables(seed):
    rng = np.random.default_rng(seed)
    n_bins = 5
    # p5 rises with budget and falls with length, plus noise (may break monotonicity in bins)
    base = 0.97 - 0.03 * np.arange(n_bins)[None, :] + 0.03 * np.arange(4)[:, None]
    values = np.clip(base + rng.normal(0, 0.03, (4, n_bins)), 0, 1)
    res = search_schedule({b: values[i] for i, b in enumerate(BUDGETS)}, 0.9, "r")
    assert res.schedule.budgets_tokens == _brute_force(values, 0.9)
    for choice in res.bins:  # every bin meets the threshold at its budget, or is flagged
        assert choice.statistic >= 0.9 or choice.status == BIN_INFEASIBLE


def test_speedup_report_and_validation():
    p5 = _table([[0.9, 0.8], [0.95, 0.9], [0.97, 0.95], [0.99, 0.97]])
    model = MODEL_PRESETS["qwen3-1.7b"]
    res = search_schedule(p5, 0.86, "x", model=model, prompt_len=100, gen_len=4000)
    assert res.predicted_speedup == pytest.approx(predicted_speedup(model, res.schedule, 100, 4000))
    with pytest.raises(ValueError, match="threshold"):
        search_schedule(p5, 0, "x")
    with pytest.raises(ValueError, match="same number of bins"):
        search_schedule({512: [0.9], 1024: [0.9, 0.8]}, 0.86, "x")
    with pytest.raises(ValueError, match="no bin"):
        search_schedule({512: [math.nan]}, 0.86, "x")
    with pytest.raises(ScheduleError, match="budgets_tokens"):
        search_schedule({500: [0.9]}, 0.86, "x")  # not a multiple of the page size


def test_raised_bin_must_meet_the_threshold_at_the_raised_budget():
    # bin 1: p5 is (noisily) not monotone in the budget; 1024 fails there, so it goes to 2048.
    p5 = _table([[0.70, 0.90], [0.90, 0.85], [0.95, 0.91], [0.99, 0.97]])
    res = search_schedule(p5, 0.86, "noisy")
    assert res.schedule.budgets_tokens == (1024, 2048)
    assert [b.status for b in res.bins] == [BIN_OK, BIN_RAISED]
    assert res.bins[1].cheapest_feasible == 512 and res.bins[1].statistic == 0.91


def test_end_to_end_from_pooled_tokens():
    # Synthetic calibration: acceptance improves with budget and degrades with length.
    rng = np.random.default_rng(11)
    per_budget = {}
    for i, budget in enumerate(BUDGETS):
        positions = rng.integers(0, 8000, 20_000)
        spread = 0.02 + 0.04 * (positions / 8000) / (1 + i)
        acceptance = np.clip(1 - rng.exponential(spread), 0, 1)
        per_budget[budget] = binned_quantiles(acceptance, positions, n_boot=50, seed=i)
    per_budget[512] = per_budget[512][:3]  # a budget measured on fewer bins
    p5, lower = tables_from_bin_quantiles(per_budget)
    assert len(p5[512]) == 4 and math.isnan(p5[512][3]) and math.isnan(lower[512][3])
    res = search_schedule(p5, 0.86, "cal", lower_bounds=lower)
    budgets = res.schedule.budgets_tokens
    assert list(budgets) == sorted(budgets) and len(budgets) == 4
    for choice in res.bins:
        assert choice.statistic >= 0.86 or choice.status == BIN_INFEASIBLE
