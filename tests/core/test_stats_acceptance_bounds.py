"""Acceptance bounds from partial distributions, and per-bin quantile brackets, against brute force."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.logit_pairs import logit_pair as _pair
from sparrow_server.stats.acceptance import (
    exact_acceptance, logits_to_topk, topk_acceptance_lower_bound, topk_acceptance_upper_bound,
)
from sparrow_server.stats.acceptance_bounds import (
    residual_sampled_estimate, sparse_topk_dense_full_bounds, topk_acceptance_bounds,
)
from sparrow_server.stats.tail import binned_quantile_brackets, binned_quantiles


def _lists(sparse, dense, k):
    return (*logits_to_topk(sparse, k), *logits_to_topk(dense, k))


@pytest.mark.parametrize("k", [1, 5, 20, 300])
@pytest.mark.parametrize("noise", [0.05, 1.5, 6.0])
def test_two_sided_bounds_equal_the_quadratic_reference_and_contain_exact(k, noise):
    sparse, dense = _pair(seed=7, noise=noise)
    lists = _lists(sparse, dense, k)
    lower, upper = topk_acceptance_bounds(*lists)
    assert torch.allclose(lower, topk_acceptance_lower_bound(*lists), atol=1e-12)
    assert torch.allclose(upper, topk_acceptance_upper_bound(*lists), atol=1e-12)
    exact = exact_acceptance(sparse, dense)
    assert bool((lower <= exact + 1e-12).all() and (exact <= upper + 1e-12).all())
    if k == sparse.shape[1]:
        assert torch.allclose(lower, exact, atol=1e-12) and torch.allclose(upper, exact, atol=1e-12)


def test_two_sided_bounds_do_not_depend_on_list_order_and_ignore_padding():
    sparse, dense = _pair(t=10, v=60, seed=3, noise=1.0)
    s_ids, s_lp, d_ids, d_lp = _lists(sparse, dense, 12)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    shuffled = topk_acceptance_bounds(s_ids[:, perm], s_lp[:, perm], d_ids.flip(1), d_lp.flip(1))
    for got, want in zip(shuffled, topk_acceptance_bounds(s_ids, s_lp, d_ids, d_lp)):
        assert torch.allclose(got, want, atol=1e-12)
    # Padding (id -1, logprob -inf) on both sides: the same as the quadratic reference.
    pad_ids = torch.full((10, 3), -1)
    pad_lp = torch.full((10, 3), float("-inf"), dtype=torch.float64)
    padded = (torch.cat([s_ids[:, :9], pad_ids], 1), torch.cat([s_lp[:, :9], pad_lp], 1),
              torch.cat([pad_ids, d_ids[:, :9]], 1), torch.cat([pad_lp, d_lp[:, :9]], 1))
    lower, upper = topk_acceptance_bounds(*padded)
    assert torch.allclose(lower, topk_acceptance_lower_bound(*padded), atol=1e-12)
    assert torch.allclose(upper, topk_acceptance_upper_bound(*padded), atol=1e-12)


def test_two_sided_bounds_shape_errors():
    ids = torch.zeros(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="sparse_ids"):
        topk_acceptance_bounds(ids, torch.zeros(4, 2), ids, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="token counts"):
        topk_acceptance_bounds(ids, torch.zeros(4, 3), ids[:2], torch.zeros(2, 3))


def _best_sparse_completion(s_ids, s_lp, p_dense):
    """Largest acceptance of any sparse distribution with this top-k list against the full dense one:
    a linear program over the unlisted sparse probabilities x_v in [0, c], sum r, and m_v <= x_v, p_d(v)."""
    from scipy.optimize import linprog

    listed = {int(i): float(np.exp(x)) for i, x in zip(s_ids, s_lp)}
    fixed = sum(min(p, float(p_dense[i])) for i, p in listed.items())
    rest = [v for v in range(len(p_dense)) if v not in listed]
    n, cap, r = len(rest), min(listed.values()), 1.0 - sum(listed.values())
    a_ub = [[-1.0 if j == i else 0.0 for j in range(n)] + [1.0 if j == i else 0.0 for j in range(n)] for i in range(n)]
    res = linprog([0.0] * n + [-1.0] * n, A_ub=a_ub, b_ub=[0.0] * n, A_eq=[[1.0] * n + [0.0] * n], b_eq=[r],
                  bounds=[(0.0, cap)] * n + [(0.0, float(p_dense[v])) for v in rest])
    assert res.status == 0, res.message
    return fixed - res.fun


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_full_dense_upper_bound_is_the_best_sparse_completion(k, seed):
    sparse, dense = _pair(t=5, v=14, seed=seed, noise=1.0 + seed)
    s_ids, s_lp = logits_to_topk(sparse, k)
    log_q = torch.log_softmax(dense, -1)
    lower, upper = sparse_topk_dense_full_bounds(s_ids, s_lp, log_q)
    for t in range(5):
        best = _best_sparse_completion(s_ids[t].tolist(), s_lp[t].tolist(), log_q[t].exp().tolist())
        assert float(upper[t]) == pytest.approx(min(best, 1.0), abs=1e-7)  # the LP solver's tolerance


@pytest.mark.parametrize("k", [1, 5, 20, 300])
@pytest.mark.parametrize("noise", [0.05, 1.5, 6.0])
def test_full_dense_bounds_contain_exact_and_sit_inside_the_two_sided_ones(k, noise):
    sparse, dense = _pair(seed=11, noise=noise)
    s_ids, s_lp, d_ids, d_lp = _lists(sparse, dense, k)
    lower, upper = sparse_topk_dense_full_bounds(s_ids, s_lp, torch.log_softmax(dense, -1))
    exact = exact_acceptance(sparse, dense)
    assert bool((lower <= exact + 1e-12).all() and (exact <= upper + 1e-12).all())
    lo2, up2 = topk_acceptance_bounds(s_ids, s_lp, d_ids, d_lp)
    assert bool((lower >= lo2 - 1e-12).all() and (upper <= up2 + 1e-12).all())
    if k == sparse.shape[1]:
        assert torch.allclose(lower, exact, atol=1e-12) and torch.allclose(upper, exact, atol=1e-12)


def test_full_dense_bounds_shape_error():
    ids = torch.zeros(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="dense_logprobs"):
        sparse_topk_dense_full_bounds(ids, torch.zeros(4, 3), torch.zeros(3, 10))


@pytest.mark.parametrize("k", [1, 4, 30])
def test_residual_estimate_is_unbiased_before_clipping_and_clipping_only_helps(k):
    # The expectation over x ~ p_s, summed exactly over the vocabulary (no sampling).
    sparse, dense = _pair(t=6, v=40, seed=5, noise=2.0)
    s_ids, s_lp, d_ids, d_lp = _lists(sparse, dense, k)
    lower, upper = topk_acceptance_bounds(s_ids, s_lp, d_ids, d_lp)
    log_p, log_q = torch.log_softmax(sparse, -1), torch.log_softmax(dense, -1)
    exact = exact_acceptance(sparse, dense)
    v = sparse.shape[1]
    for t in range(6):
        x = torch.arange(v)
        known = (s_ids[t][None] == x[:, None]).any(1) & (d_ids[t][None] == x[:, None]).any(1)
        args = (lower[t].expand(v), known, log_p[t], log_q[t])
        unclipped = residual_sampled_estimate(args[0], torch.ones(v, dtype=torch.float64) * 10, *args[1:])
        assert float((log_p[t].exp() * unclipped).sum()) == pytest.approx(float(exact[t]), abs=1e-12)
        clipped = residual_sampled_estimate(args[0], upper[t].expand(v), *args[1:])
        assert bool(((clipped - exact[t]).abs() <= (unclipped - exact[t]).abs() + 1e-12).all())
        assert bool((clipped >= lower[t] - 1e-12).all() and (clipped <= upper[t] + 1e-12).all())


def test_quantile_brackets_contain_the_quantile_of_any_values_between_the_bounds():
    rng = np.random.default_rng(0)
    n = 5000
    positions = rng.integers(0, 8000, n)
    exact = np.clip(1 - rng.beta(0.6, 6, n), 0, 1)
    lower = exact * rng.uniform(0.3, 1.0, n)
    upper = np.minimum(1.0, exact + rng.uniform(0, 0.3, n))
    brackets = binned_quantile_brackets(lower, upper, positions, bin_tokens=2000)
    truth = binned_quantiles(exact, positions, bin_tokens=2000, n_boot=0)
    assert [b.bin_index for b in brackets] == [0, 1, 2, 3]
    for b, t in zip(brackets, truth):
        assert b.n_tokens == t.n_tokens
        assert b.low <= t.quantile <= b.high
        assert abs(b.mid - t.quantile) <= (b.high - b.low) / 2
    tight = binned_quantile_brackets(exact, exact, positions, bin_tokens=2000)
    assert [b.low for b in tight] == [b.high for b in tight] == [t.quantile for t in truth]
    with pytest.raises(ValueError, match="lower > upper"):
        binned_quantile_brackets(upper, lower, positions)


def test_compact_logits_keep_exact_acceptance_to_the_float16_rounding():
    from sparrow_server.stats.acceptance import compact_logits

    sparse, dense = _pair(t=64, v=2000, seed=9, noise=1.0)
    sparse = sparse * 2 + 40.0  # logits far from 0, where float16 of the raw logits would be coarse
    compact = compact_logits(sparse)
    assert compact.dtype == torch.float16 and bool((compact.amax(-1) == 0).all())
    exact = exact_acceptance(sparse, dense)
    # within 16 nats of the max a float16 step is <= 2^-7, so each probability is off by <= 2^-8 relative
    assert float((exact_acceptance(compact.double(), dense) - exact).abs().max()) <= 2 ** -8
    assert float((compact_logits(sparse + 123.0).double() - compact.double()).abs().max()) <= 2 ** -5  # one step


def _bounded_tokens(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    exact = np.clip(1 - rng.beta(0.6, 6, n), 0, 1)
    return exact, exact * rng.uniform(0.3, 1.0, n), np.minimum(1.0, exact + rng.uniform(0, 0.3, n))


@pytest.mark.parametrize("q", [0.05, 0.01, 0.5])
def test_subsample_bounds_quantile_with_every_token_kept_is_the_exact_quantile(q):
    from sparrow_server.stats.tail import subsample_bounds_quantile

    exact, lower, upper = _bounded_tokens()
    everything = np.arange(exact.size)
    want = np.quantile(exact, q, method="inverted_cdf")
    assert subsample_bounds_quantile(lower, upper, everything, exact, q) == want
    # Tight bounds settle every token: any subsample gives the exact quantile.
    assert subsample_bounds_quantile(exact, exact, everything[:7], exact[:7], q) == want


def test_subsample_bounds_quantile_is_within_its_bracket_and_beats_the_plain_subsample():
    from sparrow_server.stats.tail import subsample_bounds_quantile

    exact, lower, upper = _bounded_tokens(seed=1)
    rng = np.random.default_rng(2)
    truth = np.quantile(exact, 0.05, method="inverted_cdf")
    plain, hybrid = [], []
    for _ in range(200):
        kept = rng.choice(exact.size, 200, replace=False)
        got = subsample_bounds_quantile(lower, upper, kept, exact[kept])
        assert np.quantile(lower, 0.05, method="inverted_cdf") <= got <= np.quantile(upper, 0.05, method="inverted_cdf")
        hybrid.append(got - truth)
        plain.append(np.quantile(exact[kept], 0.05, method="inverted_cdf") - truth)
    assert abs(np.mean(hybrid)) < 0.01
    assert np.sqrt(np.mean(np.square(hybrid))) < np.sqrt(np.mean(np.square(plain)))


def test_subsample_bounds_quantile_rejects_values_outside_their_bounds():
    from sparrow_server.stats.tail import subsample_bounds_quantile

    exact, lower, upper = _bounded_tokens(n=10)
    with pytest.raises(ValueError, match="outside"):
        subsample_bounds_quantile(lower, upper, np.array([0]), upper[:1] + 0.1)
    with pytest.raises(ValueError, match="no exact values"):
        subsample_bounds_quantile(lower, upper, np.array([], dtype=int), np.array([]))
    assert np.isnan(subsample_bounds_quantile(np.array([]), np.array([]), np.array([0]), np.array([0.5])))
