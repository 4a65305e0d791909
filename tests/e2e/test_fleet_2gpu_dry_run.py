"""``benchmarks/fleet_2gpu.py`` on CPU: its ``router`` and ``kill`` parts end to end against two
reference-engine servers behind the real sglang-router (``--engine reference``, small sizes), so the
GPU run's logic (exactly-once counting from the access logs, comparison with direct ``/rollout``,
SIGKILL of a worker's process group, restart, rejoin) is checked before it costs device time.
The reference engine has no deterministic mode, so the dry run compares with the bf16 tolerance; the
GPU fleet's deterministic servers and the exact rule are checked without servers (fast tests below).

50-70 s on the 2-core development machine (two server starts, one restart, ~40 requests each way).
The ``nccl`` part needs two GPUs: here only its import and the script's ``--help``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from sparrow_server.stats.greedy_agreement import Run

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
    assert report["deterministic"] is False and two["agreement_rule"].startswith("bf16 tolerance")
    assert two["completed"] == n == sum(two["per_worker_generate_requests"]) == two["equal_to_direct_rollout"]
    assert min(two["per_worker_generate_requests"]) > 0 and two["schedule_reported_wrong"] == 0
    assert router["one_worker"]["completed"] == n and two["latency_p99_s"] >= two["latency_p50_s"] > 0
    assert kill["outcomes"]["hung"] == 0 and kill["outcomes"]["unclear_failures"] == 0
    assert {"dropped_after_s", "restart_to_healthy_s", "rejoined_after_s"} <= set(kill["events"])  # in that order
    assert kill["events"]["dropped_after_s"] < kill["events"]["rejoined_after_s"]
    assert kill["after_restart"]["restarted_worker_generate_requests"] > 0
    assert (tmp_path / "server-1-restart.log").exists()


@pytest.fixture
def fleet_gpu(monkeypatch):
    """``benchmarks/fleet_gpu``'s modules, imported as ``fleet_2gpu.py`` imports them."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from fleet_gpu import common, router_part

    return types.SimpleNamespace(common=common, router_part=router_part)


@pytest.mark.parametrize("deterministic", [True, False])
def test_gpu_servers_start_deterministic_unless_told_not_to(fleet_gpu, monkeypatch, tmp_path, deterministic):
    """Both workers (the direct reference is worker 0) get SGLang's flag, and their restarts too; the
    reference engine has no such mode, so its fleet is never deterministic."""
    c = fleet_gpu.common
    fleet = c.Fleet("sglang", c.GPU_SIZES, tmp_path, tmp_path, tmp_path / "w", [], deterministic)
    for i in (0, 1):
        cmd = fleet.new_server(i, 31400 + i, tmp_path / f"s{i}.log").cmd
        assert ("--enable-deterministic-inference" in cmd) == deterministic and "--attention-backend" not in cmd
    assert fleet.agreement_rule == c.AGREEMENT_RULES[deterministic]
    reference = c.Fleet("reference", c.SMALL_SIZES, tmp_path, tmp_path, tmp_path / "w", [], False)
    assert "--enable-deterministic-inference" not in reference.new_server(0, 1, tmp_path / "r.log").cmd
    monkeypatch.setattr(c.S, "write_tiny_checkpoint", lambda path, **kw: path)  # no checkpoint written
    assert c.Fleet.create("reference", c.SMALL_SIZES, tmp_path, tmp_path, deterministic=True).deterministic is False
    assert c.Fleet.create("sglang", c.GPU_SIZES, tmp_path, tmp_path, deterministic=deterministic).deterministic \
        == deterministic


def _answers(c, sizes, nudge: int | None):
    """Direct runs and routed outcomes of the router part's load, equal except, with ``nudge``, one
    logprob of that outcome moved by one float32 step (tokens equal: no diagnosis over HTTP)."""
    import numpy as np

    direct, outcomes = {}, []
    for p in range(sizes.distinct_prompts):
        for s in sizes.schedules:
            seed = 1000 * p + sizes.schedules.index(s)
            toks = [(seed + 7 * j) % 4096 for j in range(sizes.new_tokens)]
            direct[(p, s)] = Run([toks], [[-0.01 * (j + 1) - seed * 1e-4 for j in range(sizes.new_tokens)]],
                                 [[1.5] * sizes.new_tokens])
    for req in c.load_requests(sizes, "two"):
        ref = direct[(req.prompt, req.schedule)]
        lps = list(ref.logprobs[0])
        if req.index == nudge:
            lps[3] = float(np.nextafter(np.float32(lps[3]), np.float32(0.0)))
        outcomes.append({"rid": req.rid, "schedule": req.schedule, "prompt": req.prompt, "status": 200, "id": req.rid,
                         "output_ids": list(ref.tokens[0]), "ran_schedule": None,
                         "run": Run(ref.tokens, [lps], ref.top2_gap)})
    return direct, outcomes


def test_the_router_part_demands_bit_identical_answers_with_deterministic_inference(fleet_gpu):
    """One logprob an ulp off: the exact rule (deterministic servers) fails the part and names its
    schedule; the bf16 tolerance (``--no-deterministic``) accepts it; identical answers pass both."""
    c, rp = fleet_gpu.common, fleet_gpu.router_part
    sizes = c.SMALL_SIZES
    per_worker = [sizes.requests // 2, sizes.requests - sizes.requests // 2]
    for deterministic in (True, False):
        fleet = types.SimpleNamespace(sizes=sizes, deterministic=deterministic, servers=[],
                                      agreement_rule=c.AGREEMENT_RULES[deterministic])
        direct, outcomes = _answers(c, sizes, nudge=None)
        rec: dict = {}
        rp.check_exactly_once(fleet, outcomes, per_worker, direct, rec, ps=[])
        assert rec["agree_with_direct_rollout"] == sizes.requests and rec["agreement_rule"] == fleet.agreement_rule
        direct, outcomes = _answers(c, sizes, nudge=4)
        rec = {}
        if deterministic:
            with pytest.raises(AssertionError, match="1 router answers break the rule"):
                rp.check_exactly_once(fleet, outcomes, per_worker, direct, rec, ps=[])
            nudged = outcomes[4]["schedule"]
            assert rec["agree_per_schedule"][nudged] == [sizes.requests // 3 - 1, sizes.requests // 3]
            assert "logprobs differ from position 3" in rec["disagreeing"][0]["problems"][0]
            # diagnosed although its tokens are equal (no server here to send it to again)
            assert [d["rid"] for d in rec["differing_diagnosis"]] == [outcomes[4]["rid"]]
            assert rec["differing_diagnosis"][0]["exact_problems"] == rec["disagreeing"][0]["problems"]
        else:
            rp.check_exactly_once(fleet, outcomes, per_worker, direct, rec, ps=[])
            assert rec["agree_with_direct_rollout"] == sizes.requests
        assert rec["equal_to_direct_rollout"] == sizes.requests  # token equality says nothing here
