"""Block selection and sparse decode attention against explicit per-(request, KV head) loops."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparrow_server.sparsity.selection import (
    batched_page_landmarks, dense_decode_attention, num_pages, page_landmarks, page_scores,
    query_summary, select_pages, sparse_decode_attention, token_mask,
)

PS = 16


def _batch(lengths, hq=8, hkv=2, d=16, dtype=torch.float64, seed=0, integer=False):
    g = torch.Generator().manual_seed(seed)
    b, lmax = len(lengths), max(lengths)
    shape_q, shape_k = (b, hq, d), (b, lmax, hkv, d)
    if integer:  # exactly representable scores (ties included): the tie-break is tested exactly
        q = torch.randint(-3, 4, shape_q, generator=g).to(dtype)
        k = torch.randint(-3, 4, shape_k, generator=g).to(dtype)
    else:
        q = torch.randn(shape_q, generator=g, dtype=dtype)
        k = torch.randn(shape_k, generator=g, dtype=dtype)
    v = torch.randn(shape_k, generator=g, dtype=dtype)
    lens = torch.tensor(lengths)
    pad = torch.arange(lmax)[None, :] >= lens[:, None]
    k[pad] = 0
    v[pad] = 0
    return q, k, v, lens


def _loop_selection(q, k, lengths, budgets, sink, recent):
    """Reference: explicit loops, float64, ties broken by earlier position."""
    b, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    q, k = q.double().tolist(), k.double().tolist()  # plain Python floats: a float64 reference
    out = []
    for r in range(b):
        L, budget = int(lengths[r]), int(budgets[r])
        n = math.ceil(L / PS)
        rows = []
        for h in range(hkv):
            if n <= budget:
                rows.append(list(range(n)))
                continue
            reserved = set(range(min(sink, n))) | set(range(n - recent, n))
            qm = [sum(q[r][h * g + j][e] for j in range(g)) / g for e in range(d)]
            scored = []
            for p in range(n):
                if p in reserved:
                    continue
                lm = [sum(k[r][p * PS + t][h][e] for t in range(PS)) / PS for e in range(d)]
                scored.append((-sum(a * c for a, c in zip(qm, lm)), p))
            top = [p for _, p in sorted(scored)[: budget - len(reserved)]]
            rows.append(sorted(reserved | set(top)))
        out.append(rows)
    return out


def _select(q, k, lengths, budgets, sink, recent):
    lmax = k.shape[1]
    pad = (-lmax) % PS
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad))
    scores = page_scores(query_summary(q, k.shape[2]), batched_page_landmarks(kp, PS))
    return select_pages(scores, num_pages(lengths, PS), budgets, sink, recent)


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("sink,recent", [(1, 2), (0, 1), (2, 3)])
def test_select_pages_matches_loop(integer, sink, recent):
    lengths = [1, 15, 16, 17, 100, 160, 161, 333, 512, 700]
    budgets = torch.tensor([8, 8, 8, 8, 5, 6, 8, 10, 9, 12])
    q, k, _, lens = _batch(lengths, seed=3 if integer else 4, integer=integer)
    page_ids, counts = _select(q, k, lens, budgets, sink, recent)
    expected = _loop_selection(q, k, lens, budgets, sink, recent)
    got = [[[int(p) for p in row if p >= 0] for row in req] for req in page_ids.tolist()]
    assert got == expected
    assert counts.tolist() == [min(math.ceil(L / PS), int(bud)) for L, bud in zip(lengths, budgets)]
    # padding only at the end of each row, ids ascending
    for req in page_ids.tolist():
        for row in req:
            kept = [p for p in row if p >= 0]
            assert row[: len(kept)] == kept and kept == sorted(kept)


def test_last_page_always_selected_and_last():
    q, k, _, lens = _batch([161, 300, 479], seed=5)
    page_ids, counts = _select(q, k, lens, torch.tensor([4, 4, 4]), 1, 2)
    for r, L in enumerate([161, 300, 479]):
        last = math.ceil(L / PS) - 1
        for row in page_ids[r].tolist():
            kept = [p for p in row if p >= 0]
            assert kept[0] == 0 and kept[-1] == last and kept[-2] == last - 1 and len(kept) == 4


def test_landmarks_are_fp32_page_means():
    keys = torch.randn(50, 3, 8, dtype=torch.bfloat16)
    lm = page_landmarks(keys, PS)
    assert lm.dtype == torch.float32 and lm.shape == (3, 3, 8)
    ref = keys[:48].double().view(3, PS, 3, 8).mean(1)
    assert torch.allclose(lm.double(), ref, atol=1e-6)


def _loop_attention(q, k, v, lengths, selections, scale):
    b, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    out = torch.zeros(b, hq, d, dtype=torch.float64)
    for r in range(b):
        for h in range(hkv):
            toks = [t for p in selections[r][h] for t in range(p * PS, (p + 1) * PS) if t < int(lengths[r])]
            kk, vv = k[r, toks, h].double(), v[r, toks, h].double()
            for j in range(g):
                w = torch.softmax((kk @ q[r, h * g + j].double()) * scale, dim=0)
                out[r, h * g + j] = w @ vv
    return out


def test_sparse_attention_matches_loop_float64():
    lengths = [40, 161, 250, 400]
    q, k, v, lens = _batch(lengths, seed=6)
    budgets = torch.tensor([4, 5, 6, 7])
    scale = 16 ** -0.5
    out, page_ids = sparse_decode_attention(q, k, v, lens, budgets, PS, 1, 2, scale)
    selections = _loop_selection(q, k, lens, budgets, 1, 2)
    assert out.dtype == torch.float64
    assert torch.allclose(out, _loop_attention(q, k, v, lens, selections, scale), atol=1e-12)


def test_full_budget_equals_dense_fp32():
    lengths = [1, 17, 256, 301]
    q, k, v, lens = _batch(lengths, dtype=torch.float32, seed=7)
    scale = 16 ** -0.5
    full = torch.tensor([math.ceil(L / PS) for L in lengths])
    out, page_ids = sparse_decode_attention(q, k, v, lens, full, PS, 1, 2, scale)
    dense = dense_decode_attention(q, k, v, lens, scale)
    assert out.dtype == torch.float32
    assert torch.allclose(out, dense, atol=1e-6, rtol=0)
    # and both equal a float64 reference attention over every token
    ref = _loop_attention(q, k, v, lens, [[list(range(n))] * 2 for n in full.tolist()], scale)
    assert torch.allclose(dense.double(), ref, atol=1e-6)
    # a budget larger than the sequence is also exactly dense
    out_big, _ = sparse_decode_attention(q, k, v, lens, full + 5, PS, 1, 2, scale)
    assert torch.equal(out_big, out)


def test_token_mask_matches_loop():
    page_ids = torch.tensor([[[0, 2, -1]], [[1, 3, 4]]])
    lengths = torch.tensor([40, 70])
    mask = token_mask(page_ids, lengths, PS, 80)
    for r, L in enumerate([40, 70]):
        sel = [p for p in page_ids[r, 0].tolist() if p >= 0]
        ref = [t < L and t // PS in sel for t in range(80)]
        assert mask[r, 0].tolist() == ref


def test_nan_scores_rank_last_and_never_evict_reserved_pages():
    # Regression: a descending sort put NaN first, above the reserved (sink/recent) pages.
    nan = float("nan")
    scores = torch.tensor([[[0.0, 1.0, nan, 3.0, 2.0, 0.5, nan, nan]]])
    page_ids, _ = select_pages(scores, torch.tensor([8]), torch.tensor([5]), 1, 2)
    assert page_ids.tolist() == [[[0, 3, 4, 6, 7]]]
    all_nan = torch.full((1, 1, 8), nan)
    page_ids, _ = select_pages(all_nan, torch.tensor([8]), torch.tensor([4]), 1, 2)
    assert page_ids.tolist() == [[[0, 1, 6, 7]]]


def test_budget_below_reserved_is_refused_for_sparse_rows():
    with pytest.raises(ValueError, match="budget_pages = 2"):
        select_pages(torch.randn(1, 1, 8), torch.tensor([8]), torch.tensor([2]), 1, 2)
    # a dense row (sequence no longer than the budget) is fine
    page_ids, counts = select_pages(torch.randn(1, 1, 8), torch.tensor([2]), torch.tensor([2]), 1, 2)
    assert page_ids.tolist() == [[[0, 1]]] and counts.tolist() == [2]


@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=4),
    budget_extra=st.lists(st.integers(0, 12), min_size=4, max_size=4),
    sink=st.integers(0, 2),
    recent=st.integers(1, 3),
    gqa=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_select_pages_matches_loop_property(lengths, budget_extra, sink, recent, gqa, seed):
    budgets = torch.tensor([sink + recent + e for e in budget_extra[: len(lengths)]])
    q, k, v, lens = _batch(lengths, hq=2 * gqa, hkv=2, d=8, seed=seed, integer=True)
    page_ids, counts = _select(q, k, lens, budgets, sink, recent)
    got = [[[int(p) for p in row if p >= 0] for row in req] for req in page_ids.tolist()]
    assert got == _loop_selection(q, k, lens, budgets, sink, recent)
    out, _ = sparse_decode_attention(q, k, v, lens, budgets, PS, sink, recent, 8 ** -0.5)
    ref = _loop_attention(q, k, v, lens, got, 8 ** -0.5)
    assert torch.allclose(out, ref, atol=1e-10)
