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
