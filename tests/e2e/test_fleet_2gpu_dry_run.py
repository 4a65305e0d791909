"""``benchmarks/fleet_2gpu.py`` on CPU: its ``router`` and ``kill`` parts end to end against two
reference-engine servers behind the real sglang-router (``--engine reference``, small sizes), so the
GPU run's logic (exactly-once counting from the access logs, comparison with direct ``/rollout``,
SIGKILL of a worker's process group, restart, rejoin) is checked before it costs device time.

50-70 s on the 2-core development machine (two server starts, one restart, ~40 requests each way).
The ``nccl`` part needs two GPUs: here only its import and the script's ``--help``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.fleet_util import router_available

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fleet_2gpu.py"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def test_help_and_parts_import():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=_env(),
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--parts" in done.stdout and "--engine" in done.stdout
    # the nccl part imports torch/SGLang only when it runs: importing it works without a GPU
    code = "import sys; sys.path[:0] = ['benchmarks']; import fleet_gpu.nccl_part as n; print(n.PAUSE_MODE)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "retract", done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not router_available(), reason="sglang-router is not installed (pip install sglang-router)")
def test_router_and_kill_parts_on_reference_servers(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--engine", "reference", "--parts", "router,kill"],
                          capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    report = json.loads((tmp_path / "fleet_2gpu_router_kill.json").read_text())
    assert done.returncode == 0 and report["ok"], done.stdout[-4000:] + done.stderr[-4000:]
    router, kill = report["router"], report["kill"]
    n = report["sizes"]["requests"]
    two = router["two_workers"]
    assert two["completed"] == n == sum(two["per_worker_generate_requests"]) == two["equal_to_direct_rollout"]
    assert min(two["per_worker_generate_requests"]) > 0 and two["schedule_reported_wrong"] == 0
    assert router["one_worker"]["completed"] == n and two["latency_p99_s"] >= two["latency_p50_s"] > 0
    assert kill["outcomes"]["hung"] == 0 and kill["outcomes"]["unclear_failures"] == 0
    assert {"dropped_after_s", "restart_to_healthy_s", "rejoined_after_s"} <= set(kill["events"])  # in that order
    assert kill["events"]["dropped_after_s"] < kill["events"]["rejoined_after_s"]
    assert kill["after_restart"]["restarted_worker_generate_requests"] > 0
    assert (tmp_path / "server-1-restart.log").exists()
