"""The calls' per-layer profile summaries (``benchmarks/results/speed/callN/profile_summary.py``, on
``benchmarks/profile_parts.py``) on their committed profiles: each committed table is what its script prints, and each
replay's parts add up to its span (no kernel left out)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

SPEED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "speed"
SPARSE_LAYERS = {"call47": 26, "call48": 34}  # Qwen3-1.7B's 28 layers, Qwen3-4B's 36, less the two dense ones


def _summary(call: str):
    spec = importlib.util.spec_from_file_location(f"profile_summary_{call}", SPEED / call / "profile_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("call", SPARSE_LAYERS)
def test_committed_table_is_what_the_script_prints(call):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _summary(call).main()
    assert (SPEED / call / "profile_summary.md").read_text() == out.getvalue()


@pytest.mark.parametrize("call", SPARSE_LAYERS)
@pytest.mark.parametrize("backend", ["flashinfer", "sparrow"])
@pytest.mark.parametrize("context", [8192, 16384])
def test_the_parts_add_up_to_the_replay(call, backend, context):
    s = _summary(call)
    parts = s.parts(s.replay(backend, context))
    summed = sum(v for k, v in parts.items() if k not in ("span", "attn TB/s", "select TB/s"))
    assert summed == pytest.approx(parts["span"], rel=1e-3)
    assert (parts[f"selection ({SPARSE_LAYERS[call]})"] > 0) == (backend == "sparrow")
