"""Acceptance estimators against float64 brute-force references on random logits."""
from __future__ import annotations

import math

import pytest
import torch

from helpers.logit_pairs import logit_pair as _pair
from sparrow_server.stats.acceptance import (
    exact_acceptance, logits_to_topk, sampled_acceptance, topk_acceptance_lower_bound, topk_acceptance_upper_bound,
    truncated_importance_weights,
)


def _brute_acceptance(sparse, dense, temperature):
    out = []
    for s_row, d_row in zip(sparse.tolist(), dense.tolist()):
        def probs(row):
            m = max(row)
            e = [math.exp((x - m) / temperature) for x in row]
            z = sum(e)
            return [x / z for x in e]
        out.append(sum(min(p, q) for p, q in zip(probs(s_row), probs(d_row))))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_exact_acceptance_matches_brute_force(temperature):
    sparse, dense = _pair()
    ref = _brute_acceptance(sparse, dense, temperature)
    assert torch.allclose(exact_acceptance(sparse, dense, temperature), ref, atol=1e-12)
    assert torch.allclose(exact_acceptance(sparse, dense, temperature, chunk_tokens=5), ref, atol=1e-12)
    got32 = exact_acceptance(sparse.float(), dense.float(), temperature)
    assert got32.dtype == torch.float32
    assert torch.allclose(got32.double(), ref, atol=1e-5)


def test_exact_acceptance_is_one_minus_total_variation_and_bounds():
    sparse, dense = _pair(seed=1)
    p, q = torch.softmax(sparse, -1), torch.softmax(dense, -1)
    tv = 0.5 * (p - q).abs().sum(-1)
    assert torch.allclose(exact_acceptance(sparse, dense), 1 - tv, atol=1e-12)
    assert torch.allclose(exact_acceptance(dense, dense), torch.ones(dense.shape[0], dtype=torch.float64))
    a = exact_acceptance(sparse, dense)
    assert bool(((a >= 0) & (a <= 1)).all())


def test_exact_acceptance_rejects_bad_input():
    sparse, dense = _pair()
    with pytest.raises(ValueError, match="temperature"):
        exact_acceptance(sparse, dense, 0.0)
    with pytest.raises(ValueError, match="dense_logits shape"):
        exact_acceptance(sparse, dense[:, :10])
    with pytest.raises(ValueError, match="chunk_tokens"):
        exact_acceptance(sparse, dense, chunk_tokens=0)
    assert exact_acceptance(sparse[:0], dense[:0]).shape == (0,)


def _brute_topk_bound(s_ids, s_lp, d_ids, d_lp):
    out = []
    for si, sl, di, dl in zip(s_ids.tolist(), s_lp.tolist(), d_ids.tolist(), d_lp.tolist()):
        ps = {i: math.exp(x) for i, x in zip(si, sl) if i >= 0}
        pd = {i: math.exp(x) for i, x in zip(di, dl) if i >= 0}
        out.append(sum(min(ps.get(i, 0.0), pd.get(i, 0.0)) for i in set(ps) | set(pd)))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("k", [1, 5, 20, 300])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topk_bound_matches_union_reference_and_never_exceeds_exact(k, seed):
    sparse, dense = _pair(seed=seed, noise=1.5)
    s_ids, s_lp = logits_to_topk(sparse, k)
    d_ids, d_lp = logits_to_topk(dense, k)
    bound = topk_acceptance_lower_bound(s_ids, s_lp, d_ids, d_lp)
    assert torch.allclose(bound, _brute_topk_bound(s_ids, s_lp, d_ids, d_lp), atol=1e-12)
    exact = exact_acceptance(sparse, dense)
    assert bool((bound <= exact + 1e-12).all())
    if k == sparse.shape[1]:
        assert torch.allclose(bound, exact, atol=1e-12)
    # float32 inputs keep the bound below the exact value too (up to fp32 rounding)
    s32 = logits_to_topk(sparse.float(), k)
    d32 = logits_to_topk(dense.float(), k)
    b32 = topk_acceptance_lower_bound(*s32, *d32)
    assert bool((b32.double() <= exact_acceptance(sparse.float(), dense.float()).double() + 1e-6).all())


def test_topk_bound_ignores_padding_and_disjoint_lists():
    s_ids = torch.tensor([[3, 7, -1], [1, 2, 3]])
    s_lp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.3, 0.3]], dtype=torch.float64))
    d_ids = torch.tensor([[7, 3, -1], [4, 5, 6]])
    d_lp = torch.log(torch.tensor([[0.6, 0.1, 0.3], [0.4, 0.3, 0.3]], dtype=torch.float64))
    bound = topk_acceptance_lower_bound(s_ids, s_lp, d_ids, d_lp)
    assert torch.allclose(bound, torch.tensor([0.1 + 0.3, 0.0], dtype=torch.float64))


def test_topk_bound_shape_errors():
    ids = torch.zeros(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="sparse_ids"):
        topk_acceptance_lower_bound(ids, torch.zeros(4, 2), ids, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="token counts"):
        topk_acceptance_lower_bound(ids, torch.zeros(4, 3), ids[:2], torch.zeros(2, 3))


def _best_completion(si, sl, di, dl, vocab):
    """The largest acceptance of any pair of distributions over ``vocab`` ids that the two top-k lists
    allow (an unlisted id at most the list's smallest probability): a linear program over
    (p_s, p_d, m) of the unlisted ids, maximising sum m with m <= p_s, m <= p_d."""
    from scipy.optimize import linprog

    ps = {i: math.exp(x) for i, x in zip(si, sl) if i >= 0}
    pd = {i: math.exp(x) for i, x in zip(di, dl) if i >= 0}
    n = vocab  # variables: p_s[0:n], p_d[n:2n], m[2n:3n]
    bounds, a_eq, b_eq, a_ub, b_ub = [], [], [], [], []
    for side in (ps, pd):
        cap = min(side.values())
        bounds += [(side[v], side[v]) if v in side else (0.0, cap) for v in range(n)]
    bounds += [(0.0, 1.0)] * n
    for offset in (0, n):
        row = [0.0] * (3 * n)
        row[offset:offset + n] = [1.0] * n
        a_eq.append(row)
        b_eq.append(1.0)
    for v in range(n):
        for offset in (0, n):
            row = [0.0] * (3 * n)
            row[2 * n + v], row[offset + v] = 1.0, -1.0
            a_ub.append(row)
            b_ub.append(0.0)
    res = linprog([0.0] * (2 * n) + [-1.0] * n, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds)
    assert res.status == 0, res.message
    return -res.fun


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_topk_upper_bound_covers_every_completion_the_lists_allow(k, seed):
    # Brute force: the best pair of full distributions consistent with the two lists (a linear program)
    # is never above the upper bound, nor the exact value of the pair the lists came from.
    vocab = 12
    sparse, dense = _pair(t=6, v=vocab, seed=seed, noise=1.0 + seed)
    s_ids, s_lp = logits_to_topk(sparse, k)
    d_ids, d_lp = logits_to_topk(dense, k)
    upper = topk_acceptance_upper_bound(s_ids, s_lp, d_ids, d_lp)
    lower = topk_acceptance_lower_bound(s_ids, s_lp, d_ids, d_lp)
    exact = exact_acceptance(sparse, dense)
    for t in range(6):
        best = _best_completion(s_ids[t].tolist(), s_lp[t].tolist(), d_ids[t].tolist(), d_lp[t].tolist(), vocab)
        assert exact[t] <= best + 1e-9
        assert best <= upper[t] + 1e-9, (t, best, float(upper[t]))
    assert bool((lower <= exact + 1e-12).all() and (upper <= 1.0).all())


@pytest.mark.parametrize("k", [1, 5, 20, 300])
@pytest.mark.parametrize("noise", [0.05, 1.5, 6.0])
def test_topk_upper_bound_is_above_exact_and_exact_with_the_full_lists(k, noise):
    sparse, dense = _pair(seed=4, noise=noise)
    s_ids, s_lp = logits_to_topk(sparse, k)
    d_ids, d_lp = logits_to_topk(dense, k)
    upper = topk_acceptance_upper_bound(s_ids, s_lp, d_ids, d_lp)
    exact = exact_acceptance(sparse, dense)
    assert bool((upper >= exact - 1e-12).all())
    if k == sparse.shape[1]:
        assert torch.allclose(upper, exact, atol=1e-12)
    # Identical lists: the lower bound is the listed mass, the upper bound 1 (the rest may agree fully).
    same = topk_acceptance_upper_bound(d_ids, d_lp, d_ids, d_lp)
    assert torch.allclose(same, torch.ones_like(same), atol=1e-12)


def test_topk_upper_bound_of_hand_computed_lists():
    # Row 0: both lists {3, 7}; sparse (0.5, 0.3), dense (0.1, 0.6) -> L = 0.1 + 0.3; outside B the sparse
    # side has 0.2 and the dense 0.3 left, so at most 0.2 more: 0.6.
    # Row 1: disjoint lists; sparse (0.4, 0.3) on {1, 2}, dense (0.5, 0.2) on {4, 5}: L = 0; one-list terms
    # min(0.4, 0.2) + min(0.3, 0.2) + min(0.5, 0.3) + min(0.2, 0.3) = 0.2 + 0.2 + 0.3 + 0.2, neither
    # min(0.3, 0.3) = 0.3: 1.2 > 1 - 0 -> 1.0 (the mass outside B bounds it).
    s_ids = torch.tensor([[3, 7], [1, 2]])
    s_lp = torch.log(torch.tensor([[0.5, 0.3], [0.4, 0.3]], dtype=torch.float64))
    d_ids = torch.tensor([[7, 3], [4, 5]])
    d_lp = torch.log(torch.tensor([[0.6, 0.1], [0.5, 0.2]], dtype=torch.float64))
    upper = topk_acceptance_upper_bound(s_ids, s_lp, d_ids, d_lp)
    assert torch.allclose(upper, torch.tensor([0.6, 1.0], dtype=torch.float64), atol=1e-12)
    # Row 2: sparse (0.9, 0.05) on {1, 2}, dense (0.9, 0.06) on {1, 3}: L = 0.9; outside B at most
    # min(0.1, 0.1) = 0.1; one-list min(0.05, 0.06) + min(0.06, 0.05) = 0.1, neither min(0.05, 0.04):
    # 0.14 -> 0.9 + 0.1 = 1.0. With sparse (0.9, 0.01) on {1, 2} and dense (0.8, 0.15) on {1, 3}: L = 0.8;
    # outside B min(0.1, 0.2) = 0.1; one-list 0.01 + 0.01, neither min(0.09, 0.05) = 0.05 -> 0.87.
    s_ids, d_ids = torch.tensor([[1, 2]]), torch.tensor([[1, 3]])
    s_lp = torch.log(torch.tensor([[0.9, 0.01]], dtype=torch.float64))
    d_lp = torch.log(torch.tensor([[0.8, 0.15]], dtype=torch.float64))
    assert torch.allclose(topk_acceptance_upper_bound(s_ids, s_lp, d_ids, d_lp),
                          torch.tensor([0.87], dtype=torch.float64), atol=1e-12)


def test_sampled_acceptance_estimates_mean_acceptance():
    sparse, dense = _pair(t=4, v=50, seed=3)
    g = torch.Generator().manual_seed(0)
    p_s = torch.softmax(sparse, -1)
    x = torch.multinomial(p_s, 40_000, replacement=True, generator=g)  # [T, S] samples from sparse
    lp_s = torch.log_softmax(sparse, -1).gather(1, x)
    lp_d = torch.log_softmax(dense, -1).gather(1, x)
    est = sampled_acceptance(lp_d, lp_s).mean(dim=1)
    assert torch.allclose(est, exact_acceptance(sparse, dense), atol=0.01)
    # exact per-element formula
    ref = torch.minimum(torch.ones_like(lp_d), (lp_d - lp_s).exp())
    assert torch.allclose(sampled_acceptance(lp_d, lp_s), ref)


def test_truncated_importance_weights():
    d = torch.tensor([0.0, -1.0, -0.1, -5.0])
    s = torch.tensor([-2.0, -1.0, -0.2, -0.1])
    w = truncated_importance_weights(d, s, cap=3.0)
    ref = torch.tensor([min(math.exp(2.0), 3.0), 1.0, math.exp(0.1), math.exp(-4.9)])
    assert torch.allclose(w, ref)
    with pytest.raises(ValueError, match="cap"):
        truncated_importance_weights(d, s, cap=0)
