"""``benchmarks/grpo_run_report.py``: the tables it computes from tiny synthetic ``steps-<arm>.jsonl`` files,
checked against values worked out by hand, and its reading of the committed GPU run (run1)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import grpo_run_report as rr  # noqa: E402

RUN1 = REPO / "benchmarks" / "results" / "grpo_gpu" / "run1"


def _row(step: int, reward: float, acc: float, capped: float, tokens: int, correct: int | None = None) -> dict:
    return {"step": step, "reward_mean": reward, "correct": round(reward * 4) if correct is None else correct,
            "samples": 4, "acceptance_est": acc, "tis_mean": 1.0, "tis_capped_frac": capped,
            "completion_tokens": tokens, "kv_budget_tokens_mean": 48.0, "grad_norm": 1.0, "rollout_s": 0.5,
            "train_s": 0.25, "sync_s": 0.1, "sampled_weight_versions": [str(step - 1)]}


def _write(folder: Path, arm: str, rows: list[dict], torn: bool = False) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows) + ('{"step": 9, "rew' if torn else "")
    (folder / f"steps-{arm}.jsonl").write_text(text)


def test_tables_from_a_tiny_run(tmp_path):
    # dense: reward 0.25 for 4 steps then 0.75 for 4; acceptance 1.0; no capping; 8 tokens a sample
    dense = [_row(s, 0.25 if s <= 4 else 0.75, 1.0, 0.0, 32) for s in range(1, 9)]
    # aggressive: reward 0 then 0.25; acceptance 0.8 / 0.6 alternating; capped 0.02 / 0.06; 24 tokens a sample
    aggressive = [_row(s, 0.0 if s <= 4 else 0.25, 0.8 if s % 2 else 0.6, 0.02 if s % 2 else 0.06, 96)
                  for s in range(1, 9)]
    _write(tmp_path, "dense", dense)
    _write(tmp_path, "aggressive", aggressive, torn=True)  # a torn last line is dropped, not an error
    report = rr.build(tmp_path, ["dense", "aggressive"], "dense", window=4)
    d, a = report["arms"]["dense"], report["arms"]["aggressive"]
    assert d["steps"] == a["steps"] == 8
    assert d["reward_windows"] == [0.25, 0.75] and a["reward_windows"] == [0.0, 0.25]
    assert d["reward_mean"] == 0.5 and a["steps_no_correct"] == 4
    assert d["first_step_window_reward_ge_0.5"] == 6  # steps 3-6: (0.25 + 0.25 + 0.75 + 0.75) / 4 = 0.5
    assert a["first_step_window_reward_ge_0.5"] is None
    # least squares through (1..4, 0) and (5..8, 0.25), worked out here
    x = list(range(1, 9))
    y = [r["reward_mean"] for r in aggressive]
    mx, my = sum(x) / 8, sum(y) / 8
    assert a["reward_slope_per_step"] == pytest.approx(
        sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sum((xi - mx) ** 2 for xi in x), abs=1e-6)
    assert a["reward_slope_second_half"] == 0.0
    assert a["acceptance_mean"] == 0.7 and a["acceptance_min"] == 0.6
    assert a["acceptance_p5_over_steps"] == 0.6  # numpy's linear percentile of four 0.6s and four 0.8s
    assert a["steps_capped_gt_0"] == 1.0 and a["steps_capped_gt_0.01"] == 1.0 and a["steps_capped_gt_0.05"] == 0.5
    assert d["steps_capped_gt_0"] == 0.0 and a["tis_capped_max"] == 0.06
    assert d["tokens_per_sample_mean"] == 8.0 and a["tokens_per_sample_mean"] == 24.0
    assert d["corr_acceptance_tokens_per_sample"] is None  # constant acceptance: no correlation, no warning
    assert d["weight_versions_ok"] and a["weight_versions_ok"]
    vs = report["versus_dense"]["aggressive"]
    assert vs["reward_minus_ref_windows"] == [-0.25, -0.5] and vs["reward_minus_ref_mean"] == -0.375
    assert vs["acceptance_minus_ref_mean"] == -0.3
    assert "| reward_windows | 0.25 0.75 | 0 0.25 |" in rr.markdown(report)


def test_a_stale_weight_version_is_reported(tmp_path):
    rows = [_row(s, 0.5, 1.0, 0.0, 8) for s in range(1, 4)]
    rows[1]["sampled_weight_versions"] = ["0"]  # step 2 sampled the initial weights: the push did not land
    _write(tmp_path, "dense", rows)
    assert rr.build(tmp_path, ["dense"], "dense")["arms"]["dense"]["weight_versions_ok"] is False


def test_main_writes_both_files_and_names_a_missing_arm(tmp_path, capsys):
    _write(tmp_path, "dense", [_row(s, 0.5, 1.0, 0.0, 8) for s in range(1, 3)])
    with pytest.raises(SystemExit):
        rr.main([str(tmp_path), "--arms", "dense", "calibrated"])
    assert "calibrated" in capsys.readouterr().err
    assert rr.main([str(tmp_path), "--arms", "dense", "--out", str(tmp_path / "o")]) == 0
    assert json.loads((tmp_path / "o" / "grpo_run_report.json").read_text())["arms"]["dense"]["steps"] == 2
    assert (tmp_path / "o" / "grpo_run_report.md").read_text().startswith("Per arm")


@pytest.mark.skipif(not RUN1.is_dir(), reason="run1 not committed here")
def test_committed_run1_tables_match_the_script(tmp_path):
    """run1's committed tables are what the script computes from run1's steps files, and they agree with
    the runner's own summary where both report the same quantity."""
    assert rr.main([str(RUN1), "--out", str(tmp_path)]) == 0
    fresh = json.loads((tmp_path / "grpo_run_report.json").read_text())
    committed = json.loads((RUN1 / "grpo_run_report.json").read_text())
    assert fresh["arms"] == committed["arms"] and fresh["versus_dense"] == committed["versus_dense"]
    summary = json.loads((RUN1 / "grpo_summary.json").read_text())["arms"]
    for arm, table in fresh["arms"].items():
        assert table["reward_windows"][0] == summary[arm]["reward_first"]
        assert table["reward_windows"][-1] == summary[arm]["reward_last"]
        assert table["acceptance_min"] == pytest.approx(summary[arm]["acceptance_min"], abs=1e-4)
        assert table["weight_versions_ok"] is summary[arm]["weight_versions_ok"] is True
