"""benchmarks/pick_select_variant.py: the variant a server runs after a kernel bench."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pick():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pick_select_variant

    return pick_select_variant.pick


def _result(times: dict[str, list], default: str = "even") -> dict:
    """A kernel bench result: ``times[variant][case]`` selection µs, "err" an error, "diff" other pages."""
    def run(t):
        return {"error": "x"} if t == "err" else {"selection_us": 0.0, "same_indices": False} if t == "diff" \
            else {"selection_us": t, "same_indices": True}
    n = len(next(iter(times.values())))
    return {"default_variant": default,
            "cases": [{"variants": {v: run(t[i]) for v, t in times.items()}} for i in range(n)]}


def test_the_fastest_at_the_deciding_batch_wins():
    best, totals = _pick()([_result({"even": [90, 100], "fine": [60, 70], "hist": [80, 80]})], 0.02)
    assert best == "fine" and totals == {"even": 190, "fine": 130, "hist": 160}


def test_a_variant_slower_elsewhere_or_wrong_is_out():
    b64 = _result({"even": [90, 100], "fine": [60, 70], "hist": [80, 80], "fine_hist": ["diff", 10]})
    b16 = _result({"even": [20, 30], "fine": [20, 31], "hist": [20.3, 30.5]})  # fine 3.3% slower at case 2
    best, totals = _pick()([b64, b16], 0.02)
    assert best == "hist" and set(totals) == {"even", "hist"}
    assert _pick()([b64, b16], 0.05)[0] == "fine"


def test_the_default_stays_unless_beaten():
    assert _pick()([_result({"even": [50, 50], "fine": [60, 70], "hist": ["err", 10]})], 0.02)[0] == "even"
    assert _pick()([_result({"even": ["err", 50], "fine": [60, 70]})], 0.02)[0] == "fine"
