"""``sparrow-server schedules ...`` and ``sparrow-server cost ...``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sparrow_server.cli import main
from sparrow_server.cost.model_shape import MODEL_PRESETS
from sparrow_server.cost.roofline import predicted_speedup
from sparrow_server.cost.hardware import HARDWARE_PRESETS
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule, load_schedule


def test_schedules_list(capsys):
    assert main(["schedules", "list"]) == 0
    out = capsys.readouterr().out
    assert "dense" in out and "qwen3-14b-0.86" in out
    assert main(["schedules", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "dense" and len(rows) == 21


def test_schedules_show_json_is_a_valid_schedule_file(capsys, tmp_path):
    assert main(["schedules", "show", "qwen3-4b-0.86", "--json"]) == 0
    text = capsys.readouterr().out
    data = json.loads(text)
    for key in ("name", "page_size", "bin_tokens", "budgets_tokens"):
        assert key in data
    (tmp_path / "s.json").write_text(text)
    assert load_schedule(tmp_path / "s.json") == ScheduleRegistry().get("qwen3-4b-0.86")
    assert main(["schedules", "validate", str(tmp_path / "s.json")]) == 0
    assert "ok: qwen3-4b-0.86@1" in capsys.readouterr().out
    assert main(["schedules", "show", "qwen3-4b-0.86"]) == 0
    assert "[38000, inf)" in capsys.readouterr().out


def test_schedules_show_unknown_and_registered(capsys, tmp_path):
    assert main(["schedules", "show", "nope"]) == 2
    assert "unknown schedule 'nope'" in capsys.readouterr().err
    ScheduleRegistry(persist_dir=tmp_path).register(Schedule("mine", budgets_tokens=(512,)), persist=True)
    assert main(["schedules", "show", "mine", "--persist-dir", str(tmp_path)]) == 0
    assert main(["schedules", "list", "--persist-dir", str(tmp_path)]) == 0
    assert "registered" in capsys.readouterr().out


@pytest.mark.parametrize("content,field", [
    ({"name": "x", "budgets_tokens": [512, 500]}, "budgets_tokens[1]"),
    ({"name": "x", "budgets_tokens": [1024, 512]}, "budgets_tokens[1]"),
    ({"name": "x", "page_sise": 16}, "page_sise"),
])
def test_schedules_validate_names_the_bad_field(capsys, tmp_path, content, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    assert main(["schedules", "validate", str(path)]) == 1
    assert repr(field) in capsys.readouterr().err
    assert main(["schedules", "validate", str(tmp_path / "missing.json")]) == 1


def test_validate_exit_code_through_the_console_entry(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nbudgets_tokens: [512, 100]\n")
    proc = subprocess.run([sys.executable, "-m", "sparrow_server.cli", "schedules", "validate", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "'budgets_tokens[1]'" in proc.stderr


def test_cost_json(capsys):
    args = ["cost", "--model", "qwen3-1.7b", "--schedule", "qwen3-1.7b-0.86", "--prompt-len", "200",
            "--gen-len", "16000", "--hardware", "h100", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    expect = predicted_speedup(MODEL_PRESETS["qwen3-1.7b"], ScheduleRegistry().get("qwen3-1.7b-0.86"), 200, 16000,
                               hardware=HARDWARE_PRESETS["h100"])
    assert out["predicted_speedup"] == pytest.approx(expect)
    assert out["hardware"]["name"] == "h100" and out["schedule"] == "qwen3-1.7b-0.86@1"
    assert main(args + ["--hbm-tbps", "1.0"]) == 0
    slower_memory = json.loads(capsys.readouterr().out)
    assert slower_memory["hardware"]["mem_bytes_per_s"] == 1e12
    assert slower_memory["predicted_speedup"] != out["predicted_speedup"]
    assert main(args + ["--step-overhead-ms", "1.5"]) == 0
    overhead = json.loads(capsys.readouterr().out)
    assert overhead["hardware"]["step_overhead_s"] == 0.0015 and overhead["predicted_speedup"] < out["predicted_speedup"]


def test_cost_kv_pool_waves(capsys):
    """--kv-pool-tokens: the batch decodes in the waves the pool holds (rollout A on the H200: 61, then 3), each
    wave costing what that many requests cost alone: 64 requests' time is 61's plus 3's, for both backends."""
    def run(batch, *extra):
        assert main(["cost", "--model", "qwen3-1.7b", "--schedule", "qwen3-1.7b-0.86", "--prompt-len", "1024",
                     "--gen-len", "16384", "--samples", "1", "--batch", str(batch), "--hardware", "h200", "--json",
                     *extra]) == 0
        return json.loads(capsys.readouterr().out)

    unlimited, pooled, first, second = run(64), run(64, "--kv-pool-tokens", "1076320"), run(61), run(3)
    assert unlimited["decode_waves"] == [64] and pooled["decode_waves"] == [61, 3]
    assert pooled["kv_pool_tokens"] == 1076320
    for backend in ("dense", "sparse"):
        per_token = lambda out: 1 / out[f"{backend}_tokens_per_s"]  # noqa: E731  (seconds a request, per token)
        assert 64 * per_token(pooled) == pytest.approx(61 * per_token(first) + 3 * per_token(second), rel=1e-9)
        assert pooled[f"{backend}_tokens_per_s"] < unlimited[f"{backend}_tokens_per_s"]
    assert main(["cost", "--model", "qwen3-1.7b", "--schedule", "dense", "--prompt-len", "1024", "--gen-len", "16384",
                 "--kv-pool-tokens", "17000"]) == 2  # not one request at full length
    assert "kv_pool_tokens" in capsys.readouterr().err


def test_cost_mean_budget_counts_the_tokens_attended(capsys, tmp_path):
    """The paper-formula budget is the mean KV tokens a sparse layer reads per step: dense up to 64 tokens
    (61..64), then 3 full pages plus the current page's real tokens (49..54 at 65..70), not min(budget, L)."""
    sched = tmp_path / "s.json"
    sched.write_text(json.dumps({"name": "s", "budgets_tokens": [64], "page_size": 16}))
    assert main(["cost", "--model", "qwen3-1.7b", "--schedule", str(sched), "--prompt-len", "60", "--gen-len", "10",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mean_budget_tokens"] == pytest.approx((61 + 62 + 63 + 64 + 49 + 50 + 51
                                                                                      + 52 + 53 + 54) / 10)


def test_cost_text_config_path_and_errors(capsys, tmp_path):
    config = {"model_type": "qwen3", "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936,
              "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    sched = tmp_path / "s.json"
    sched.write_text(json.dumps({"name": "s", "budgets_tokens": [1024]}))
    assert main(["cost", "--model", str(tmp_path / "config.json"), "--schedule", str(sched),
                 "--prompt-len", "100", "--gen-len", "4000"]) == 0
    assert "predicted rollout speedup" in capsys.readouterr().out
    assert main(["cost", "--model", "gpt-9", "--schedule", "dense", "--prompt-len", "1", "--gen-len", "1"]) == 2
    assert "'model'" in capsys.readouterr().err
    assert main(["cost", "--model", "qwen3-4b", "--schedule", "nope", "--prompt-len", "1", "--gen-len", "1"]) == 2
    assert main(["cost", "--model", "qwen3-4b", "--schedule", "dense", "--prompt-len", "1", "--gen-len", "0"]) == 2
    assert "gen_len" in capsys.readouterr().err
