"""``benchmarks/replay_timing.py``: which replays it counts as the batch's graph, profiled or not, and what it sets
beside the trace; and its hook (``benchmarks/replay_timing_hook/sitecustomize.py``) stays out of every process that
does not ask for it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import replay_timing  # noqa: E402


def _write(folder: Path, pid: int, rows: list[tuple]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"replays-{pid}.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))


def test_summary_takes_the_profiled_graph_and_sets_its_replays_against_the_trace(tmp_path):
    # graph 7 is the batch's (the profiler saw it); graph 3 (a smaller batch, early) must not count
    _write(tmp_path, 11, [(1.0, 3, 0, 900.0, 20.0, "nan"), (2.0, 7, 0, 5400.0, 30.0, 80.0),
                          (2.1, 7, 0, 5410.0, 31.0, 82.0), (2.2, 7, 1, 5500.0, 90.0, 85.0),
                          (2.3, 7, 0, 5420.0, 29.0, 84.0), (2.4, 7, 1, 5520.0, 95.0, 81.0),
                          (2.5, 7, 0, 5430.0, 28.0, 83.0)])
    _write(tmp_path, 12, [("not", "a", "row")])
    rows = replay_timing.read_replays(tmp_path)
    assert len(rows) == 7
    kernels = [{"ts": 0.0, "dur": 3000.0}, {"ts": 3001.0, "dur": 2300.0}]
    got = replay_timing.summary(rows, kernels, step_us=5600.0)
    assert (got["replays_unprofiled"], got["replays_profiled"]) == (4, 2)
    assert got["gpu_us_unprofiled"] == 5415.0 and got["gpu_us_profiled"] == 5510.0
    assert got["host_launch_us_profiled"] == 92.5 and got["between_replays_us_unprofiled"] == 82.5
    assert (got["trace_busy_us"], got["trace_span_us"]) == (5300.0, 5301.0)
    assert got["unprofiled_minus_busy_us"] == 115.0 and got["served_step_us"] == 5600.0
    assert (got["gpu_us_just_before_profile"], got["gpu_us_just_after_profile"]) == (5405.0, 5430.0)
    assert got["just_before_minus_busy_us"] == 105.0


def test_summary_without_a_profiled_replay_says_so(tmp_path):
    _write(tmp_path, 1, [(1.0, 7, 0, 5400.0, 30.0, 80.0)])
    got = replay_timing.summary(replay_timing.read_replays(tmp_path), [], None)
    assert got["replays_profiled"] == 0 and got["gpu_us_unprofiled"] is None
    assert "unprofiled_minus_busy_us" not in got


@pytest.mark.parametrize("env_value", [None, ""])
def test_hook_is_inert_unless_asked(env_value):
    env = {k: v for k, v in os.environ.items() if k != "SPARROW_REPLAY_TIMING_DIR"}
    if env_value is not None:
        env["SPARROW_REPLAY_TIMING_DIR"] = env_value
    env["PYTHONPATH"] = str(replay_timing.HOOK_DIR)
    code = "import sys, sitecustomize; print(sitecustomize.__file__); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    path, torch_loaded = out.split()
    assert Path(path).parent == replay_timing.HOOK_DIR and torch_loaded == "False"


CALL45 = REPO / "benchmarks" / "results" / "speed" / "call45"
RUNS = [CALL45 / "2_replay_timing" / "replay_timing", CALL45 / "3_dense_clocks_sparse_rollout" / "replay_timing_dense"]


@pytest.mark.parametrize("run", RUNS, ids=lambda d: d.parent.name)
def test_committed_timings_are_what_the_committed_replays_and_traces_give(run):
    import json
    committed = json.loads((run / "replay_timing.json").read_text())
    for entry in committed["backends"]:
        assert replay_timing.backend_timing(entry["backend"], run, committed["batch"]) == entry


def test_committed_clock_report_is_what_the_script_prints(monkeypatch):
    import contextlib
    import io
    import replay_clocks
    monkeypatch.chdir(REPO)
    run = CALL45 / "3_dense_clocks_sparse_rollout"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert replay_clocks.main([str(run / "replay_timing_dense"), str(run / "smi.csv"), "--context", "32768"]) == 0
    table = out.getvalue().split("\n\n")[0]
    assert table.count("\n") == 12  # header, rule, 11 windows of 250 of the 2,995 replays
    assert (CALL45 / "replay_clocks.md").read_text().endswith(out.getvalue())

