"""benchmarks/autopilot/heldout_gain.py's paired bootstrap: the gain of the held-out p5 and its interval,
resampling rollouts, on scripted per-token acceptances (the decision rule of a DistillSparse live run reads it)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("heldout_gain", REPO / "benchmarks" / "autopilot" / "heldout_gain.py")
hg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hg)

ALL = lambda lengths, sparse: np.ones(len(lengths), dtype=bool)  # noqa: E731


def rows(n_rollouts: int, shift: float, redraw: bool = False, seed: int = 1) -> list[dict]:
    """``after`` = ``before`` + ``shift``, or (``redraw``) a fresh draw from the same distribution."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_rollouts):
        before = rng.uniform(0.5, 1.0, 100)
        after = rng.uniform(0.5, 1.0, 100) if redraw else before + shift
        out.append({"before": before, "after": after, "lengths": np.arange(60, 160),
                    "sparse": np.arange(60, 160) > 64})
    return out


def test_a_uniform_shift_is_a_gain_whose_interval_excludes_zero():
    g = hg.gain(rows(10, 0.05), ALL, n_boot=300, confidence=0.9, seed=0)
    assert abs(g["gain"] - 0.05) < 1e-9
    assert 0.04 < g["gain_interval"][0] <= g["gain"] <= g["gain_interval"][1] < 0.06


def test_no_change_gives_a_zero_gain_and_a_zero_interval():
    g = hg.gain(rows(10, 0.0), ALL, n_boot=300, confidence=0.9, seed=0)
    assert g["gain"] == 0 and g["gain_interval"] == [0.0, 0.0]


def test_a_redraw_from_the_same_distribution_gives_an_interval_around_zero():
    g = hg.gain(rows(10, 0.0, redraw=True), ALL, n_boot=300, confidence=0.9, seed=0)
    low, high = g["gain_interval"]
    assert low < 0 < high


def test_the_selection_keeps_only_the_tokens_asked_for():
    g = hg.gain(rows(4, 0.0), lambda lengths, sparse: sparse, n_boot=10, confidence=0.9, seed=0)
    assert g["n_tokens"] == 4 * int((np.arange(60, 160) > 64).sum())


def test_named_sides_compare_any_two_scorings_of_the_same_tokens():
    data = rows(6, 0.05)
    for r in data:
        r["lower_after"] = r["before"] - 0.02
    g = hg.gain(data, ALL, n_boot=50, confidence=0.9, seed=0, before_key="before", after_key="lower_after")
    assert abs(g["gain"] + 0.02) < 1e-9 and g["gain_interval"][1] < 0
