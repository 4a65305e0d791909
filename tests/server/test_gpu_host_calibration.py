"""The GPU host's calibration chain at small scale on CPU, a reference server standing in for SGLang:
``sparrow-server calibrate --server`` (fixed budgets, exact verification, registered schedule), then
benchmarks/gpu_host/heldout.py (calibrated vs same-cost fixed budget, exact p5 per bin, live
verification through /metrics) and benchmarks/gpu_host/throughput.py (dense vs sparse on one server)."""
from __future__ import annotations

import asyncio
import json
import sys

import httpx
import pytest

from helpers.live_server import live_server
from helpers.server_util import REPO
from helpers.tiny_models import TINY_VOCAB, load_plain, save_tiny_model
from sparrow_server.cli import main as cli_main
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.schedule import load_schedule

sys.path.insert(0, str(REPO / "benchmarks" / "gpu_host"))
import heldout  # noqa: E402
import throughput  # noqa: E402

TOTAL = 160

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _prompts(path, n, offset):
    path.write_text("".join(json.dumps({"id": f"q{i}", "input_ids": [(i * 11 + j * 3 + offset) % (TINY_VOCAB - 1)
                                                                     for j in range(30 + 4 * i)]}) + "\n"
                            for i in range(n)))
    return path


def test_calibrate_heldout_and_throughput_against_a_server(tmp_path, monkeypatch, capsys):
    model_dir = save_tiny_model(tmp_path / "tiny", "llama")
    calib, held = _prompts(tmp_path / "calib.jsonl", 3, 1), _prompts(tmp_path / "held.jsonl", 2, 5)
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=8192)
    try:
        with live_server(create_app(engine, verify_fraction=0.0)) as server:
            out = tmp_path / "smol-cal.json"
            rc = cli_main(["calibrate", "--server", server.url, "--register", server.url, "--model", str(model_dir),
                           "--prompts", str(calib), "--budgets", "64,96,128", "--max-new-tokens", "120",
                           "--bin-tokens", "64", "--threshold", "0.7", "--ignore-eos", "--out", str(out),
                           "--no-plots", "--no-progress"])
            assert rc == 0
            schedule = load_schedule(out)
            assert schedule.name == "smol-cal" and len(schedule.budgets_tokens) >= 1
            report = json.loads((tmp_path / "smol-cal-report" / "report.json").read_text())
            assert report  # the table the GPU run commits
            assert "registered schedule 'smol-cal'" in capsys.readouterr().out
            got = httpx.get(f"{server.url}/schedules/smol-cal").json()
            assert got["budgets_tokens"] == list(schedule.budgets_tokens)

            monkeypatch.setattr(sys, "argv", ["heldout.py", "--server", server.url, "--model", str(model_dir),
                                              "--schedule", str(out), "--prompts", str(held), "--target", "0.7",
                                              "--total-tokens", str(TOTAL), "--per-schedule", "2", "--bin-tokens", "64",
                                              "--verify-rollouts", "1", "--verify-new-tokens", "40", "--device", "cpu",
                                              "--out", str(tmp_path / "heldout.json")])
            assert heldout.main() == 0
            res = json.loads((tmp_path / "heldout.json").read_text())
            names = list(res["p5_by_bin"])
            assert names == ["xe-heldout-smol-cal", f"xe-fixed-{res['matched_fixed_budget']}"]
            assert res["matched_fixed_budget"] % 16 == 0 and 0 < res["schedule_mean_cost_tokens"] <= TOTAL
            for bins in res["p5_by_bin"].values():
                assert bins and all(0 <= b["p5"] <= 1 and b["ci"][0] <= b["p5"] <= b["ci"][1] for b in bins)
            live = res["live_verification"]
            assert live["rollouts"] == 1 and any("_count" in line and 'schedule="smol-cal"' in line
                                                 for line in live["metrics"]), live

            monkeypatch.setattr(sys, "argv", ["throughput.py", "--server", server.url, "--model", str(model_dir),
                                              "--schedule", str(out), "--prompts", str(held), "--batch", "2",
                                              "--total-tokens", "96", "--out", str(tmp_path / "tp.json")])
            assert throughput.main() == 0
            tp = json.loads((tmp_path / "tp.json").read_text())
            assert [r["schedule"] for r in tp["runs"]] == ["dense", "smol-cal"]
            assert all(r["generated_tokens"] == 2 * 96 - 30 - 34 for r in tp["runs"]) and tp["speedup"] > 0
    finally:
        asyncio.run(engine.shutdown())
