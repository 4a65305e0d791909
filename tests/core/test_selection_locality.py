"""``benchmarks/selection_locality.py``'s measures, on records whose answer is known."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "selection_locality.py"


def _script():
    spec = importlib.util.spec_from_file_location("selection_locality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _records(rows):
    """rows: (layer, length, head, pages) -> ``selection_debug.load_records``'s shape."""
    cols = {name: np.array([r[i] for r in rows], dtype=np.int64) for i, name in ((0, "layer"), (1, "length"),
                                                                             (2, "head"))}
    return {**cols, "prompt_len": np.full(len(rows), 1000, dtype=np.int64),
            "pages": [np.asarray(r[3], dtype=np.int32) for r in rows]}


def test_heads_on_the_same_run_of_pages_overlap_fully_and_are_adjacent():
    S = _script()
    length = 64 * 16  # 64 pages: sink 1, recent 2 -> candidates [1, 62)
    same = [0, *range(10, 30), 62, 63]  # sink, a run of 20, the recent pages
    apart = [[0, *range(1 + 3 * h, 61, 12), 62, 63] for h in range(4)]  # every 12th page, each head its own
    got = S.locality(_records([(2, length, h, same) for h in range(4)] + [(3, length, h, apart[h]) for h in range(4)]),
                     16, 1, 2)
    assert got[2]["top_k"] == 20 and got[2]["candidates"] == 61
    assert got[2]["jaccard"] == 1.0 and got[2]["adjacency"] == 1.0
    assert got[3]["jaccard"] == 0.0 and got[3]["adjacency"] == 0.0
    assert 0.0 < got[2]["uniform_jaccard"] < 0.5 and 0.0 < got[2]["uniform_adjacency"] < 1.0


def test_top_k_pages_leave_out_the_sink_and_the_recent_pages():
    S = _script()
    assert S.top_k_pages([0, 5, 7, 62, 63], 64 * 16, 16, 1, 2).tolist() == [5, 7]
    assert S.top_k_pages([0, 1, 61, 62, 63], 64 * 16 - 3, 16, 1, 2).tolist() == [1, 61]  # 64 pages, the last partial
