"""Call 47's profile summary (``benchmarks/results/speed/call47/profile_summary.py``) on its committed profiles: the
committed table is what the script prints, and each replay's parts add up to its span (no kernel left out)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

CALL47 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "speed" / "call47"


def _summary():
    spec = importlib.util.spec_from_file_location("profile_summary", CALL47 / "profile_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_table_is_what_the_script_prints():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _summary().main()
    assert (CALL47 / "profile_summary.md").read_text() == out.getvalue()


@pytest.mark.parametrize("backend", ["flashinfer", "sparrow"])
@pytest.mark.parametrize("context", [8192, 16384])
def test_the_parts_add_up_to_the_replay(backend, context):
    s = _summary()
    parts = s.parts(s.replay(backend, context))
    summed = sum(v for k, v in parts.items() if k not in ("span", "attn TB/s", "select TB/s"))
    assert summed == pytest.approx(parts["span"], rel=1e-3)
    assert (parts["selection (26)"] > 0) == (backend == "sparrow")
