"""benchmarks/sglang_throughput.py says when a workload cannot be measured, and exits non-zero.

On an H100 the pool of a 40960-context Qwen3-1.7B server holds 593,904 tokens: ``decode 32768x32``
runs in waves, no log line shows 32 running requests, and the benchmark used to write ``None`` for
both backends and exit 0 (issue 24)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sglang_throughput

    return sglang_throughput


def test_a_workload_the_pool_cannot_hold_is_named_with_the_numbers():
    T = _bench()
    why = T.pool_shortfall(593_904, 32768, 256, 32)
    assert why is not None and "593904" in why and "32 x (32768 + 256) = 1056768" in why
    assert T.pool_shortfall(593_904, 32768, 256, 16) is None  # 16 x 33,024 = 528,384 fits
    assert T.pool_shortfall(1_056_768, 32768, 256, 32) is None  # exactly full
    assert T.pool_shortfall(None, 32768, 256, 32) is None  # unknown pool: measured, then checked


def test_errors_of_either_backend_are_collected_and_measured_runs_are_not():
    T = _bench()
    per = {"flashinfer": {"server": {"start_s": 1.0}, ("decode_ctx", 32768, 16): {"server_tok_s": 1000.0},
                          ("decode_ctx", 32768, 32): {"error": "the KV pool holds 1 tokens"}},
           "sparrow": {("decode_ctx", 32768, 16): {"server_tok_s": None, "error": "no decode log line"}}}
    errors = T.workload_errors(per, "qwen3-1.7b")
    assert errors == ["qwen3-1.7b flashinfer: the KV pool holds 1 tokens", "qwen3-1.7b sparrow: no decode log line"]
    assert T.workload_errors({"sparrow": {"server": {}, ("decode_ctx", 1, 1): {"server_tok_s": 5.0}}}, "x") == []


def _fake_backends(T, monkeypatch, fail=()):
    calls = []

    def run_backend(size, backend, work_dir, out_dir, args, schedule, share_s=None, only=None, card=None, port=30100):
        calls.append({"backend": backend, "only": only, "card": card, "port": port})
        res = {("decode_ctx", 32768, b): ({"error": "short"} if (backend, b) in fail else {"server_tok_s": 1.0 * b})
               for b in (16, 32) if only is None or ("decode_ctx", 32768, b) in only}
        return res, {"cfg": size}

    monkeypatch.setattr(T, "run_backend", run_backend)
    return calls


def test_parallel_cards_runs_each_backend_on_its_own_card_and_port(monkeypatch, tmp_path):
    import json
    import types

    T = _bench()
    calls = _fake_backends(T, monkeypatch, fail={("sparrow", 32)})
    args = types.SimpleNamespace(parallel_cards=True, port=30100)
    per, cfg, done = T.measure("qwen3-1.7b", ["flashinfer", "sparrow"], None, tmp_path, args, None, 100.0)
    assert sorted((c["backend"], c["card"], c["port"], c["only"]) for c in calls) == [
        ("flashinfer", 0, 30100, None), ("sparrow", 1, 30101, None)]
    assert done == {("decode_ctx", 32768, 16)} and cfg == {"cfg": "qwen3-1.7b"}  # only what both measured
    # each half saved as it ended: a call cut during the slower half keeps the other
    saved = json.loads((tmp_path / "partial-qwen3-1.7b-sparrow.json").read_text())
    assert saved == {"('decode_ctx', 32768, 16)": {"server_tok_s": 16.0}, "('decode_ctx', 32768, 32)": {"error": "short"}}
    assert (tmp_path / "partial-qwen3-1.7b-flashinfer.json").exists()


def test_back_to_back_the_second_backend_runs_what_the_first_measured(monkeypatch):
    import types

    T = _bench()
    calls = _fake_backends(T, monkeypatch, fail={("flashinfer", 32)})
    per, _, done = T.measure("qwen3-1.7b", ["flashinfer", "sparrow"], None, None,
                             types.SimpleNamespace(parallel_cards=False, port=30200), None, 100.0)
    assert [(c["backend"], c["card"], c["port"], c["only"]) for c in calls] == [
        ("flashinfer", None, 30200, None), ("sparrow", None, 30200, {("decode_ctx", 32768, 16)})]
    assert done == {("decode_ctx", 32768, 16)} and list(per["sparrow"]) == [("decode_ctx", 32768, 16)]


def test_the_json_names_the_kernel_the_sparse_plans_decode_on():
    from sparrow_server.sglang_plugin.scheduler.determinism import NO_SPLIT

    """Kernel, graph KV split and selection variant, read from the backend's start-up line (call 21's Qwen3-4B
    ran on CUDA cores: that line, verbatim)."""
    T = _bench()
    log = (ROOT / "benchmarks/results/speed/call21/rolloutA_4b/server-qwen3-4b-sparrow.log").read_text()
    assert T.sparse_decode_kernel(log) == {"sparse_decode_kernel": "cuda-core", "graph_kv_split": "flashinfer",
                                           "graph_sub_rows": 1, "select_variant": "even"}
    tensor = log.replace("/ graph DecodeSplit(use_tensor_cores=False", "/ graph DecodeSplit(use_tensor_cores=True")
    tensor = tensor.replace(", selection even, KV split", ", selection fine_hist64, KV split")
    assert T.sparse_decode_kernel(tensor) == {"sparse_decode_kernel": "tensor-core", "graph_kv_split": "flashinfer",
                                              "graph_sub_rows": 1, "select_variant": "fine_hist64"}
    line = "/ graph DecodeSplit(use_tensor_cores=False, fixed_split_size=None, disable_split_kv=False)"
    sub_rows = log.replace(line, f"{line}, graph sub-rows 4")  # the line since call 37
    assert "graph sub-rows 4" in sub_rows and T.sparse_decode_kernel(sub_rows)["graph_sub_rows"] == 4
    graph = "/ graph DecodeSplit(use_tensor_cores=True, fixed_split_size=None, disable_split_kv=False)"
    unsplit = tensor.replace(graph, f"/ graph {NO_SPLIT}")  # deterministic inference's graph plan, as logged
    assert T.sparse_decode_kernel(unsplit)["graph_kv_split"] == "none"
    dense = (ROOT / "benchmarks/results/speed/call21/rolloutA_4b/server-qwen3-4b-flashinfer.log").read_text()
    assert T.sparse_decode_kernel(dense) == {}


def test_a_rollout_the_pool_cannot_hold_at_once_carries_a_note_beside_its_speedup(monkeypatch):
    """Call 27: 64 x (1K + 16K) at the default pool (1,076,320 tokens) ran in waves and measured 1.95x where
    the pool that holds it measured 2.31x; the JSON run says why, from the backend's rollout detail."""
    import types

    T = _bench()
    short = T.pool_shortfall(1_076_320, 1024, 16384, 64, workload="rollout")
    assert short == "rollout 1024x64: the KV pool holds 1076320 tokens, fewer than 64 x (1024 + 16384) = 1114112"
    assert T.pool_shortfall(1_128_448, 1024, 16384, 64, workload="rollout") is None
    key, note = ("rollout", 1024, 64), short + ": it ran in waves"
    per = {"flashinfer": {key: {"tok_s": 1.0, "pool_note": note}}, "sparrow": {key: {"tok_s": 2.0, "pool_note": note}}}
    cfg = types.SimpleNamespace()
    args = types.SimpleNamespace(rollout_gen=16384, gen_len=256, context_length=40960)
    schedule = types.SimpleNamespace(name="qwen3-1.7b-0.86")
    monkeypatch.setattr(T, "roofline_ratio", lambda *a: 2.8)  # the roofline's own tests are elsewhere
    run = T.make_run(key, per, cfg, "qwen3-1.7b", schedule, args)
    assert run["speedup"] == 2.0 and run["pool_note"] == note
    for backend in per.values():
        del backend[key]["pool_note"]
    assert "pool_note" not in T.make_run(key, per, cfg, "qwen3-1.7b", schedule, args)
