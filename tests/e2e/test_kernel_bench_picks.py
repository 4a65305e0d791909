"""``sparse_kernel_bench.py --runs-amplitude``: keys whose top-k takes runs of neighbouring pages, and the bench's
measure of them (``picks_adjacency``), on CPU with the reference selection."""
from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from sparrow_server.sglang_plugin.scheduler.standalone_layer import make_case
from sparrow_server.sparsity import selection as S

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("kernel_bench", ROOT / "benchmarks/sparse_kernel_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference_picks(case, budget_pages: int) -> torch.Tensor:
    """[H, budget] pages the reference selection keeps for the case's one request (sink 1, recent 2)."""
    k, _ = case.dense_kv()
    n = int(case.lengths[0]) // case.page_size
    scores = S.page_scores(S.query_summary(case.q, k.shape[2]), S.batched_page_landmarks(k, case.page_size))
    ids, _ = S.select_pages(scores, torch.tensor([n]), torch.tensor([budget_pages]), 1, 2)
    return ids[0]


def _adjacency(rows: torch.Tensor) -> float:
    """The share of the rows' pages with a neighbour (page +- 1) in the same row."""
    beside = [np.isin(r - 1, r) | np.isin(r + 1, r) for r in (row[row >= 0].numpy() for row in rows)]
    return float(np.concatenate(beside).mean())


def test_runs_amplitude_makes_the_top_k_pick_runs_each_head_its_own(bench):
    """At 16K and the schedule's 224 pages: random keys pick neighbours as uniform draws do (~0.37), shaped keys
    as the dummy-weight server did (0.87 in call 39), and the heads still pick apart (low overlap)."""
    random_case = make_case([16384], device="cpu", seed=1)
    runs_case = make_case([16384], device="cpu", seed=1)
    bench.shape_for_runs(runs_case, 2.5)
    assert _adjacency(_reference_picks(random_case, 224)) < 0.5
    picks = _reference_picks(runs_case, 224)
    assert _adjacency(picks) > 0.8
    sets = [set(row.tolist()) for row in picks]
    overlap = np.mean([len(a & b) / len(a | b) for i, a in enumerate(sets) for b in sets[i + 1:]])
    assert overlap < 0.3


def test_picks_adjacency_counts_pool_neighbours_within_a_row(bench):
    """Row 0 holds pool pages 3, 4 and 9 (two beside each other), row 1 pages 5 and 7 (none): 2 of 5; a neighbour in
    another row does not count. Index entries are page ids of one KV head's view: page x H + head."""
    h, ps = 2, bench.PS
    pages, heads = [3, 4, 9, 5, 7], [0, 0, 0, 1, 1]
    layer = types.SimpleNamespace(h=h, indices=torch.tensor([p * ps * h + hd for p, hd in zip(pages, heads)]),
                                  plan=types.SimpleNamespace(row_indptr=np.array([0, 3, 5])))
    assert bench.picks_adjacency(layer) == 0.4
