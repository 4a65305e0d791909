"""``benchmarks/gpu_host/served_adapter.py`` (the DistillSparse adapter served, ``host.sh 8``) checked on CPU:
``--help`` answers without importing torch or numpy, the GPU command (LoRA on SGLang's pool for the adapter's
modules and rank, the exact subsample, through the real CLI), the distill run's summary setting the defaults, the
report's autopilot part on synthetic tails (the product's controller decides: yes / no / undecided), and two
end-to-end dry runs through ``serve --engine reference`` on a tiny random Llama with SmolLM2's tokenizer: a random
adapter (its arm differs from the same budget without it) and a zero-initialised one (its arm is the same, token
for token and value for value), at most 8 packed files, and host.sh stage 8."""
from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.gpu_host_runs import (DRY_ENV, GPU_HOST, embedded_model_dir, heavy_imports, help_cpu_s, help_text,
                                   host_stage, packed, script_cmd)
from helpers.server_util import free_port  # fixed ports collide with another run of these tests on the machine

sys.path[:0] = [str(GPU_HOST)]
served_adapter = importlib.import_module("served_adapter")
served_report = importlib.import_module("served_report")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _fake_adapter(path: Path, rank: int = 16) -> Path:
    """What read_adapter_metadata checks (the weights file only has to exist for the command line)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank,
                                                          "target_modules": TARGETS}))
    (path / "adapter_model.safetensors").write_bytes(b"")
    return path


def test_help_is_fast_and_imports_nothing_heavy():
    text = help_text("served_adapter.py")
    assert "--adapter" in text and "--distill-summary" in text and "autopilot" in text
    assert help_cpu_s("served_adapter.py") < 1.0
    assert heavy_imports("served_adapter") == []


@pytest.mark.parametrize("changes, match", [
    (dict(tight_budget=40), "tight_budget = 40"),
    (dict(looser_budget=256), "looser_budget = 256"),
    (dict(total_tokens=520), "total_tokens = 520"),
    (dict(engine="vllm"), "engine = 'vllm'"),
    (dict(reserve_s=600), "reserve_s = 600"),
    (dict(targets="0.8,1.2"), "targets = '0.8,1.2'"),
    (dict(grid_budgets="320,390"), "grid_budgets = '320,390'"),
    (dict(grid_budgets="256"), "grid_budgets = '256'"),
    (dict(grid_budgets="384,x"), "grid_budgets = '384,x'"),
])
def test_config_errors_name_the_field(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        served_adapter.RunConfig(out=tmp_path, model_dir=tmp_path, adapter=tmp_path, **changes)


def test_gpu_defaults_are_the_distill_runs_and_the_command_serves_the_adapters_lora(tmp_path):
    from sparrow_server.autopilot.controller import DEFAULT_MIN_TOKENS
    from sparrow_server.cli import build_parser, command_of
    from sparrow_server.sglang_plugin.frontend.host import sglang_argv

    import distill_gpu
    import distill_rule

    assert served_adapter.AUTOPILOT_MIN_TOKENS == DEFAULT_MIN_TOKENS
    config = served_adapter.RunConfig(out=tmp_path, model_dir=tmp_path, adapter=_fake_adapter(tmp_path / "adapter"))
    distill = distill_gpu.RunConfig(out=tmp_path, model_dir=tmp_path)
    for name in ("tight_budget", "looser_budget", "total_tokens", "n_heldout_prompts", "heldout_samples", "seed"):
        assert getattr(config, name) == getattr(distill, name), name
    written = distill_rule.load_rule().written_for
    assert (config.tight_budget, config.looser_budget) == (written["tight_budget_tokens"], written["looser_budget_tokens"])
    assert list(config.arms()) == ["tight-256", "tight-256+adapter", "looser-512"]
    assert config.concurrency <= config.cuda_graph_max_bs and config.deadline_s <= 9 * 60 - 60
    cmd, env = served_adapter.server_command(config, served_adapter.adapter_info(config.adapter))
    assert env == {"SPARROW_EXACT_STRIDE": "4", "SPARROW_EXACT_MAX_MIB": "16384"}
    serve = cmd[cmd.index("serve"):]
    args, extra = build_parser(command_of(serve)).parse_known_args(serve)
    assert args.max_lora_rank == 16 and args.verify_fraction == 0 and args.adapter_root == [str(tmp_path)]
    argv = sglang_argv(args.model, args.host, args.port, (), args.max_batch_size, tuple(a for a in extra if a != "--"))
    assert "--enable-lora" in argv and argv.count("--max-running-requests") == 1
    i = argv.index("--lora-target-modules")
    assert sorted(argv[i + 1:i + 8]) == sorted(TARGETS) and argv[argv.index("--cuda-graph-max-bs") + 1] == "64"


def test_the_distill_summary_sets_the_defaults_and_explicit_flags_win(tmp_path):
    summary = tmp_path / "distill_summary.json"
    summary.write_text(json.dumps({"run": {"config": {"tight_budget": "128", "looser_budget": "384", "total_tokens": "1024",
                                                      "n_heldout_prompts": "8", "heldout_samples": "3", "seed": "7"}}}))
    base = [str(tmp_path / "w"), "--adapter", str(_fake_adapter(tmp_path / "a")), "--model-dir", str(_fake_adapter(tmp_path / "m")),
            "--distill-summary", str(summary)]
    (tmp_path / "m" / "config.json").write_text("{}")
    config = served_adapter.parse_args(base)
    assert (config.tight_budget, config.looser_budget, config.total_tokens) == (128, 384, 1024)
    assert (config.n_heldout_prompts, config.heldout_samples, config.seed) == (8, 3, 7)
    assert served_adapter.parse_args(base + ["--heldout-samples", "1"]).heldout_samples == 1


# ----- the report on synthetic tails ---------------------------------------------------------------------

def _records(arm, low, n_prompts=8, n=256, prompt_len=64, budget=64, seed=0):
    """Rollouts whose kept values (every position) have 15% of tokens at ``low`` (so p5 and its interval lie
    there), the rest at 0.99."""
    rng = np.random.default_rng(seed)
    out = []
    for p in range(n_prompts):
        values = np.where(rng.random(n) < 0.15, low + 0.01 * rng.random(n), 0.99)
        out.append({"arm": arm, "prompt": p, "prompt_len": prompt_len, "kept_positions": list(range(n)),
                    "kept_values": values.tolist(), "kv_budget_tokens": [None] + [budget - 8] * (n - 1), "source": "meta"})
    return out


ARMS = {"tight-64": {"budget": 64, "adapter": None}, "tight-64+adapter": {"budget": 64, "adapter": "d"},
        "looser-96": {"budget": 96, "adapter": None}}


def _analyse(records, targets=(), min_tokens=512):
    return served_report.analyse(records, ARMS, "looser-96", bin_tokens=128, min_bin_start=128, quantile=0.05,
                                 confidence=0.95, n_boot=50, targets=targets, min_tokens=min_tokens, page_size=16,
                                 reserved_pages=3)


def test_the_autopilot_picks_the_tight_budget_with_an_adapter_that_holds_the_looser_tail():
    records = _records("tight-64", 0.6) + _records("tight-64+adapter", 0.87, seed=1) + _records("looser-96", 0.86, budget=96, seed=2)
    report = _analyse(records)
    auto = report["autopilot"][0]
    assert auto["source"].startswith("auto") and 0.80 <= auto["target"] <= 0.86
    assert auto["tighter_with_adapter"] == "yes" and auto["qualifying_bins"] == auto["bins_tighter"] == 2
    for row in [r for r in auto["bins"] if r["qualifies"]]:
        assert row["decisions"]["tight-64"]["decision"] == "raise"  # the product's controller: p5 interval below
        assert row["decisions"]["tight-64+adapter"]["decision"] in ("hold", "lower")
        assert row["without_adapter"]["budget"] == 96 and row["with_adapter"]["budget"] == 64
        assert row["with_adapter"]["attended_tokens_per_step"] == 56.0
    cell = report["bins"][1]["arms"]["tight-64"]
    assert cell["low"] <= cell["p5"] <= cell["high"] and cell["prompts"] == 8 and cell["kept_tokens"] == 8 * 128
    assert report["bins"][1]["gain"]["tight-64+adapter"] == pytest.approx(
        report["bins"][1]["arms"]["tight-64+adapter"]["p5"] - cell["p5"])
    assert "tighter with the adapter: **yes**" in served_report.markdown(
        {"headline": "h", "report": report, "device": "cpu", "adapter": {"path": "a"}, "timings": {},
         "config": {"engine": "reference", "total_tokens": 320, "n_heldout_prompts": 8, "heldout_samples": 1, "stride": 1,
                    "quantile": 0.05, "bin_tokens": 128, "confidence": 0.95}})


def test_no_when_the_adapter_does_not_hold_and_undecided_below_min_tokens():
    records = _records("tight-64", 0.6) + _records("tight-64+adapter", 0.6, seed=1) + _records("looser-96", 0.86, budget=96, seed=2)
    auto = _analyse(records, targets=[0.5])["autopilot"]
    assert [t["tighter_with_adapter"] for t in auto] == ["no", "no"]  # at 0.5 both tight arms hold: not tighter
    assert all(r["with_adapter"]["budget"] == 64 == r["without_adapter"]["budget"] for r in auto[1]["bins"] if r["qualifies"])
    few = _analyse(records, min_tokens=5000)
    assert few["autopilot"] == []  # no qualifying looser bin with enough tokens: no automatic target
    few = _analyse(records, targets=[0.8], min_tokens=5000)["autopilot"][0]
    assert few["tighter_with_adapter"] == "undecided"
    assert {d["decision"] for r in few["bins"] for d in r["decisions"].values()} == {"no decision"}


def test_grid_budgets_show_where_the_autopilot_settles_without_the_adapter(tmp_path):
    """With a budget between tight and looser measured too, an adapter that closes part of the gap shows as a
    tighter pick (the grid budget holds the target, the adapter's tight one too), and one that does not as none."""
    config = served_adapter.RunConfig(out=tmp_path, model_dir=tmp_path, adapter=tmp_path, grid_budgets="448, 320,384")
    assert list(config.arms()) == ["tight-256", "tight-256+adapter", "looser-512", "grid-320", "grid-384", "grid-448"]
    assert config.budgets == [256, 320, 384, 448, 512] and config.arms()["grid-320"] == {"budget": 320, "adapter": None}
    arms = {**ARMS, "grid-80": {"budget": 80, "adapter": None}}
    analyse = lambda records: served_report.analyse(  # noqa: E731
        records, arms, "looser-96", bin_tokens=128, min_bin_start=128, quantile=0.05, confidence=0.95, n_boot=50,
        targets=[0.8], min_tokens=512, page_size=16, reserved_pages=3)["autopilot"][-1]  # the given target
    base = _records("tight-64", 0.6) + _records("looser-96", 0.86, budget=96, seed=2) + _records("grid-80", 0.85, budget=80, seed=3)
    holds = analyse(base + _records("tight-64+adapter", 0.85, seed=1))
    assert holds["tighter_with_adapter"] == "yes"
    assert all(r["without_adapter"]["budget"] == 80 and r["with_adapter"]["budget"] == 64 for r in holds["bins"] if r["qualifies"])
    short = analyse(base + _records("tight-64+adapter", 0.7, seed=1))
    assert short["tighter_with_adapter"] == "no"
    assert all(r["without_adapter"]["budget"] == 80 and r["with_adapter"]["status"] == "above" for r in short["bins"] if r["qualifies"])


def test_no_rollout_is_waited_for_past_the_deadline_and_the_report_covers_what_came_back(tmp_path):
    from types import SimpleNamespace

    class Clock:  # every rollout takes 10 s of this clock; none of real time
        now = 0.0

        def elapsed(self):
            return self.now

    class Client:
        def rollout(self, input_ids, schedule, adapter, verify, sampling_params):
            clock.now += 10.0
            n = 8
            sub = {"positions": list(range(n)), "acceptance": [0.9] * n, "missing": []}
            return SimpleNamespace(rid=f"r{clock.now:.0f}", token_ids=[5] * n, kv_budget_tokens=[None] + [64] * (n - 1),
                                   meta=SimpleNamespace(raw={"adapter": adapter, "exact_subsample": sub, "acceptance_kind": "exact"}))

    clock = Clock()
    config = served_adapter.RunConfig(out=tmp_path, model_dir=tmp_path, adapter=tmp_path, concurrency=1, deadline_s=100,
                                      reserve_s=30, n_heldout_prompts=3, heldout_samples=1, total_tokens=600, looser_budget=96,
                                      tight_budget=64)
    todo = served_adapter.requests(config, [[1] * 60, [2] * 70, [3] * 50], {64: "s64", 96: "s96"})
    assert [(r["arm"], r["prompt"], r["seed"]) for r in todo[:4]] == [
        ("tight-64", 0, 0), ("tight-64+adapter", 0, 0), ("looser-96", 0, 0), ("tight-64", 1, 1)]  # interleaved, same seeds
    assert {r["max_new_tokens"] for r in todo} == {600 - 70}
    records = served_adapter.run_requests(config, clock, Client(), todo)
    # one at a time: the 8th starts at 70 s = deadline - reserve, past it nothing starts
    assert [not r.get("error") for r in records] == [True] * 8 + [False]
    assert records[-1]["error"] == "not started before the deadline"
    served_adapter.attach_values(records, [])
    report = served_report.analyse(records, config.arms(), "looser-96", bin_tokens=64, min_bin_start=64, quantile=0.05,
                                   confidence=0.95, n_boot=20, targets=[], min_tokens=4, page_size=16, reserved_pages=3)
    assert {a: (v["answered"], v["requested"]) for a, v in report["arms"].items()} == {
        "tight-64": (3, 3), "tight-64+adapter": (3, 3), "looser-96": (2, 3)}
    assert report["arms"]["looser-96"]["errors"] == ["not started before the deadline"]


# ----- end to end on CPU ---------------------------------------------------------------------------------

def _tiny_model_with_smollm2_tokenizer(out: Path, source: Path) -> Path:
    """A tiny random Llama with SmolLM2's vocabulary and tokenizer (from the converted ``source``): the held-out
    prompts tokenize as on the GPU."""
    from helpers.tiny_models import tiny_model

    tiny_model("llama", seed=0, lm_head_std=0.5, vocab_size=49152, eos_token_id=2, bos_token_id=1,
               pad_token_id=2).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)
    return out


def _adapter(model_dir: Path, out: Path, std: float) -> Path:
    """A rank-4 all-linear LoRA on the tiny model: B at peft's zero init (std 0) or random."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir)),
                           LoraConfig(r=4, lora_alpha=4, target_modules="all-linear", lora_dropout=0.0))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and std:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    smollm2 = embedded_model_dir("the embedded model's tokenizer")
    import distill_rule

    tmp = tmp_path_factory.mktemp("served-dry")
    model = _tiny_model_with_smollm2_tokenizer(tmp / "model", smollm2)
    rule = json.loads(distill_rule.RULE.read_text())
    rule.update(name="dry", bin_tokens=64, min_bin_start_tokens=64, min_bin_tokens=1, min_bins=1, n_boot=50)
    (tmp / "rule.json").write_text(json.dumps(rule))
    procs = {}
    # the zero adapter's run goes one request at a time, so that equality does not rest on batch invariance
    for name, std, port, concurrency in (("random", 0.05, free_port(), 2), ("zero", 0.0, free_port(), 1)):
        adapter = _adapter(model, tmp / "adapters" / name, std)
        cmd = script_cmd("served_adapter.py", str(tmp / name / "work"), "--pack", str(tmp / name / "out"),
                         "--adapter", str(adapter), "--model-dir", str(model), "--rule", str(tmp / "rule.json"), "--engine",
                         "reference", "--device", "cpu", "--threads", "1", "--port", str(port), "--total-tokens", "144",
                         "--tight-budget", "64", "--looser-budget", "96", "--n-heldout-prompts", "2", "--heldout-samples", "1",
                         "--concurrency", str(concurrency), "--autopilot-min-tokens", "32", "--targets", "0.5",
                         "--deadline-s", "800", "--server-timeout-s", "300")
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=DRY_ENV)
    outs = {name: p.communicate(timeout=900)[0] for name, p in procs.items()}  # both at once: one wait on a 2-core box
    return tmp, {name: (procs[name].returncode, outs[name]) for name in procs}


def _summary(tmp, name):
    return json.loads((tmp / name / "work" / "served_adapter.json").read_text())


def _rollouts(tmp, name):
    rows = [json.loads(line) for line in (tmp / name / "work" / "rollouts.jsonl").read_text().splitlines()]
    return {(r["arm"], r["prompt"]): r for r in rows}


def test_dry_run_reports_every_arm_per_bin_with_real_values(dry_runs):
    tmp, results = dry_runs
    for name, (rc, out) in results.items():
        assert rc == 0, f"{name}:\n{out[-4000:]}"
        assert "server healthy" in out and "server stopped" in out
    summary = _summary(tmp, "random")
    arms = summary["report"]["arms"]
    assert list(arms) == ["tight-64", "tight-64+adapter", "looser-96"]
    for a in arms.values():  # every position verified exactly (reference engine): values joined from the evidence
        assert a["answered"] == a["requested"] == 2 and a["with_values"] == 2 and a["sources"] == ["evidence"]
        assert a["kept_tokens"] == 2 * (144 - 72)  # prompts of 67 and 72 tokens: 72 new tokens each
    bins = summary["report"]["bins"]
    assert [b["from"] for b in bins] == [64, 128] and all(b["qualifies"] for b in bins)
    for b in bins:
        tight, looser = b["arms"]["tight-64"], b["arms"]["looser-96"]
        assert tight["low"] <= tight["p5"] <= tight["high"] and tight["prompts"] == 2
        assert looser["attended_tokens_per_step"] > tight["attended_tokens_per_step"] <= 64
    assert min(b["arms"]["tight-64"]["p5"] for b in bins) < 0.95  # a 64-token budget really drops pages
    assert [t["source"].split(":")[0] for t in summary["report"]["autopilot"]] == ["auto", "given"]
    assert summary["report"]["autopilot"][0]["tighter_with_adapter"] in ("yes", "no", "undecided")
    assert "autopilot at target" in (tmp / "random" / "work" / "served_adapter.md").read_text()


def test_a_random_adapter_changes_its_arm_and_a_zero_one_does_not(dry_runs):
    tmp, _ = dry_runs
    for name in ("random", "zero"):
        rows = _rollouts(tmp, name)
        same = [rows[("tight-64", p)]["kept_values"] == rows[("tight-64+adapter", p)]["kept_values"] and
                rows[("tight-64", p)]["completion_ids"] == rows[("tight-64+adapter", p)]["completion_ids"] for p in (0, 1)]
        assert all(rows[(arm, p)]["meta"]["adapter"] == ("distill-served" if arm.endswith("adapter") else None)
                   for arm, p in rows)
        if name == "zero":  # the same seeds, an adapter that adds exactly zero: the same tokens and values
            assert all(same)
        else:
            assert not any(same)
    p5 = {name: [b["arms"]["tight-64+adapter"]["p5"] - b["arms"]["tight-64"]["p5"] for b in _summary(tmp, name)["report"]["bins"]]
          for name in ("random", "zero")}
    assert p5["zero"] == [0.0, 0.0] and max(abs(g) for g in p5["random"]) > 0.01


def test_dry_run_packs_at_most_8_files(dry_runs):
    tmp, _ = dry_runs
    names, in_tar = packed(tmp / "random" / "out", "served_adapter_logs.tar.xz")
    assert names == ["served_adapter.json", "served_adapter.md", "served_adapter_logs.tar.xz"]
    assert {"server.log", "rollouts.jsonl"} <= in_tar


def test_host_stage_8_serves_stage_6s_adapter_under_its_deadline():
    text, block = host_stage(8)
    assert 'timeout -s INT "$(left 5 590)" python3 benchmarks/gpu_host/served_adapter.py "$W/served"' in block
    assert 'ADAPTER="${ADAPTER:-$W/distill/adapter}"' in block and '--adapter "$ADAPTER"' in block
    assert '--distill-summary "$W/distill/distill_summary.json"' in block and "${SERVED_ARGS:-}" in block
    assert '--pack "$OUT"' in block and '--deadline-s "$(left 40 500)"' in block and "--port $PORT" in block
    assert 'model_dir)/config.json" ] || {' in block and block.count("exit 3") == 2  # a cold host, no adapter
    assert "stage must be 1-8" in text
