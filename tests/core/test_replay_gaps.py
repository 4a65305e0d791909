"""``benchmarks/replay_gaps.py`` on call 36's committed decode replays: the report committed under call 44 is what it
prints, and its per-layer gaps add up to the replay's."""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import replay_gaps  # noqa: E402

PROFILES = REPO / "benchmarks" / "results" / "speed" / "call36" / "decode_profile"
DIRS = [PROFILES / "profile_32k_b16_flashinfer", PROFILES / "profile_32k_b16_sparrow"]


def test_committed_report_is_what_the_script_prints(monkeypatch):
    monkeypatch.chdir(REPO)  # the report names the traces by their paths from the repository's root
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert replay_gaps.main([str(d.relative_to(REPO)) for d in DIRS]) == 0
    committed = (REPO / "benchmarks" / "results" / "speed" / "call44" / "replay_gaps.md").read_text()
    assert out.getvalue().count("## benchmarks/") == 2 and committed.endswith(out.getvalue())


@pytest.mark.parametrize("folder", DIRS, ids=lambda d: d.name)
def test_layer_gaps_cover_the_replay_s_between_the_first_and_last_attention(folder):
    kernels = json.loads(next(folder.glob("replay-kernels-*.json")).read_text())
    at = [i for i, k in enumerate(kernels) if replay_gaps.ATTENTION in k["name"]]
    per_layer = replay_gaps.layer_gaps(kernels)
    assert len(per_layer) == len(at) - 1
    assert sum(g for _, g in per_layer) == pytest.approx(sum(replay_gaps.gaps(kernels)[at[0]:at[-1]]))
