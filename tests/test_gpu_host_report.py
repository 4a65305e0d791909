"""benchmarks/gpu_host/report8k.py on synthetic per-token arrays: skew, p5 per bin, r, Beta tail, tables, plots."""
from __future__ import annotations

import json
import sys

import numpy as np

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
