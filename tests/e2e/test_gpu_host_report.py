"""benchmarks/gpu_host/report8k.py on synthetic per-token arrays: skew, p5 per bin, r, Beta tail, tables, plots."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from helpers.server_util import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "gpu_host"))
import report8k as R  # noqa: E402


def _arrays(rng):
    out = {}
    for budget, slope in ((256, 8e-5), (1024, 6e-5)):
        length = np.concatenate([np.arange(60, 4096) for _ in range(3)])
        acc = np.where(length <= budget, 1.0, np.clip(1 - rng.beta(1.3, 12, size=length.size) - slope * length, 0, 1))
        name = f"xe-fixed-{budget}"
        out.update({f"{name}/exact": acc.astype(np.float32), f"{name}/length": length,
                    f"{name}/lower_bound": (acc * 0.9).astype(np.float32)})
    out["dense/exact"], out["dense/length"] = np.ones(10, np.float32), np.arange(10)
    return out


def test_report_tables_and_plots(tmp_path):
    tokens = _arrays(np.random.default_rng(0))
    np.savez_compressed(tmp_path / "t.npz", **tokens)
    assert list(R.fixed_budgets(tokens)) == [256, 1024]
    result = R.study(tokens, bin_tokens=512)
    for budget, r in result.items():
        p5 = [b["p5"] for b in r["p5_by_bin"] if b["from"] >= budget]
        assert p5 == sorted(p5, reverse=True), (budget, p5)  # falls with length
        assert r["r_token_length_sparse"] < 0 and r["r_bin_p5_length"] < -0.9
        assert r["sparse_region"]["mean"] < r["all"]["mean"] and 0 < r["beta_tail"]["ks"] < 0.2
    heldout = {"target": 0.8, "band": 0.02, "schedule_mean_cost_tokens": 700.0, "matched_fixed_budget": 704,
               "p5_by_bin": {"cal": [{"from": 0, "p5": 0.81, "ci": [0.8, 0.82], "at_or_above_target_minus_band": True}],
                             "xe-fixed-704": [{"from": 0, "p5": 0.7, "ci": [0.69, 0.71],
                                               "at_or_above_target_minus_band": False}]}}
    (tmp_path / "h.json").write_text(json.dumps(heldout))
    table = R.markdown(result, heldout, {"runs": [{"schedule": "dense", "tok_s": 10.0}, {"schedule": "cal", "tok_s": 15.0}],
                                         "speedup": 1.5, "batch": 32, "total_tokens": 8160})
    assert "| 256 |" in table and "cal: 0: 0.810 [0.800, 0.820] -> every bin >= target - band: True" in table
    assert "speedup 1.5x" in table
    R.plots(result, heldout, tmp_path)
    assert (tmp_path / "p5_vs_length.png").stat().st_size > 1000 and (tmp_path / "heldout_schedule.png").is_file()


def test_cross_engine_tables_without_heldout_or_throughput(tmp_path, monkeypatch):
    """Call 3's arrays alone (call 4 not run): logprob-difference multiples of the dense floor, the monitor's gap."""
    rng = np.random.default_rng(1)
    tokens = _arrays(rng)
    n = tokens["xe-fixed-256/exact"].size
    dense_diff = rng.exponential(0.02, n).astype(np.float32)
    tokens.update({"dense/exact": np.ones(n, np.float32), "dense/length": tokens["xe-fixed-256/length"],
                   "dense/lower_bound": np.full(n, 0.8, np.float32), "dense/abs_logprob_diff": dense_diff,
                   "xe-fixed-256/abs_logprob_diff": 3 * dense_diff, "xe-fixed-1024/abs_logprob_diff": dense_diff})
    # the bound sits 0.1 below exact, except on every 10th token where it is 0.05 above (cross-engine rounding)
    lb = tokens["xe-fixed-256/exact"] - 0.1
    lb[::10] += 0.15
    tokens["xe-fixed-256/lower_bound"] = lb
    np.savez_compressed(tmp_path / "t.npz", **tokens)

    diff = R.logprob_diff(tokens)
    assert list(diff) == ["xe-fixed-256", "xe-fixed-1024", "dense"]
    assert diff["xe-fixed-256"]["median_x_dense"] == pytest.approx(3, rel=1e-5)
    assert diff["xe-fixed-1024"]["p99_x_dense"] == pytest.approx(1) and diff["dense"]["max"] == pytest.approx(dense_diff.max())
    gap = R.monitor_gap(tokens, bin_tokens=1024)
    assert [b["from"] for b in gap["xe-fixed-256"]] == [0, 1024, 2048, 3072]
    for b in gap["xe-fixed-256"]:
        assert b["above_share"] == pytest.approx(0.1, abs=0.01) and b["mean_gap"] == pytest.approx(0.085, abs=0.005)
    assert all(b["above_share"] == 0 and b["mean_gap"] == pytest.approx(0.2) for b in gap["dense"])

    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["report8k", "--tokens", str(tmp_path / "t.npz"), "--bin-tokens", "1024",
                                      "--out", str(out)])
    assert R.main() == 0
    tables = (out / "tables.md").read_text()
    assert "| xe-fixed-256 | 12108 |" in tables and "| dense | 3072 |" in tables and "Held-out" not in tables
    summary = json.loads((out / "summary.json").read_text())
    assert summary["throughput"] is None and set(summary["monitor_gap"]) == {"xe-fixed-256", "xe-fixed-1024", "dense"}
    assert (out / "monitor_bound_vs_exact.png").stat().st_size > 1000 and not (out / "heldout_schedule.png").exists()
