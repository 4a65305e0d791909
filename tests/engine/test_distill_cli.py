"""``sparrow-server distill`` end to end on a tiny saved model: from a rollouts file and from
prompts sampled in-process; bad input exits 2 naming the field."""
from __future__ import annotations

import json

import pytest
import torch

from sparrow_server.cli import main
from sparrow_server.distill import dump_rollouts, read_adapter_metadata
from sparrow_server.distill.rollouts import Rollout, RolloutError, load_rollouts, split_heldout
from helpers.tiny_models import TINY_VOCAB, save_tiny_model

SCHEDULE = {"name": "tight", "budgets_tokens": [64], "page_size": 16, "dense_layers": [0]}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/engine/test_distill.py
    root = tmp_path_factory.mktemp("distill_cli")
    save_tiny_model(root / "model")
    (root / "tight.json").write_text(json.dumps(SCHEDULE))
    g = torch.Generator().manual_seed(0)
    rollouts = [Rollout(tuple(torch.randint(0, TINY_VOCAB, (120,), generator=g).tolist()), 80) for _ in range(4)]
    dump_rollouts(rollouts, root / "rollouts.jsonl")
    prompts = [{"input_ids": torch.randint(0, TINY_VOCAB - 1, (80,), generator=g).tolist()} for _ in range(3)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    yield root
    torch.set_num_threads(previous)


def _args(root, out, *extra):
    return ["distill", "--model", str(root / "model"), "--schedule", str(root / "tight.json"), "--out", str(out),
            "--rank", "2", "--steps", "2", "--batch", "2", *extra]


def test_distill_from_rollouts_file(workdir, capsys):
    out = workdir / "adapter-a"
    assert main(_args(workdir, out, "--rollouts", str(workdir / "rollouts.jsonl"), "--compare-schedule", "dense")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["adapter"] == str(out) and summary["steps"] == 2 and summary["n_heldout"] == 1
    assert set(summary["compare"]) == {"dense@1"}
    meta = read_adapter_metadata(out)
    assert meta.rank == 2 and meta.schedule_id == "tight@1" and meta.base_fingerprint.startswith("sparrow-fp1:")
    assert main(_args(workdir, out, "--rollouts", str(workdir / "rollouts.jsonl"))) == 2  # immutable
    assert "already holds an adapter" in capsys.readouterr().err


def test_distill_with_the_tv_loss(workdir, capsys):
    out = workdir / "adapter-tv"
    assert main(_args(workdir, out, "--rollouts", str(workdir / "rollouts.jsonl"), "--loss", "tv")) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2
    assert json.loads((out / "sparrow_adapter.json").read_text())["config"]["loss"] == "tv"


def test_distill_samples_sparse_rollouts_from_prompts(workdir, capsys):
    out, saved = workdir / "adapter-b", workdir / "sampled.jsonl"
    args = _args(workdir, out, "--prompts", str(workdir / "prompts.jsonl"), "--max-new-tokens", "8",
                 "--samples-per-prompt", "2", "--ignore-eos", "--save-rollouts", str(saved), "--loss", "topk_forward_kl")
    assert main(args) == 0
    rollouts = load_rollouts(saved)
    assert len(rollouts) == 6 and all(r.prompt_len == 80 and r.n_generated == 8 for r in rollouts)
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_heldout"] == 2 and summary["n_train"] == 4  # one prompt (both samples) held out


@pytest.mark.parametrize("extra, message", [
    (["--rank", "0"], "--rank"),
    (["--loss-typo"], None),
])
def test_bad_arguments(workdir, capsys, extra, message):
    args = _args(workdir, workdir / "never", "--rollouts", str(workdir / "rollouts.jsonl"), *extra)
    if message is None:
        with pytest.raises(SystemExit):
            main(args)
        return
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_unknown_schedule_and_bad_rollouts(workdir, capsys):
    args = _args(workdir, workdir / "never", "--rollouts", str(workdir / "rollouts.jsonl"))
    args[args.index("--schedule") + 1] = "no-such-schedule"
    assert main(args) == 2
    assert "no-such-schedule" in capsys.readouterr().err
    bad = workdir / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, 3], "prompt_len": 3}\n')
    assert main(_args(workdir, workdir / "never", "--rollouts", str(bad))) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "prompt_len" in err


def test_rollout_parsing_and_prompt_split(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"prompt_ids": [1, 2], "output_ids": [3]}\n\n{"input_ids": [4, 5, 6], "prompt_len": 1}\n')
    assert load_rollouts(path) == [Rollout((1, 2, 3), 2), Rollout((4, 5, 6), 1)]
    for line, field in [('{"input_ids": [1, 2]}', "prompt_len"), ('{"input_ids": [1, -2], "prompt_len": 1}', "input_ids"),
                        ('{"text": "x"}', "input_ids"), ("[1]", "JSON object"), ("{", "r.jsonl:1")]:
        path.write_text(line + "\n")
        with pytest.raises(RolloutError, match=field):
            load_rollouts(path)
    same = [Rollout((1, 2, 3 + i), 2) for i in range(3)] + [Rollout((7, 8, 9 + i), 2) for i in range(3)]
    train, held = split_heldout(same, 0.5, seed=0)
    assert len(held) == 3 and len({r.input_ids[:2] for r in held}) == 1
    assert {r.input_ids[:2] for r in train}.isdisjoint({r.input_ids[:2] for r in held})
    with pytest.raises(RolloutError, match="2 prompts"):
        split_heldout(same[:3], 0.25, seed=0)
