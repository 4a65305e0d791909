"""The autopilot's controller against scripted acceptance: raises, lowers, holds, bounds, monotonicity,
the evidence window, weight updates, convergence from both sides, and a hypothesis property test."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparrow_server.autopilot.controller import (
    FOLLOW,
    LOWER,
    RAISE,
    TRIM,
    AutopilotConfig,
    AutopilotConfigError,
    BudgetController,
    quantile_interval,
)

PAGE = 16
RESERVED = 3  # 1 sink + 2 recent pages
BIN = 64
N_BINS = 6
TARGET, MARGIN = 0.89, 0.03


def tokens_with_p5(p5: float, n: int) -> np.ndarray:
    """n acceptance values whose 5th percentile is ``p5`` (a spread of 0.2 around it, clipped to [0, 1])."""
    u = np.linspace(0.0, 1.0, n)
    return np.clip(p5 + 0.2 * (u - 0.05), 0.0, 1.0)


def plant_p5(bin_index: int, budget: int) -> float:
    """A model whose tail falls with length over budget (like fidelity.md's table): dense -> 1."""
    length = BIN * (bin_index + 1)
    return 1.0 if budget >= length else 1.0 - 0.16 * (length / budget - 1.0)


def feed(ctl: BudgetController, n_per_bin: int, p5_of=plant_p5, weight_version: str | None = None) -> None:
    for b in range(len(ctl.budgets)):
        ctl.observe(ctl.budgets, tokens_with_p5(p5_of(b, ctl.budgets[b]), n_per_bin), [b] * n_per_bin, weight_version)


def make(budgets, bin_tokens=None, **cfg) -> BudgetController:
    config = AutopilotConfig(**{"target": TARGET, "margin": MARGIN, "min_tokens": 200, **cfg})
    return BudgetController(config, budgets, PAGE, RESERVED, bin_tokens=bin_tokens)


def test_quantile_interval_brackets_the_quantile_and_narrows_with_tokens():
    rng = np.random.default_rng(0)
    small, large = rng.beta(8, 1, 200), rng.beta(8, 1, 20_000)
    p5, lo, hi = quantile_interval(small, 0.05, 0.9)
    assert lo <= p5 <= hi and lo < hi
    p5_l, lo_l, hi_l = quantile_interval(large, 0.05, 0.9)
    assert lo_l <= p5_l <= hi_l and hi_l - lo_l < hi - lo
    true = np.quantile(rng.beta(8, 1, 2_000_000), 0.05)
    assert lo_l <= true <= hi_l


def test_raises_fast_when_the_upper_bound_is_below_target():
    ctl = make([64] * N_BINS)
    feed(ctl, 200)
    changes = {c.bin_index: c for c in ctl.step()}
    assert changes[1].reason == RAISE and changes[1].new_tokens == 96  # 64 x 1.5: bin 1 (64-127) is sparse at 64
    ev = changes[1].evidence
    assert ev.n_tokens == 200 and ev.p5_high < TARGET and ev.budget_tokens == 64
    assert 0 not in changes and ctl.budgets[0] == 64  # bin 0 is dense at 64 (p5 = 1) but already at the floor
    assert all(changes[b].reason in (RAISE, FOLLOW) and changes[b].new_tokens >= 96 for b in range(2, N_BINS))


def test_lowers_one_page_at_a_time_when_the_lower_bound_clears_the_margin():
    ctl = make([512] * N_BINS)
    feed(ctl, 200)
    changes = ctl.step()
    assert [c.new_tokens for c in changes] == [512 - PAGE] * N_BINS
    assert all(c.reason == LOWER and c.evidence.p5_low > TARGET + MARGIN for c in changes)


def test_holds_inside_the_band_and_before_enough_tokens():
    ctl = make([240] * N_BINS)
    feed(ctl, 199, p5_of=lambda b, budget: 0.90)
    assert ctl.step() == []  # 199 < min_tokens
    feed(ctl, 1000, p5_of=lambda b, budget: 0.90)
    assert ctl.step() == []  # inside [target, target + margin]
    assert ctl.budgets == (240,) * N_BINS


def test_a_raise_carries_later_bins_and_a_lower_stops_at_the_bin_before():
    ctl = make([128, 128, 160, 160, 176, 176])
    p5 = {0: 1.0, 1: 0.5, 2: 0.9, 3: 0.9, 4: 0.9, 5: 0.99}
    feed(ctl, 300, p5_of=lambda b, budget: p5[b])
    changes = {c.bin_index: c for c in ctl.step()}
    assert changes[1].reason == RAISE and changes[1].new_tokens == 192
    assert changes[2].reason == FOLLOW and changes[2].evidence is None and changes[2].new_tokens == 192
    assert changes[4].new_tokens == 192 and changes[5].new_tokens == 192  # bin 5 wanted lower: not below bin 4
    assert list(ctl.budgets) == sorted(ctl.budgets)


def test_respects_floor_and_ceiling_and_reports_a_starved_ceiling():
    ctl = make([256] * N_BINS, floor_tokens=96, ceiling_tokens=320)
    feed(ctl, 250, p5_of=lambda b, budget: 0.5 if b == 5 else 1.0)
    for _ in range(20):
        ctl.step()
        feed(ctl, 250, p5_of=lambda b, budget: 0.5 if b == 5 else 1.0)
    assert ctl.budgets[0] == 96 and ctl.budgets[5] == 320
    assert ctl.at_ceiling_below_target() == [5]
    with pytest.raises(AutopilotConfigError) as err:
        make([256], ceiling_tokens=100)  # not a page multiple
    assert err.value.field == "ceiling_tokens"
    with pytest.raises(AutopilotConfigError) as err:
        make([256], floor_tokens=48)  # does not exceed the reserved pages
    assert err.value.field == "floor_tokens"


def test_a_changed_bin_starts_a_new_window():
    ctl = make([512] * N_BINS)
    feed(ctl, 200)
    assert ctl.step()
    assert ctl.step() == []  # no new tokens since the change: nothing to decide on
    ctl.observe([512] * N_BINS, tokens_with_p5(1.0, 500), [0] * 500)  # old version's budgets: ignored
    assert ctl.evidence(0) is None


def test_a_new_weight_version_resets_the_evidence_and_old_samples_are_ignored():
    ctl = make([512] * N_BINS)
    feed(ctl, 150, weight_version="w1")
    feed(ctl, 150, weight_version="w2")  # new weights: the 150 tokens of w1 are gone
    assert ctl.step() == [] and ctl.evidence(0).n_tokens == 150
    feed(ctl, 100, weight_version="w1")  # late results scored on w1
    assert ctl.evidence(0).n_tokens == 150
    feed(ctl, 50, weight_version="w2")
    assert len(ctl.step()) == N_BINS


def test_a_new_adapter_version_resets_the_evidence_and_retired_versions_are_ignored():
    ctl = make([512] * N_BINS)
    feed(ctl, 150)  # no adapter
    ctl.observe(ctl.budgets, tokens_with_p5(0.5, 120), [0] * 120, adapter="d1")  # a DistillSparse adapter published
    assert ctl.adapter == "d1" and ctl.evidence(0).n_tokens == 120 and ctl.evidence(1) is None
    assert ctl.observe(ctl.budgets, tokens_with_p5(1.0, 80), [0] * 80) == 0  # late result of a rollout without it
    ctl.observe(ctl.budgets, tokens_with_p5(0.9, 60), [0] * 60, adapter="d2")  # republished
    assert ctl.evidence(0).n_tokens == 60
    assert ctl.observe(ctl.budgets, tokens_with_p5(0.5, 90), [0] * 90, adapter="d1") == 0
    assert ctl.evidence(0).n_tokens == 60 and ctl.state()["adapter"] == "d2"


def test_a_failed_budget_is_forgotten_under_a_new_adapter():
    """The adapter's gain can make a budget that failed before hold: the controller may lower to it again."""
    ctl = make([128] * N_BINS)
    feed(ctl, 200, p5_of=lambda b, budget: 0.5 if budget <= 128 else 0.99)
    assert [c.reason for c in ctl.step()] == ["raise"] * N_BINS and ctl.state()["bins"][0]["failed_tokens"] == 128
    raised = ctl.budgets
    for _ in range(20):
        for b in range(N_BINS):
            ctl.observe(ctl.budgets, tokens_with_p5(0.99, 200), [b] * 200, adapter="d1")
        ctl.step()
    assert ctl.state()["bins"][0]["failed_tokens"] is None
    assert max(ctl.budgets) < 128 < min(raised)


@pytest.mark.parametrize("start", [64, 512])
def test_converges_into_the_band_from_too_tight_and_too_loose(start):
    ctl = make([start] * N_BINS)
    for _ in range(80):
        feed(ctl, 200)
        ctl.step()
    for b, budget in enumerate(ctl.budgets):
        assert TARGET <= plant_p5(b, budget) <= TARGET + MARGIN or budget == ctl.floor, (b, budget, plant_p5(b, budget))
        # the cheapest page multiple that holds the target, or one page above it
        cheapest = next(c for c in range(ctl.floor, 4096, PAGE) if plant_p5(b, c) >= TARGET)
        assert budget - max(cheapest, ctl.budgets[b - 1] if b else 0) <= PAGE
    assert list(ctl.budgets) == sorted(ctl.budgets)


def test_a_bin_without_tokens_is_trimmed_to_dense_and_does_not_block_lowering():
    # Bin 0 (lengths 0-63) never gets tokens (prompts are longer); 320 there is dense like 64 is.
    ctl = make([320] * N_BINS, bin_tokens=BIN)
    for b in range(1, N_BINS):
        ctl.observe(ctl.budgets, tokens_with_p5(1.0, 200), [b] * 200)
    changes = {c.bin_index: c for c in ctl.step()}
    assert changes[0].reason == TRIM and changes[0].new_tokens == 64 and changes[0].evidence is None
    assert changes[1].reason == LOWER and changes[1].new_tokens == 128  # lowered to 304, trimmed to dense-equivalent
    assert changes[4].reason == LOWER and changes[4].new_tokens == 304
    assert ctl.budgets == (64, 128, 192, 256, 304, 304)
    without = make([320] * N_BINS)  # without bin widths nothing can be trimmed: the empty bin 0 blocks bin 1
    for b in range(1, N_BINS):
        without.observe(without.budgets, tokens_with_p5(1.0, 200), [b] * 200)
    assert without.step() == []


def test_config_names_the_bad_field():
    for kwargs, name in (({"target": 1.5}, "target"), ({"target": 0.9, "margin": -0.1}, "margin"),
                         ({"target": 0.9, "min_tokens": 0}, "min_tokens"),
                         ({"target": 0.9, "raise_factor": 1.0}, "raise_factor"),
                         ({"target": 0.9, "retry_windows": -1}, "retry_windows"),
                         ({"target": 0.9, "floor_tokens": 256, "ceiling_tokens": 128}, "floor_tokens")):
        with pytest.raises(AutopilotConfigError) as err:
            AutopilotConfig(**kwargs)
        assert err.value.field == name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.lists(st.integers(4, 40), min_size=1, max_size=6).map(sorted),
       p5s=st.lists(st.lists(st.floats(0.3, 1.0), min_size=6, max_size=6), min_size=1, max_size=12),
       n_tokens=st.integers(50, 400), floor_pages=st.integers(4, 8), extra_pages=st.integers(0, 40),
       min_tokens=st.integers(50, 300), use_bins=st.booleans())
def test_property_budgets_stay_valid_and_change_only_on_enough_evidence(start, p5s, n_tokens, floor_pages,
                                                                        extra_pages, min_tokens, use_bins):
    floor, ceiling = floor_pages * PAGE, (floor_pages + extra_pages) * PAGE
    budgets = [min(max(p * PAGE, floor), ceiling) for p in start]
    ctl = BudgetController(AutopilotConfig(TARGET, MARGIN, floor, ceiling, min_tokens), budgets, PAGE, RESERVED,
                           bin_tokens=BIN if use_bins else None)
    since_change = [0] * len(budgets)
    for row in p5s:
        for b in range(len(budgets)):
            ctl.observe(ctl.budgets, tokens_with_p5(row[b], n_tokens), [b] * n_tokens)
            since_change[b] += n_tokens
        before = ctl.budgets
        for change in ctl.step():
            b = change.bin_index
            assert before[b] == change.old_tokens != change.new_tokens
            if change.reason == FOLLOW:
                assert change.new_tokens > change.old_tokens and change.evidence is None
            elif change.reason == TRIM:  # cut to the budget that is already dense over the whole bin
                assert change.new_tokens < change.old_tokens and change.evidence is None
                assert change.new_tokens >= BIN * (b + 1) and b < len(budgets) - 1
            else:
                assert since_change[b] >= min_tokens and change.evidence.n_tokens >= min_tokens
                if change.reason == RAISE:
                    assert change.evidence.p5_high < TARGET and change.new_tokens > change.old_tokens
                else:
                    assert change.evidence.p5_low > TARGET + MARGIN and change.new_tokens < change.old_tokens
            since_change[b] = 0
        assert all(b % PAGE == 0 and floor <= b <= ceiling for b in ctl.budgets)
        assert all(x <= y for x, y in zip(ctl.budgets, ctl.budgets[1:]))
        assert not math.isnan(sum(ctl.budgets))


def _one_bin(retry_windows: int) -> BudgetController:
    """One open-ended bin whose tail holds at 112 tokens (p5 0.95, above the band) and fails at 96 (0.85)."""
    return make([96], retry_windows=retry_windows)


def _feed_one(ctl: BudgetController, n: int) -> list:
    ctl.observe(ctl.budgets, tokens_with_p5(0.95 if ctl.budgets[0] >= 112 else 0.85, n), [0] * n)
    return ctl.step()


def test_a_failed_budget_is_retried_after_enough_evidence_above_the_band_ever_more_rarely():
    ctl = _one_bin(retry_windows=2)  # min_tokens 200: a retry needs 400 tokens at 112, then 800, ...
    assert [c.new_tokens for c in _feed_one(ctl, 200)] == [144]  # 96 failed: x1.5
    assert [c.new_tokens for c in _feed_one(ctl, 200)] == [128]
    assert [c.new_tokens for c in _feed_one(ctl, 200)] == [112]
    for waited in (400, 800):  # doubles with each failure of the bin
        assert _feed_one(ctl, 200) == [] and _feed_one(ctl, waited - 201) == []  # 96 failed: not yet
        retry = _feed_one(ctl, 1)
        assert [(c.reason, c.new_tokens) for c in retry] == [(LOWER, 96)]
        assert retry[0].evidence.n_tokens == waited and retry[0].evidence.p5_low > TARGET + MARGIN
        back = _feed_one(ctl, 200)  # 96 fails again: straight back to the budget that held
        assert [(c.reason, c.new_tokens) for c in back] == [(RAISE, 112)]
    assert ctl.state()["bins"][0]["failed_tokens"] == 96


def test_a_failed_budget_is_never_retried_with_retry_windows_zero():
    ctl = _one_bin(retry_windows=0)
    for _ in range(3):
        _feed_one(ctl, 200)
    assert ctl.budgets == (112,)
    for _ in range(60):  # 12,000 tokens above the band at 112
        assert _feed_one(ctl, 200) == []
    assert ctl.budgets == (112,)
