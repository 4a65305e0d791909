"""The per-step cost fit: exact NNLS against references, term selection, rollout waves, and the presets
against every committed SGLang decode and rollout point (benchmarks/fit_step_costs.py)."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
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
        counts = rng.uniform(0, 1, K) * np.array([1, 30, 28, 900, 1e6, 28, 0.2, 3e3])
        roofline = rng.uniform(1e-3, 2e-2)
        measured = (roofline + counts @ coefficients) * (1 + noise * rng.standard_normal())
        out.append(FitPoint(f"p{i}", measured, roofline, counts))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_fit_is_the_nnls_optimum_of_relative_errors(seed):
    rng = np.random.default_rng(seed)
    # some true coefficients 0, noise so that the unconstrained optimum has negative parts
    truth = np.array([1.5e-3, 0.0, 3e-5, 0.0, 1e-9, 0.0, 2e-3, 2e-7]) * rng.uniform(0.5, 1.5, K)
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
    truth = np.array([1.2e-3, 2e-5, 4e-5, 0.0, 1.1e-9, 3e-5, 2e-3, 1.8e-7])
    points = _points(rng, 9, truth)
    np.testing.assert_allclose(fit_step_costs(points, STEP_COST_TERMS), truth, rtol=1e-6, atol=1e-15)
    assert max(abs(e) for e in leave_one_out(points, STEP_COST_TERMS)) < 1e-9
    with pytest.raises(ValueError, match="unknown"):
        fit_step_costs(points, ("per_token_s",))
    # a candidate column an analysis adds (names): left out of the terms it changes nothing; in them it is fitted
    extra = [FitPoint(p.name, p.measured_s + 3e-4 * (i % 3), p.roofline_s, np.append(p.counts, i % 3))
             for i, p in enumerate(points)]
    names = STEP_COST_TERMS + ("extra_s",)
    np.testing.assert_allclose(fit_step_costs(extra, STEP_COST_TERMS, names)[:K],
                               fit_step_costs([FitPoint(p.name, p.measured_s, p.roofline_s, p.counts[:K]) for p in extra],
                                              STEP_COST_TERMS), rtol=1e-9, atol=1e-18)
    np.testing.assert_allclose(fit_step_costs(extra, names, names), np.append(truth, 3e-4), rtol=1e-6, atol=1e-15)
    assert select_terms(extra, names=names)[-1] == "extra_s"


def test_leave_one_out_is_the_refit_without_the_point():
    rng = np.random.default_rng(3)
    points = _points(rng, 7, np.array([1e-3, 1e-5, 0, 2e-6, 0, 0, 0, 0]), noise=0.05)
    terms = ("step_overhead_s", "sparse_layer_request_s")
    for i, e in enumerate(leave_one_out(points, terms)):
        c = fit_step_costs(points[:i] + points[i + 1:], terms)
        assert e == pytest.approx(predict(points[i], c) / points[i].measured_s - 1, rel=1e-12)


def test_select_terms_keeps_the_generating_terms():
    rng = np.random.default_rng(11)
    points = _points(rng, 10, np.array([1.4e-3, 0.0, 0.0, 0.0, 1.1e-9, 0.0, 0.0, 0.0]))
    assert select_terms(points) == ("step_overhead_s", "sparse_page_s")


def _committed_rollouts(preset, calls=None):
    return [(w, p) for w, p in fsc.preset_workloads(preset, calls=calls) if w.kind == "rollout"]


@pytest.mark.parametrize("preset", ["h100", "h200"])
def test_cost_cli_predicts_every_committed_rollout(preset, capsys):
    """``sparrow-server cost`` (rollout_estimate), given each committed rollout's requests and KV pool, predicts its
    wall time within 10% and is the fit's own rollout model (same seconds); the same run through the CLI's JSON.
    Without the KV pool's waves the H200 rollout A (61 requests, then 3 alone) would be predicted 14% fast."""
    from sparrow_server.cli import main
    from sparrow_server.cost.model_shape import MODEL_PRESETS
    from sparrow_server.cost.roofline import rollout_estimate

    hw = HARDWARE_PRESETS[preset]
    rollouts = _committed_rollouts(preset)
    assert len(rollouts) >= 1 + (preset == "h100") * 3
    for w, p in rollouts:
        schedule = fsc.workload_schedule(replace(w, backend="sparse"))  # the CLI predicts both backends
        est = rollout_estimate(MODEL_PRESETS[w.model], schedule, w.prompt_len, w.gen_len, samples=1, hardware=hw,
                               batch=w.batch, kv_pool_tokens=w.kv_pool_tokens)
        wall = w.batch * (est.dense_s if w.backend == "dense" else est.sparse_s)
        assert wall == pytest.approx(predict(p, hw.step_costs), rel=1e-9), p.name
        assert wall == pytest.approx(p.measured_s, rel=0.10), p.name
        assert main(["cost", "--model", w.model, "--schedule", schedule.name, "--prompt-len", str(w.prompt_len),
                     "--gen-len", str(w.gen_len), "--samples", "1", "--batch", str(w.batch), "--hardware", preset,
                     "--kv-pool-tokens", str(w.kv_pool_tokens), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out[f"{w.backend}_tokens_per_s"] == pytest.approx(w.gen_len / (wall / w.batch), rel=1e-9)
        assert out["decode_waves"] == fsc.rollout_waves(w.batch, w.prompt_len + w.gen_len, w.kv_pool_tokens,
                                                        w.max_running)
        if len(out["decode_waves"]) > 1:
            one_wave = rollout_estimate(MODEL_PRESETS[w.model], schedule, w.prompt_len, w.gen_len, samples=1,
                                        hardware=hw, batch=w.batch)
            # the rollout's own backend: a sparse half is compared with the sparse prediction
            one_wave_s = one_wave.dense_s if w.backend == "dense" else one_wave.sparse_s
            assert w.batch * one_wave_s / p.measured_s - 1 < -0.10, p.name


@pytest.mark.parametrize("preset", ["h100", "h200"])
def test_rollout_breakdown_adds_up_and_the_logs_cover_the_wall(preset):
    """The per-rollout table: its parts add up to the prediction, and the server log's lines cover the measured
    wall time but for the prefill and each wave's first 40 steps (within 2%), so the fit compares decode with
    decode. Every committed rollout on the GPU has a row, those of earlier kernels or later code marked as not fitted."""
    points = fsc.preset_points(preset)
    rows = fsc.rollout_breakdown(preset, {p.name: 0.0 for p in points})[2:]
    rollouts = _committed_rollouts(preset, fsc.reported_calls(preset))
    assert len(rows) == len(rollouts)
    for row, (w, p) in zip(rows, rollouts):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0].startswith(p.name)
        assert ("not fitted" in cells[0]) == (w.source.split(":")[0] not in fsc.FIT_SOURCES[preset])
        measured, in_log, *parts, predicted = (float(c) for c in cells[2:-2])
        assert measured == pytest.approx(p.measured_s, abs=0.05)
        assert sum(parts) == pytest.approx(predicted, abs=0.05 * len(parts) + 0.05)
        assert 0 < measured - in_log < 0.02 * measured, p.name


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


def test_committed_cost_drift_report_is_current():
    """benchmarks/results/cost_drift.md (the preset against the runs after its fit, and float8's predicted gain next
    to the measured one) is what benchmarks/cost_drift.py prints from the committed data."""
    import contextlib
    import io

    import cost_drift

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cost_drift.main() == 0
    assert (REPO / "benchmarks" / "results" / "cost_drift.md").read_text() == out.getvalue()
