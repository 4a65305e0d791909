"""Per-bin quantiles, bootstrap CIs, Beta tail fit and rolling quantiles against numpy/scipy."""
from __future__ import annotations

import numpy as np
import pytest

from sparrow_server.stats.beta import (
    beta_cdf, digamma, fit_beta_mle, fit_beta_moments, fit_beta_tail, ks_statistic, trigamma,
)
from sparrow_server.stats.rolling import RollingQuantile, RollingTailMonitor
from sparrow_server.stats.tail import (
    binned_quantiles, bootstrap_quantile_ci, length_bins, quantile_interval, quantile_order_interval,
)


def _tokens(n=6000, seed=0):
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, 9000, n)
    acceptance = np.clip(1 - rng.beta(0.6, 8, n) * (1 + positions / 9000), 0, 1)
    return acceptance, positions


@pytest.mark.parametrize("q", [0.05, 0.01, 0.5])
def test_binned_quantiles_match_numpy_per_bin(q):
    acceptance, positions = _tokens()
    result = binned_quantiles(acceptance, positions, bin_tokens=2000, q=q, n_boot=0)
    assert [r.bin_index for r in result] == [0, 1, 2, 3, 4]
    for r in result:
        vals = acceptance[(positions // 2000) == r.bin_index]
        assert r.n_tokens == vals.size
        assert r.quantile == pytest.approx(np.quantile(vals, q), abs=0)
        assert r.mean == pytest.approx(vals.mean())
        assert np.isnan(r.ci_low) and np.isnan(r.ci_high)


def test_binned_quantiles_open_last_bin_and_empty_bins():
    acceptance = np.array([0.9, 0.8, 0.7, 0.95, 0.5])
    positions = np.array([10, 4100, 4200, 50_000, 99_000])
    result = binned_quantiles(acceptance, positions, bin_tokens=2000, n_bins=4, n_boot=0)
    assert [r.n_tokens for r in result] == [1, 0, 2, 2]
    assert np.isnan(result[1].quantile)
    assert result[3].quantile == pytest.approx(np.quantile([0.95, 0.5], 0.05))


def test_bootstrap_ci_matches_loop_reference_and_is_seeded():
    rng = np.random.default_rng(1)
    vals = rng.beta(8, 1, 700)
    low, high = bootstrap_quantile_ci(vals, 0.05, n_boot=300, seed=7)
    # Same draws, explicit loop: the chunked vectorised version must reproduce them exactly.
    g = np.random.default_rng(7)
    idx = g.integers(0, vals.size, size=(300, vals.size))
    stats = np.array([np.quantile(vals[row], 0.05) for row in idx])
    assert (low, high) == tuple(np.quantile(stats, [0.025, 0.975]))
    assert low <= np.quantile(vals, 0.05) <= high
    assert bootstrap_quantile_ci(vals, 0.05, n_boot=300, seed=7) == (low, high)


def test_bootstrap_ci_covers_true_quantile_usually():
    # Beta(8, 1): true 5th percentile = 0.05 ** (1 / 8).
    truth = 0.05 ** (1 / 8)
    hits = 0
    for seed in range(40):
        vals = np.random.default_rng(100 + seed).beta(8, 1, 1500)
        low, high = bootstrap_quantile_ci(vals, 0.05, n_boot=200, seed=seed)
        hits += low <= truth <= high
    assert hits >= 33  # nominal 95%: 38 of 40; allow Monte-Carlo slack


def test_binned_quantiles_cis_bracket_the_estimate():
    acceptance, positions = _tokens(seed=2)
    for r in binned_quantiles(acceptance, positions, n_boot=200, seed=3):
        assert r.ci_low <= r.quantile <= r.ci_high


def test_tail_input_errors():
    with pytest.raises(ValueError, match="positions"):
        length_bins(np.array([-1, 3]))
    with pytest.raises(ValueError, match="q ="):
        binned_quantiles(np.array([0.5]), np.array([0]), q=1.5)
    with pytest.raises(ValueError, match="acceptance"):
        binned_quantiles(np.array([0.5, 0.4]), np.array([0]))


def test_special_functions_match_scipy():
    special = pytest.importorskip("scipy.special")
    stats = pytest.importorskip("scipy.stats")
    for x in [1e-3, 0.2, 1.0, 3.3, 9.99, 10.0, 57.0, 1e4]:
        assert digamma(x) == pytest.approx(special.digamma(x), rel=1e-12, abs=1e-12)
        assert trigamma(x) == pytest.approx(special.polygamma(1, x), rel=1e-12)
    grid = np.linspace(0, 1, 401)
    for a, b in [(0.3, 0.4), (2.0, 5.0), (40.0, 2.0), (0.9, 300.0)]:
        assert np.max(np.abs(beta_cdf(grid, a, b) - stats.beta.cdf(grid, a, b))) < 1e-10


@pytest.mark.parametrize("a,b", [(0.7, 0.4), (2.0, 6.0), (25.0, 3.0)])
def test_beta_mle_matches_scipy(a, b):
    stats = pytest.importorskip("scipy.stats")
    y = np.random.default_rng(4).beta(a, b, 4000)
    ra, rb, _, _ = stats.beta.fit(y, floc=0, fscale=1)
    fa, fb = fit_beta_mle(y)
    assert fa == pytest.approx(ra, rel=1e-6) and fb == pytest.approx(rb, rel=1e-6)
    ma, mb = fit_beta_moments(y)
    assert ma == pytest.approx(a, rel=0.15) and mb == pytest.approx(b, rel=0.15)


def test_beta_tail_fit_and_ks_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    tail = 0.999 * rng.beta(3.0, 0.8, 3000)
    acceptance = np.concatenate([tail, np.full(7000, 1.0)])
    fit = fit_beta_tail(acceptance)
    assert fit.n_tail == 3000 and fit.n_total == 10_000 and fit.tail_fraction == pytest.approx(0.3)
    assert fit.alpha == pytest.approx(3.0, rel=0.1) and fit.beta == pytest.approx(0.8, rel=0.1)
    ref = stats.kstest(tail / 0.999, "beta", args=(fit.alpha, fit.beta)).statistic
    assert fit.ks == pytest.approx(ref, abs=1e-9)
    assert fit.ks < 0.04
    # a clearly non-Beta tail (two spikes) gets a large KS
    spiky = np.concatenate([np.full(500, 0.2), np.full(500, 0.9)]) + rng.normal(0, 1e-3, 1000)
    assert fit_beta_tail(spiky).ks > 0.2


def test_ks_statistic_matches_scipy_uniform():
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(6).uniform(size=500) ** 1.1
    assert ks_statistic(x, lambda v: v) == pytest.approx(stats.kstest(x, "uniform").statistic, abs=1e-12)


def test_beta_fit_errors():
    with pytest.raises(ValueError, match="at least 2"):
        fit_beta_moments(np.array([0.5]))
    with pytest.raises(ValueError, match="cutoff"):
        fit_beta_tail(np.array([0.5, 0.6]), cutoff=0)


def test_rolling_quantile_is_exact_over_the_window():
    rng = np.random.default_rng(7)
    stream = rng.uniform(size=2500)
    window = RollingQuantile(capacity=1000, q=0.05)
    assert np.isnan(window.quantile())
    seen = 0
    for size in [1, 7, 300, 0, 999, 1000, 5, 188]:
        window.add(stream[seen:seen + size])
        seen += size
        expect = stream[max(0, seen - 1000):seen]
        assert len(window) == expect.size and window.total_seen == seen
        np.testing.assert_array_equal(window.values(), expect)
        if expect.size:
            assert window.quantile() == np.quantile(expect, 0.05)
    window.add(stream[:1500])  # a batch larger than the window keeps its newest values
    np.testing.assert_array_equal(window.values(), stream[500:1500])


def test_rolling_monitor_bins_and_schedules():
    mon = RollingTailMonitor(capacity=100, q=0.05, bin_tokens=2000, n_bins=3)
    rng = np.random.default_rng(8)
    a = rng.uniform(size=400)
    pos = rng.integers(0, 10_000, 400)
    touched = mon.add("s1", a, pos)
    assert touched == [0, 1, 2]
    last = a[np.minimum(pos // 2000, 2) == 2][-100:]
    assert mon.quantile("s1", 2) == np.quantile(last, 0.05)
    assert np.isnan(mon.quantile("s2", 0))
    mon.add("s2", [0.5], [0])
    snap = mon.snapshot()
    assert [(s.schedule, s.bin_index) for s in snap] == [("s1", 0), ("s1", 1), ("s1", 2), ("s2", 0)]
    assert snap[-1].window_tokens == 1 and snap[-1].quantile == 0.5
    mon.reset("s1")
    assert [s.schedule for s in mon.snapshot()] == ["s2"]
    with pytest.raises(ValueError, match="positions"):
        mon.add("s1", [0.1, 0.2], [5])


# --- distribution-free interval of a quantile (what the live monitor reports beside p5) -------------------
@pytest.mark.parametrize("n", [1, 10, 59, 60, 100, 200, 513, 2048, 20000])
@pytest.mark.parametrize("q, confidence", [(0.05, 0.95), (0.05, 0.9), (0.5, 0.95), (0.01, 0.99)])
def test_order_interval_is_the_tightest_with_binomial_tails_within_alpha(n, q, confidence):
    from scipy.stats import binom

    lo, hi = quantile_order_interval(n, q, confidence)
    tail = (1 - confidence) / 2
    assert -1 <= lo < hi <= n
    # the lower end x_(lo+1) (1-based) misses when B <= lo; the upper end x_(hi+1) when B >= hi + 1
    if lo >= 0:
        assert binom.cdf(lo, n, q) <= tail + 1e-12 and binom.cdf(lo + 1, n, q) > tail - 1e-12
    else:
        assert binom.cdf(0, n, q) > tail - 1e-12
    if hi < n:
        assert binom.sf(hi, n, q) <= tail + 1e-12 and binom.sf(hi - 1, n, q) > tail - 1e-12
    else:
        assert binom.sf(n - 1, n, q) > tail - 1e-12


def test_interval_covers_the_population_quantile_at_least_at_the_confidence():
    rng = np.random.default_rng(0)
    population = rng.beta(8, 1, size=200_000)  # acceptance-like: mass near 1, a long left tail
    truth = np.quantile(population, 0.05)
    for n in (60, 300, 2000):
        hits = 0
        for _ in range(400):
            low, high = quantile_interval(rng.choice(population, n), 0.05, 0.95, support=(0.0, 1.0))
            hits += low <= truth <= high
        assert hits / 400 >= 0.92, (n, hits)


def test_interval_ends_support_and_errors():
    values = np.linspace(0, 1, 11)
    assert quantile_interval(values, 0.05, 0.95, support=(0.0, 1.0))[0] == 0.0  # n = 11: no lower end
    low, high = quantile_interval(np.arange(1000) / 999, 0.05)
    assert low == pytest.approx(36 / 999) and high == pytest.approx(64 / 999)
    assert low <= np.quantile(np.arange(1000) / 999, 0.05) <= high
    assert all(np.isnan(quantile_interval(np.array([]))))
    assert quantile_order_interval(0) == (-1, 0)
    for bad in (dict(n=-1), dict(n=2.5), dict(n=True)):
        with pytest.raises(ValueError, match="n = "):
            quantile_order_interval(**bad)
    with pytest.raises(ValueError, match="confidence"):
        quantile_order_interval(10, 0.05, 1.0)
    with pytest.raises(ValueError):
        quantile_order_interval(10, 1.5)


def test_rolling_interval_is_the_window_interval():
    window = RollingQuantile(capacity=500)
    assert all(np.isnan(window.interval()))
    rng = np.random.default_rng(3)
    values = rng.random(800)
    window.add(values)
    assert window.interval() == quantile_interval(values[-500:], 0.05)
    monitor = RollingTailMonitor(capacity=500, bin_tokens=100, n_bins=4)
    monitor.add("s", values, np.arange(800) % 400)
    in_bin = values[(np.arange(800) % 400) // 100 == 2]
    assert monitor.interval("s", 2, support=(0.0, 1.0)) == quantile_interval(in_bin, 0.05, support=(0.0, 1.0))
    assert all(np.isnan(monitor.interval("other", 0)))
