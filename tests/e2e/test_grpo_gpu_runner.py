"""``benchmarks/gpu_host/grpo_gpu.py`` (GPU only) checked on CPU: it starts (``--help``), the trainers it
launches parse into NCCL-from-cuda:0 loops on distinct ports, the aggressive schedule really drops pages at
the task's lengths while the calibrated one is the committed file, and its report (``grpo_report.py``)
summarises and plots fake ``steps.jsonl`` files and packs at most 8 files."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "gpu_host"), str(ROOT / "examples")]
grpo_gpu = importlib.import_module("grpo_gpu")
grpo_report = importlib.import_module("grpo_report")
grpo_loop = importlib.import_module("grpo_loop")

PROMPT_TOKENS = 42  # the shortest addition prompt with SmolLM2's chat template


def test_help_runs_without_a_gpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_host/grpo_gpu.py"), "--help"],
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "--pack" in out.stdout and "calibrated" in out.stdout


def test_missing_model_dir_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        grpo_gpu.parse_args([str(tmp_path / "w"), "--model-dir", str(tmp_path / "nothing")])
    assert "nothing" in capsys.readouterr().err


def test_trainers_sync_over_nccl_from_gpu0_on_distinct_ports(tmp_path, monkeypatch):
    config = grpo_gpu.RunConfig(out=tmp_path, model_dir=tmp_path / "m")
    loops = [grpo_loop.parse_args(grpo_gpu.trainer_cmd(config, arm, f"http://127.0.0.1:{9000 + i}", i)[2:])
             for i, arm in enumerate(grpo_gpu.ARMS)]
    assert {(c.device, c.weight_sync, c.sync_backend, c.sync_initial) for c in loops} == {("cuda:0", "distributed", "nccl", True)}
    assert len({c.master_port for c in loops}) == 3 and len({c.out_dir for c in loops}) == 3
    assert [c.schedule for c in loops] == ["dense", "grpo-calibrated", "grpo-aggressive"]
    assert {(c.steps, c.seed, c.max_new_tokens, c.context_examples) for c in loops} == {(100, 0, 128, 48)}
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")  # the GPU host's kit must stay importable by the trainers
    assert grpo_gpu.trainer_pythonpath().split(os.pathsep) == [str(ROOT), "/tmp/site"]
    args = grpo_gpu.server_args(config)
    assert args[0] == "--" and args[args.index("--mem-fraction-static") + 1] == "0.2" and "--max-total-tokens" in args


def test_schedules_aggressive_drops_pages_calibrated_is_the_committed_file(tmp_path):
    from sparrow_server.sparsity.schedule import schedule_from_dict

    config = grpo_gpu.RunConfig(out=tmp_path, model_dir=tmp_path)
    found = grpo_gpu.schedules(config)
    aggressive, calibrated = (schedule_from_dict({**found[k], "name": k}) for k in ("aggressive", "calibrated"))
    assert aggressive.budgets_tokens == (48,) and 48 < PROMPT_TOKENS + 16  # bites from the first generated tokens
    assert calibrated.budgets_tokens == tuple(json.loads(grpo_gpu.CALIBRATED.read_text())["budgets_tokens"])
    assert found["dense"] is None
    with pytest.raises(ValueError, match="aggressive_budget = 40"):
        grpo_gpu.RunConfig(out=tmp_path, model_dir=tmp_path, aggressive_budget=40)


def _row(step: int, reward: float, acc: float, capped: float) -> dict:
    return {"step": step, "reward_mean": reward, "acceptance_est": acc, "tis_capped_frac": capped,
            "kv_budget_tokens_mean": 48.0, "completion_tokens": 100, "rollout_s": 1.0, "train_s": 0.5, "sync_s": 0.1,
            "sampled_weight_versions": [str(step - 1)]}


def test_report_summarises_plots_and_packs(tmp_path):
    arms = {"dense": [_row(s, 0.1 + 0.01 * s, 1.0, 0.0) for s in range(1, 31)],
            "calibrated": [_row(s, 0.1 + 0.01 * s, 0.99, 0.01) for s in range(1, 31)],
            "aggressive": [_row(s, 0.3 - 0.01 * s, 0.8 - 0.01 * s, 0.2) for s in range(1, 21)]}
    for name, rows in arms.items():
        (tmp_path / name).mkdir()
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (tmp_path / name / "steps.jsonl").write_text(text + ('{"step": 99, "rew' if name == "aggressive" else ""))
        (tmp_path / name / "trainer.log").write_text("log\n")
    (tmp_path / "server-dense.log").write_text("log\n")
    summary = grpo_report.write_report(tmp_path, list(arms))
    dense, aggressive = summary["arms"]["dense"], summary["arms"]["aggressive"]
    assert dense["steps"] == 30 and aggressive["steps"] == 20  # the torn last line is dropped
    assert dense["reward_first"] == pytest.approx(0.155) and dense["reward_last"] == pytest.approx(0.355)
    assert aggressive["acceptance_last"] == pytest.approx(0.645) and aggressive["tis_capped_max"] == 0.2
    assert dense["weight_versions_ok"] and dense["step_s_mean"] == pytest.approx(1.6)
    assert (tmp_path / "grpo_steps.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "grpo_summary.json").read_text())["arms"]["calibrated"]["acceptance_first"] == 0.99
    packed = grpo_gpu.pack(tmp_path, tmp_path / "out")
    assert len(packed) <= 8 and all(p.is_file() for p in packed)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "grpo_logs.tar.xz", "grpo_steps.png", "grpo_summary.json", "steps-aggressive.jsonl", "steps-calibrated.jsonl",
        "steps-dense.jsonl"]
