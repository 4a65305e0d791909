"""The per-step cost fit: exact NNLS against references, term selection, rollout waves, and the presets
against every committed SGLang decode and rollout point (benchmarks/fit_step_costs.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import nnls

from sparrow_server.cost.hardware import HARDWARE_PRESETS
from sparrow_server.cost.step_fit import (
    STEP_COST_TERMS, FitPoint, fit_step_costs, leave_one_out, predict, select_terms,
)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import fit_step_costs as fsc  # noqa: E402

K = len(STEP_COST_TERMS)


def _points(rng, n, coefficients, noise=0.0):
    out = []
    for i in range(n):
        counts = rng.uniform(0, 1, K) * np.array([1, 30, 28, 900, 1e6])
        roofline = rng.uniform(1e-3, 2e-2)
        measured = (roofline + counts @ coefficients) * (1 + noise * rng.standard_normal())
        out.append(FitPoint(f"p{i}", measured, roofline, counts))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_fit_is_the_nnls_optimum_of_relative_errors(seed):
    rng = np.random.default_rng(seed)
    # some true coefficients 0, noise so that the unconstrained optimum has negative parts
    truth = np.array([1.5e-3, 0.0, 3e-5, 0.0, 1e-9]) * rng.uniform(0.5, 1.5, K)
    points = _points(rng, 12, truth, noise=0.08)
    got = fit_step_costs(points, STEP_COST_TERMS)
    a = np.stack([p.counts / p.measured_s for p in points])
    b = np.array([1 - p.roofline_s / p.measured_s for p in points])
    scale = np.abs(a).max(axis=0)  # nnls is unit-sensitive in its tolerance; solve in scaled units
    ref = nnls(a / scale, b)[0] / scale
    assert np.all(got >= 0)
    err = lambda c: float(np.sum((a @ c - b) ** 2))  # noqa: E731
    assert err(got) == pytest.approx(err(ref), rel=1e-9, abs=1e-15)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-3 * np.abs(ref).max() / scale.max())


def test_one_term_closed_form_and_exact_recovery():
    rng = np.random.default_rng(7)
    points = _points(rng, 5, np.zeros(K), noise=0.0)
    points = [FitPoint(p.name, p.roofline_s + 2e-3 + 1e-4 * i, p.roofline_s, p.counts) for i, p in enumerate(points)]
    a = np.array([p.counts[0] / p.measured_s for p in points])
    b = np.array([1 - p.roofline_s / p.measured_s for p in points])
    got = fit_step_costs(points, ("step_overhead_s",))
    assert got[0] == pytest.approx(a @ b / (a @ a), rel=1e-12) and not got[1:].any()
    # noiseless data from known coefficients: recovered exactly, and every prediction is exact
    truth = np.array([1.2e-3, 2e-5, 4e-5, 0.0, 1.1e-9])
    points = _points(rng, 9, truth)
    np.testing.assert_allclose(fit_step_costs(points, STEP_COST_TERMS), truth, rtol=1e-6, atol=1e-15)
    assert max(abs(e) for e in leave_one_out(points, STEP_COST_TERMS)) < 1e-9
    with pytest.raises(ValueError, match="unknown"):
        fit_step_costs(points, ("per_token_s",))


def test_leave_one_out_is_the_refit_without_the_point():
    rng = np.random.default_rng(3)
    points = _points(rng, 7, np.array([1e-3, 1e-5, 0, 2e-6, 0]), noise=0.05)
    terms = ("step_overhead_s", "sparse_layer_request_s")
    for i, e in enumerate(leave_one_out(points, terms)):
        c = fit_step_costs(points[:i] + points[i + 1:], terms)
        assert e == pytest.approx(predict(points[i], c) / points[i].measured_s - 1, rel=1e-12)


def test_select_terms_keeps_the_generating_terms():
    rng = np.random.default_rng(11)
    points = _points(rng, 10, np.array([1.4e-3, 0.0, 0.0, 0.0, 1.1e-9]))
    assert select_terms(points) == ("step_overhead_s", "sparse_page_s")


def test_rollout_waves():
    # rollout A on the H200 (gpu_call15): the pool held 61 requests at full length, 3 ran after them
    assert fsc.rollout_waves(64, 1024 + 16384, 1_076_320, 64) == [61, 3]
    assert fsc.rollout_waves(32, 1024 + 16384, 593_920, 32) == [32]
    assert fsc.rollout_waves(70, 100, 10_000, 32) == [32, 32, 6]
    with pytest.raises(ValueError, match="KV pool"):
        fsc.rollout_waves(1, 20_000, 10_000, 8)


@pytest.mark.parametrize("preset", ["h100", "h200"])
def test_presets_are_the_fit_and_reproduce_every_committed_point(preset):
    """The preset's per-step costs are the least-squares fit to its committed measurements (to the 3
    significant digits they are written with); with them every committed decode step and rollout wall time
    lies within 6% and every measured dense/sparse speedup within 10%; each point left out of the fit is
    still predicted within 10%, and so is every held-out point (other models) within 6%. The pure roofline
    misses the speedups by more than 10%."""
    fitted, terms = fsc.fitted_hardware(preset)
    np.testing.assert_allclose(HARDWARE_PRESETS[preset].step_costs, fitted.step_costs, rtol=5e-3, atol=1e-15)
    points = fsc.preset_points(preset)
    assert sum(" rollout " in p.name for p in points) >= 1 and sum(" decode_ctx " in p.name for p in points) >= 6
    hw = HARDWARE_PRESETS[preset]
    by_name = {p.name: predict(p, hw.step_costs) for p in points}
    for p in points:
        assert by_name[p.name] == pytest.approx(p.measured_s, rel=0.06), p.name
    assert max(abs(e) for e in leave_one_out(points, terms)) < 0.10
    pairs = [(p, q) for p in points for q in points if p.name.endswith(" dense") and q.name == p.name[:-5] + "sparse"]
    assert len(pairs) >= 3
    worst_roofline = 0.0
    for dense, sparse in pairs:
        measured = dense.measured_s / sparse.measured_s
        assert by_name[dense.name] / by_name[sparse.name] == pytest.approx(measured, rel=0.10), dense.name
        worst_roofline = max(worst_roofline, abs(dense.roofline_s / sparse.roofline_s / measured - 1))
    assert worst_roofline > 0.10  # the fitted costs are what make the prediction land
    for p in fsc.preset_points(preset, held_out=True):  # other models on the same GPU and kernels, not fitted
        assert predict(p, hw.step_costs) == pytest.approx(p.measured_s, rel=0.06), p.name


@pytest.mark.parametrize("preset", ["h100", "h200"])
def test_preset_follows_the_steps_inside_each_rollout(preset):
    """Step by step inside each committed rollout (its server log, one line per 40 steps), the preset's
    step time at the line's mean length has a median error within 10% in every wave and every quarter of
    the lengths: the fit holds along the rollout, not only on its total."""
    checked = fsc.log_check(preset)
    assert checked, "no committed rollout log found"
    for name, batch, rows in checked:
        assert len(rows) > 100, (name, batch)
        assert abs(np.median(rows[:, 1])) < 0.10, (name, batch)
        for quarter in np.array_split(rows[np.argsort(rows[:, 0]), 1], 4):
            assert abs(np.median(quarter)) < 0.10, (name, batch)


def test_committed_fit_report_is_current():
    """benchmarks/results/cost_fit.md is what benchmarks/fit_step_costs.py prints from the committed data."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert fsc.main([]) == 0
    assert (REPO / "benchmarks" / "results" / "cost_fit.md").read_text() == out.getvalue()
