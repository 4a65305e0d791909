"""``benchmarks/weight_update_timing.py`` (a GPU-host script no CPU test runs) checked on CPU: it imports without
torch and answers --help; the tensors it sends are Qwen3-1.7B's checkpoint (names, shapes, parameter count, the
tied head left out); slime's and verl's bucketing; the saved checkpoint reads back."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/weight_update_timing.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import sglang_server as S  # noqa: E402
import weight_tensors as W  # noqa: E402

# Qwen3-1.7B: 28 layers x 11 tensors + embedding + final norm; 1.72 B parameters with the head tied to the
# embedding (Hugging Face's model card: 1.7 B, 1.4 B without embeddings).
QWEN3_1_7B_PARAMS = 1_720_574_976
QWEN3_1_7B_TENSORS = 310
TINY = dict(S.QWEN3_BASE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=True)


def _sizes(shapes):
    from math import prod

    return [(n, 2 * prod(s)) for n, s in shapes]


def test_script_compiles_imports_without_torch_and_answers_help():
    compile(SCRIPT.read_text(), str(SCRIPT), "exec")
    probe = (f"import runpy, sys; sys.argv = ['x', '--help']\n"
             f"try:\n    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
             f"except SystemExit as e:\n    assert e.code == 0, e.code\n"
             f"print('TORCH' if 'torch' in sys.modules else 'NO_TORCH')")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower() and done.stdout.strip().endswith("NO_TORCH")


def test_qwen3_1_7b_tensors_are_its_checkpoint():
    cfg = S.qwen3_config("qwen3-1.7b")
    shapes = W.param_shapes(cfg)
    assert cfg["tie_word_embeddings"] and "lm_head.weight" not in dict(shapes)
    assert len(shapes) == QWEN3_1_7B_TENSORS == len(dict(shapes))
    assert sum(size for _, size in _sizes(shapes)) == 2 * QWEN3_1_7B_PARAMS  # 3.44 GB in bf16
    untied = W.param_shapes(dict(cfg, tie_word_embeddings=False))
    assert untied[-1] == ("lm_head.weight", (151936, 2048))


def test_names_and_shapes_equal_the_hf_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = S.qwen3_config("qwen3-1.7b")
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    hf = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    assert hf[-1][0] == "lm_head.weight" and model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert W.param_shapes(cfg) == hf[:-1]


def test_buckets_follow_slime_and_verl():
    assert W.buckets([("a", 5), ("b", 3), ("c", 3), ("d", 10), ("e", 1)], 6) == [["a"], ["b", "c"], ["d"], ["e"]]
    assert W.buckets([], 6) == []
    sizes = _sizes(W.param_shapes(S.qwen3_config("qwen3-1.7b")))
    size = dict(sizes)
    for limit, count in ((512 * 1024**2, 7), (2048 << 20, 2), (5 * 10**9, 1)):
        plan = W.buckets(sizes, limit)
        assert [n for b in plan for n in b] == [n for n, _ in sizes]
        assert all(len(b) == 1 or sum(size[n] for n in b) <= limit for b in plan)
        assert len(plan) == count, (limit, len(plan))
    assert W.buckets(sizes, 512 * 1024**2)[0] == ["model.embed_tokens.weight"]  # 622 MB: a bucket of its own


def test_tensors_are_seeded_and_the_checkpoint_reads_back(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    shapes = W.param_shapes(TINY)
    a, b = W.make_tensors(shapes, 1, "cpu"), W.make_tensors(shapes, 1, "cpu")
    assert W.digest(a) == W.digest(b) != W.digest(W.make_tensors(shapes, 2, "cpu"))
    assert all(t.dtype == torch.bfloat16 and tuple(t.shape) == s for t, (_, s) in zip(a.values(), shapes))
    saved = W.save_checkpoint(a, TINY, tmp_path, shard_bytes=W.nbytes(a) // 3)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(saved["files"]) > 1 and set(index["weight_map"]) == set(a)
    assert index["metadata"]["total_size"] == W.nbytes(a)
    back = {k: v for f in saved["files"] for k, v in load_file(str(tmp_path / f)).items()}
    assert all(torch.equal(back[n], a[n]) for n in a)
    assert json.loads((tmp_path / "config.json").read_text())["hidden_size"] == 64
    single = W.save_checkpoint(a, TINY, tmp_path / "one")
    assert single["files"] == ["model.safetensors"] and not (tmp_path / "one/model.safetensors.index.json").exists()


def test_checks_of_the_committed_run_and_of_a_path_that_did_not_replace_the_weights():
    import copy

    import weight_update_report as R

    report = json.loads((ROOT / "benchmarks/results/weight_update_timing/run2/shm/weight_update_timing.json").read_text())
    assert R.checks(report) == report["checks"] and all(report["checks"].values())
    stale = copy.deepcopy(report)
    stale["paths"]["tensor"]["after"]["checksum"] = stale["resets"]["reset_before_tensor"]["checksum"]
    assert R.checks(stale)["tensor_checksum_equals_nccl"] is False
    missing = copy.deepcopy(report)
    del missing["paths"]["disk"]
    assert R.checks(missing)["all_three_paths_ran"] is False
