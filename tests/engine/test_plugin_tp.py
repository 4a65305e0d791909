"""CPU tests of the plug-in under tensor parallelism: SGLang's KV-head partition, per-rank plans
against the one-rank plan, and per-rank selection (the GPU kernels' references) against one rank's.

Each TP rank's ``sparrow`` backend plans with its own KV-head count; these tests check that its rows
are exactly the one-rank plan's rows of the heads it holds, so concatenating the ranks' rows (per
request, replicas dropped) gives the one-rank plan.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparrow_server.kernels import reference as R
from sparrow_server.sglang_plugin.scheduler.planning import (
    REQUEST_FIELDS, kv_heads_per_rank, logical_page_lists, pack, packed_layout, plan_step, rank_kv_heads, rank_plan,
)
from sparrow_server.sparsity.schedule import Schedule

PS = 16
# (total KV heads, TP size): even splits, one head per rank, and replication (ranks > KV heads).
CASES = [(8, 1), (8, 2), (8, 4), (8, 8), (4, 2), (2, 4), (1, 2), (2, 8)]


def _fixed(pages, sink=1, recent=2):
    return Schedule(name=f"fixed-{pages}", budgets_tokens=(pages * PS,), bin_tokens=10**9, sink_pages=sink,
                    recent_pages=recent, dense_layers=())


def _step(seed, total_kv, bs=6):
    """A one-rank plan of a mixed batch: sparse and dense requests, partial last pages."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 900, size=bs)
    schedules = [_fixed(int(p)) for p in rng.integers(4, 40, size=bs)]
    prompts = rng.integers(0, 300, size=bs)
    return schedules, lengths, prompts


def test_partition_matches_sglang_sharding():
    assert [rank_kv_heads(8, 2, r) for r in range(2)] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [rank_kv_heads(8, 8, r) for r in range(8)] == [(r,) for r in range(8)]
    assert [rank_kv_heads(2, 4, r) for r in range(4)] == [(0,), (0,), (1,), (1,)]  # shard id = rank // replicas
    assert [rank_kv_heads(1, 2, r) for r in range(2)] == [(0,), (0,)]
    assert kv_heads_per_rank(8, 2) == 4 and kv_heads_per_rank(2, 4) == 1 and kv_heads_per_rank(3, 1) == 3


@pytest.mark.parametrize("total,tp", [(8, 3), (3, 2), (6, 4), (0, 1), (4, 0)])
def test_partition_refuses_what_sglang_cannot_shard(total, tp):
    with pytest.raises(ValueError, match="tp_size|num_kv_heads"):
        kv_heads_per_rank(total, tp)


def test_partition_refuses_a_rank_out_of_range():
    for rank in (-1, 2):
        with pytest.raises(ValueError, match=f"rank={rank}"):
            rank_kv_heads(8, 2, rank)


@pytest.mark.parametrize("total,tp", CASES)
def test_partition_covers_every_head_equally(total, tp):
    held = [rank_kv_heads(total, tp, r) for r in range(tp)]
    assert all(len(h) == kv_heads_per_rank(total, tp) for h in held)
    owners = np.bincount([h for hs in held for h in hs], minlength=total)
    assert owners.tolist() == [max(1, tp // total)] * total


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("total,tp", CASES)
def test_rank_plans_are_the_one_rank_rows_of_their_heads(total, tp, seed):
    schedules, lengths, prompts = _step(seed, total)
    one = plan_step(schedules, lengths, prompts, total, PS, topk_cap_pages=64)
    ranks = []
    for r in range(tp):
        heads = rank_kv_heads(total, tp, r)
        local = plan_step(schedules, lengths, prompts, kv_heads_per_rank(total, tp), PS, topk_cap_pages=64)
        want = rank_plan(one, heads)
        for f in (*REQUEST_FIELDS, "budget_tokens", "row_indptr", "last_page_len"):
            np.testing.assert_array_equal(getattr(local, f), getattr(want, f), err_msg=f"rank {r} {f}")
        assert local.num_kv_heads == len(heads) and local.clamped == one.clamped
        n_meta = packed_layout(len(lengths), local.num_kv_heads)["_total"][1]
        assert pack(local, packed_layout(len(lengths), local.num_kv_heads)).shape == (n_meta,)
        ranks.append((heads, local))
    # Concatenate, per request, the ranks' rows in rank order (a replicated head counted once).
    counts, last = [], []
    for b in range(len(lengths)):
        seen = set()
        for heads, local in ranks:
            for j, h in enumerate(heads):
                if h not in seen:
                    seen.add(h)
                    row = b * local.num_kv_heads + j
                    counts.append(int(local.row_indptr[row + 1] - local.row_indptr[row]))
                    last.append(int(local.last_page_len[row]))
    np.testing.assert_array_equal(np.concatenate([[0], np.cumsum(counts)]), one.row_indptr)
    np.testing.assert_array_equal(last, one.last_page_len)


def test_rank_plan_refuses_heads_outside_the_plan():
    schedules, lengths, prompts = _step(0, 4)
    one = plan_step(schedules, lengths, prompts, 4, PS, topk_cap_pages=64)
    for heads in ([], [4], [-1, 0]):
        with pytest.raises(ValueError, match="heads="):
            rank_plan(one, heads)


def _pool(lengths, h, d, seed):
    g = torch.Generator().manual_seed(seed)
    pages = [math.ceil(int(n) / PS) for n in lengths]
    phys = (torch.randperm(sum(pages), generator=g) + 1).tolist()
    r2t = torch.zeros(len(lengths) + 1, max(pages) * PS, dtype=torch.int32)
    off = 0
    for i, n in enumerate(pages):
        for j in range(n):
            r2t[i + 1, j * PS:(j + 1) * PS] = phys[off + j] * PS + torch.arange(PS)
        off += n
    return torch.randn((sum(pages) + 1) * PS, h, d, generator=g, dtype=torch.float64), r2t


def _select(q, k_buf, r2t, plan, lengths):
    """Landmarks -> scores -> top-k -> logical page list per row, as the GPU kernels do."""
    lm = torch.zeros(k_buf.shape[0] // PS, k_buf.shape[1], k_buf.shape[2], dtype=torch.float64)
    R.update_landmarks(k_buf, torch.arange(k_buf.shape[0]), lm, PS, only_full=False)
    f = {name: torch.from_numpy(getattr(plan, name)) for name in REQUEST_FIELDS}
    pcap = max(math.ceil(int(n) / PS) for n in lengths)
    scores = R.page_scores(q, lm, r2t, torch.arange(1, len(lengths) + 1), f["cand_lo"], f["cand_hi"], PS, pcap)
    top = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return lm, logical_page_lists(plan, top.numpy())


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("total,tp", [(8, 2), (8, 4), (4, 4), (2, 4)])
def test_rank_selection_matches_one_rank(total, tp, seed):
    """Each rank holds the KV slice ``[:, heads]`` and the query heads ``[rank * nq, (rank + 1) * nq)``
    (SGLang's q shard). Without replication its selections are the one-rank selections of its heads.
    With replication a replica scores its head with its own query sub-group only (no cross-rank
    reduction), so only the plan, not the chosen pages, is required to match."""
    group, d = 4, 8
    schedules, lengths, prompts = _step(seed, total)
    k_buf, r2t = _pool(lengths, total, d, seed)
    q = torch.randn(len(lengths), total * group, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    one = plan_step(schedules, lengths, prompts, total, PS, topk_cap_pages=64)
    lm_one, lists_one = _select(q, k_buf, r2t, one, lengths)
    nq = total * group // tp
    for r in range(tp):
        heads = rank_kv_heads(total, tp, r)
        local = plan_step(schedules, lengths, prompts, len(heads), PS, topk_cap_pages=64)
        k_rank = k_buf[:, list(heads)].contiguous()
        lm_rank, lists = _select(q[:, r * nq:(r + 1) * nq].contiguous(), k_rank, r2t, local, lengths)
        # landmarks sized per rank; equal up to float32 reduction order (a wrong head would be off by O(1))
        torch.testing.assert_close(lm_rank, lm_one[:, list(heads)], rtol=1e-5, atol=1e-6)
        for b in range(len(lengths)):
            for j, h in enumerate(heads):
                got, want = lists[b * len(heads) + j], lists_one[b * total + h]
                assert len(got) == len(want)
                if tp <= total:
                    assert got == want, (r, b, h)


def test_selection_records_carry_global_kv_heads(tmp_path):
    """A TP rank's debug records name its KV heads by their global number (what cross_engine compares)."""
    from sparrow_server.sglang_plugin.scheduler import selection_debug as D
    from test_selection_debug import _selected

    plan, ids, r2t, rows, lengths, want = _selected(3, lengths=[130, 192, 300, 448, 77])
    heads = rank_kv_heads(6, 2, 1)  # the pool of rank 1 of 2 holds global heads 3, 4, 5
    rec = D.SelectionRecorder(tmp_path, 64, PS, plan.num_kv_heads, heads=heads)
    rec.record(5, rows, lengths, np.arange(5) + 100, plan.row_indptr, ids, r2t, real_bs=5)
    rec.flush()
    got = D.load_records(tmp_path)
    assert got["head"].tolist() == list(heads) * 2  # requests 1 and 3 (lengths 192, 448)
    for i, (b, j) in enumerate([(b, j) for b in (1, 3) for j in range(len(heads))]):
        assert got["pages"][i].tolist() == sorted(want[b * len(heads) + j])
    with pytest.raises(ValueError, match="heads="):
        D.SelectionRecorder(tmp_path, 64, PS, 3, heads=(0, 1))


def test_throughput_benchmark_passes_tp_size_only_when_asked():
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import sglang_throughput as T

    args = argparse.Namespace(context_length=40960, max_running_requests=64, cuda_graph_max_bs=64, server_args=[],
                              tp_size=1)
    assert "--tp-size" not in T.server_flags(args)  # one GPU: the same flags as before
    flags = T.server_flags(argparse.Namespace(**{**vars(args), "tp_size": 2}))
    assert flags[flags.index("--tp-size") + 1] == "2"
