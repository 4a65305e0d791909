"""``benchmarks/gpu_host/live_tail.py`` (the live-tail check, ``host.sh 7``) checked on CPU: ``--help`` answers
without importing torch or numpy, the GPU defaults (stride and rollouts from the CPU analysis, one CUDA-graph
batch, the kept rows fit their memory bound, the server gets the stride), the analysis on synthetic rollouts
with a jittered subsample (the split into rounding and sampling, the verdicts: pass, fail, insufficient), and
an end-to-end dry run on the real SmolLM2 through ``serve --engine reference`` (which verifies every position
exactly: the live p5 must equal the oracle's to float precision in every bin), at most 8 packed files, and
host.sh stage 7."""
from __future__ import annotations

import importlib
import json
import random
import sys

import numpy as np
import pytest

from helpers.gpu_host_runs import (GPU_HOST, assert_ran, embedded_model_dir, heavy_imports, help_cpu_s, help_text,
                                   host_stage, packed, run_script)
from helpers.server_util import free_port  # fixed ports collide with another run of these tests on the machine

sys.path[:0] = [str(GPU_HOST)]
live_tail = importlib.import_module("live_tail")
report = importlib.import_module("live_tail_report")


def test_help_is_fast_and_imports_nothing_heavy():
    text = help_text("live_tail.py")
    assert "--stride" in text and "--pack" in text and "oracle" in text
    assert help_cpu_s("live_tail.py") < 1.0
    assert heavy_imports("live_tail") == []


@pytest.mark.parametrize("changes, match", [
    (dict(budget=40), "budget = 40"),
    (dict(total_tokens=520), "total_tokens = 520"),
    (dict(stride=0), "stride = 0"),
    (dict(floor_rollouts=-1), "floor_rollouts = -1"),
    (dict(engine="vllm"), "engine = 'vllm'"),
    (dict(oracle_reserve_s=600), "oracle_reserve_s = 600"),
])
def test_config_errors_name_the_field(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        live_tail.RunConfig(out=tmp_path, model_dir=tmp_path, **changes)


def test_gpu_defaults_fit_one_graph_batch_the_row_memory_and_the_call(tmp_path):
    from sparrow_server.sglang_plugin.frontend.host import sglang_argv
    from sparrow_server.cli import build_parser, command_of
    from sparrow_server.sparsity.schedule import budget_pages

    config = live_tail.RunConfig(out=tmp_path, model_dir=tmp_path)
    assert (config.engine, config.device, config.total_tokens, config.bin_tokens) == ("sglang", "cuda", 8160, 512)
    assert config.stride == 4 and config.rollouts >= 48  # from benchmarks/results/fidelity/live_tail (s = 4, jittered)
    assert config.concurrency <= config.cuda_graph_max_bs  # past the largest graph SGLang decodes eagerly
    rows_mib = config.concurrency * (config.total_tokens // config.stride) * 49152 * 2 / 2**20
    assert rows_mib <= config.exact_max_mib  # every verified request's rows fit until its verify pass
    checks = live_tail.schedules(config)
    assert budget_pages(checks["check"], 8160, 60) == 32 < budget_pages(checks["floor"], 8160, 60) == 8160 // 16
    assert checks["check"].bin_tokens == checks["floor"].bin_tokens == 512
    cmd, env = live_tail.server_command(config)
    assert env == {"SPARROW_EXACT_STRIDE": "4", "SPARROW_EXACT_MAX_MIB": str(config.exact_max_mib)}
    assert cmd[cmd.index("--verify-fraction") + 1] == "0"
    serve = cmd[cmd.index("serve"):]
    args, extra = build_parser(command_of(serve)).parse_known_args(serve)
    argv = sglang_argv(args.model, args.host, args.port, (), args.max_batch_size, tuple(a for a in extra if a != "--"))
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "64" and argv[argv.index("--max-running-requests") + 1] == "64"
    assert config.deadline_s <= 9 * 60 - 30


# ----- the analysis on synthetic rollouts --------------------------------------------------------------

def _records(n_rollouts=40, n=1024, prompt=60, stride=4, noise=0.0, schedule="s", arm="check", seed=0):
    """Rollouts with a looping tail (the GPU study's pattern); the server's values at jittered kept positions are
    the oracle's plus ``noise``."""
    from sparrow_server.stats.exact_subsample import choose_kept_positions

    rng, prng = np.random.default_rng(seed), random.Random(seed)
    out = []
    for i in range(n_rollouts):
        oracle = np.clip(rng.beta(6, 1, n) - 0.2 * (np.arange(n) % 2) * (np.arange(n) > n // 2), 0, 1)
        kept = choose_kept_positions(stride, prng)
        pos = kept.positions(n)
        sub = {**kept.to_dict(), "positions": pos.tolist(), "acceptance": np.clip(oracle[pos] + noise, 0, 1).tolist(),
               "missing": []}
        out.append({"arm": arm, "schedule": schedule, "prompt_ids": [1] * prompt, "completion_ids": [2] * n,
                    "meta": {"exact_subsample": sub, "acceptance_kind": "exact"}, "oracle": oracle.tolist()})
    return out


def _live(records, bin_tokens, schedule="s"):
    """What the server's monitor publishes: the p5 of each bin's kept values and the interval."""
    from sparrow_server.monitor.metrics import AcceptanceMetrics
    from prometheus_client import CollectorRegistry, generate_latest
    from sparrow_server.sparsity.schedule import Schedule

    registry = CollectorRegistry()
    metrics = AcceptanceMetrics(registry)
    sched = Schedule(name=schedule, budgets_tokens=(64,), bin_tokens=bin_tokens)
    for r in records:
        sub = r["meta"]["exact_subsample"]
        metrics.observe(sched, np.asarray(sub["acceptance"]), len(r["prompt_ids"]) + np.asarray(sub["positions"]))
    return report.live_series(generate_latest(registry).decode())


def test_analysis_splits_the_difference_into_rounding_and_sampling_and_passes_within_the_band():
    records = _records(noise=-0.004)
    arms = report.analyse(records, _live(records, 256), 256, 0.02)
    check = arms["check"]
    assert check["verdict"] == "pass" and not check["reasons"] and check["scored"] == 40
    judged = [b for b in check["bins"] if b["judged"]]
    assert len(judged) == 5  # basis 60..1083 in 256-token bins: 0 (196 tokens/rollout) .. 4 (60)
    for b in judged:
        assert b["diff"] == pytest.approx(b["rounding"] + b["sampling"])
        assert b["rounding"] == pytest.approx(-0.004, abs=2e-3)  # the server's constant offset
        assert b["live_matches_meta"] and b["within"]
    assert check["per_token"]["mean_signed"] == pytest.approx(-0.004, abs=1e-3) and check["per_token"]["n"] == 40 * 256
    assert check["interval_coverage"] >= 0.6


def test_analysis_fails_a_bin_outside_the_band_and_says_which():
    records = _records(noise=-0.05)
    check = report.analyse(records, _live(records, 256), 256, 0.02)["check"]
    assert check["verdict"] == "fail" and check["failing_bins"] and check["max_abs_rounding"] > 0.02


def test_analysis_is_insufficient_with_a_rollout_missing_its_oracle_or_its_answer_or_a_bin_unpublished():
    records = _records()
    live = _live(records, 256)
    unscored = [dict(r) for r in records]
    unscored[3] = {k: v for k, v in unscored[3].items() if k != "oracle"}
    check = report.analyse(unscored, live, 256, 0.02)["check"]
    assert check["verdict"] == "insufficient" and "not scored" in check["reasons"][0]
    failed = records[:-1] + [{**{k: records[-1][k] for k in ("arm", "schedule", "prompt_ids")}, "error": "timeout"}]
    assert "not verified" in report.analyse(failed, live, 256, 0.02)["check"]["reasons"][0]
    dropped = {s: {b: v for b, v in bins.items() if b != 2} for s, bins in live.items()}
    check = report.analyse(records, dropped, 256, 0.02)["check"]
    assert check["verdict"] == "insufficient" and "[2]" in check["reasons"][0]


def test_a_few_missing_kept_positions_are_noted_many_make_it_insufficient():
    records = _records()

    def drop(sub, n):  # the last n kept positions come back without a value
        sub["missing"] = sub["positions"][-n:]
        sub["positions"], sub["acceptance"] = sub["positions"][:-n], sub["acceptance"][:-n]

    drop(records[0]["meta"]["exact_subsample"], 1)
    drop(records[1]["meta"]["exact_subsample"], 2)  # 3 of 10,240: left out on both sides
    check = report.analyse(records, _live(records, 256), 256, 0.02)["check"]
    assert check["verdict"] == "pass" and check["notes"] == ["3 of 10240 kept positions without a value (left out on both sides)"]
    drop(records[2]["meta"]["exact_subsample"], 200)
    check = report.analyse(records, _live(records, 256), 256, 0.02)["check"]
    assert check["verdict"] == "insufficient" and "without a value" in check["reasons"][0]


def test_without_a_subsample_the_kept_positions_are_all_positions():
    records = _records(n_rollouts=4)
    for r in records:
        del r["meta"]["exact_subsample"]
    kept, values, missing = report.kept_of(records[0])
    assert kept.tolist() == list(range(1024)) and values is None and missing.size == 0


def test_the_oracle_worker_scores_the_check_arm_first_and_stops_at_the_reserve(tmp_path, monkeypatch):
    import types

    import cross_engine
    import sparrow_server.models as models

    order = []

    def fake_oracle(model, prompt_ids, completion_ids, schedule, scorer=None):
        order.append(schedule)
        clock.now += 10.0
        if completion_ids == [666]:
            raise RuntimeError("boom")
        return np.full(len(completion_ids), 0.5), np.zeros(len(completion_ids))

    class _Clock:
        now = 0.0

        def elapsed(self):
            return self.now

    clock = _Clock()
    monkeypatch.setattr(cross_engine, "oracle_rollout", fake_oracle)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: types.SimpleNamespace(model=object()))
    config = live_tail.RunConfig(out=tmp_path, model_dir=tmp_path, device="cpu", deadline_s=100, oracle_reserve_s=55)
    worker = live_tail.OracleWorker(config, clock, {"check": "C", "floor": "F"})
    rec = lambda arm, ids=(1, 2): {"arm": arm, "prompt_ids": [0], "completion_ids": list(ids)}  # noqa: E731
    for i, r in enumerate([rec("floor"), rec("floor"), rec("check"), rec("check", (666,)), rec("check"),
                           {"arm": "check", "error": "timeout"}, rec("check"), rec("check")]):
        worker.put(i, r)  # all queued before the thread starts: priority decides the order
    worker.start()
    worker.finish()
    # check-arm rollouts first (2, 3, 4, 6, 7 in order), the failed answer (5) never queued; at 50 s the reserve
    # (100 - 55) is passed: 5 taken, the rest skipped
    assert order == ["C"] * 5 and sorted(worker.values) == [2, 4, 6, 7] and worker.skipped == 2
    assert "boom" in worker.errors[3] and worker.error is None


# ----- end to end on CPU ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    model_dir = embedded_model_dir()
    tmp = tmp_path_factory.mktemp("live-tail-dry")
    out = run_script("live_tail.py", str(tmp / "work"), "--pack", str(tmp / "out"),
                     "--model-dir", str(model_dir), "--engine", "reference", "--device", "cpu",
                     "--threads", "1", "--port", str(free_port()), "--total-tokens", "160", "--budget", "64", "--bin-tokens", "64",
                     "--rollouts", "8", "--floor-rollouts", "2", "--deadline-s", "800", "--server-timeout-s", "240")
    return tmp, out


def test_dry_run_live_p5_equals_the_oracle_in_every_judged_bin(dry_run):
    tmp, out = dry_run
    assert_ran(out)
    summary = json.loads((tmp / "work" / "live_tail.json").read_text())
    check = summary["arms"]["check"]
    assert summary["verdict"] == check["verdict"] == "pass" and check["scored"] == check["verified"] == 8
    judged = [b for b in check["bins"] if b["judged"]]
    assert [b["from"] for b in judged] == [64, 128]  # basis ~60..159: bin 0 holds a few tokens per rollout
    for b in judged:  # the reference engine's verifier is the oracle's computation: equal up to float32
        assert abs(b["diff"]) < 1e-5 and b["sampling"] == 0.0 and b["kept_tokens"] == b["tokens"] >= 200
        assert b["live_low"] <= b["live_p5"] <= b["live_high"] and b["interval_covers"]
    assert 0.0 < min(b["oracle_p5"] for b in judged) < 0.95  # a 64-token budget at 160 tokens really drops pages
    floor = summary["arms"]["floor"]
    assert floor["schedule"] == "livetail-fixed-160" and floor["scored"] == 2
    assert all(b["oracle_p5"] > 0.9999 for b in floor["bins"])  # no page dropped: the oracle is dense
    rows = [json.loads(line) for line in (tmp / "work" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(len(r["prompt_ids"]) + len(r["completion_ids"]) == 160 for r in rows)
    assert len({tuple(r["completion_ids"]) for r in rows}) == 10  # seeded apart
    tokens = np.load(tmp / "work" / "live_tail_tokens.npz")
    assert tokens["oracle"].shape == tokens["basis"].shape == (sum(len(r["completion_ids"]) for r in rows),)
    assert not np.isnan(tokens["oracle"]).any() and tokens["kept"].all()
    assert "verdict **pass**" in (tmp / "work" / "live_tail.md").read_text()


def test_dry_run_packs_at_most_8_files(dry_run):
    tmp, _ = dry_run
    names, in_tar = packed(tmp / "out", "live_tail_logs.tar.xz")
    assert names == ["live_tail.json", "live_tail.md", "live_tail_logs.tar.xz", "live_tail_tokens.npz"]
    assert {"server.log", "rollouts.jsonl", "metrics.txt"} <= in_tar


def test_host_stage_7_runs_the_check_under_its_deadline():
    text, block = host_stage(7)
    assert 'timeout -s INT "$(left 5 590)" python3 benchmarks/gpu_host/live_tail.py' in block
    assert '--pack "$OUT"' in block and '--deadline-s "$(left 40 500)"' in block and "${LIVETAIL_ARGS:-}" in block
    assert "--port $PORT" in block  # PORT (and CUDA_VISIBLE_DEVICES) let it share a 2-GPU host with another stage
    assert 'model_dir)/config.json" ] || {' in block and "exit 3" in block  # a cold host says so
    assert "stage 1-8" in text and "stage must be 1-8" in text  # stage 8 (served_adapter.py) came after
