"""Acceptance estimators against float64 brute-force references on random logits."""
from __future__ import annotations

import math

import pytest
import torch

from sparrow_server.stats.acceptance import (
    exact_acceptance, logits_to_topk, sampled_acceptance, topk_acceptance_lower_bound,
    truncated_importance_weights,
)


def _pair(t=24, v=300, seed=0, noise=0.7):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(t, v, generator=g, dtype=torch.float64) * 3
    sparse = dense + noise * torch.randn(t, v, generator=g, dtype=torch.float64)
    return sparse, dense


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
