"""Bounds and estimates of per-token acceptance when not both full distributions are known.

Acceptance ``a_t = sum_v min(p_s(v), p_d(v))`` (``stats.acceptance``). What a serving engine has:

- two top-k lists (sparse top-k recorded at decode, dense top-k from the verify pass):
  ``topk_acceptance_bounds`` gives ``(lower, upper)`` with ``lower <= a_t <= upper``, the same values as
  ``topk_acceptance_lower_bound`` / ``topk_acceptance_upper_bound`` but in O(T K) memory (a sort and a
  search instead of a [T, Ks, Kd] comparison), so K = 1024 fits;
- the sparse top-k and the *full* dense distribution (what a verify pass on the GPU holds):
  ``sparse_topk_dense_full_bounds``, whose upper bound is the largest value any sparse distribution
  with that top-k list could give;
- the sampled token's two logprobs: ``residual_sampled_estimate``, an unbiased estimate of ``a_t``
  that only randomises the mass outside the known ids, clipped to the bounds.

Shapes: ``T`` tokens, ``V`` vocabulary, ``K`` list length; ids < 0 are padding. Logprobs are natural
logs at the rollout temperature. Pure torch (no serving code): runs on the CPU or on the GPU.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _check_lists(name: str, ids: Tensor, logprobs: Tensor) -> None:
    if ids.shape != logprobs.shape or ids.dim() != 2:
        raise ValueError(
            f"{name}_ids {tuple(ids.shape)} and {name}_logprobs {tuple(logprobs.shape)} must both be [T, K]"
        )


def _dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _probs(ids: Tensor, logprobs: Tensor, dtype: torch.dtype) -> Tensor:
    """Probabilities of a top-k list, 0 at padding. [T, K] -> [T, K]."""
    return torch.where(ids >= 0, logprobs.to(dtype).exp(), torch.zeros((), dtype=dtype, device=ids.device))


def _lookup(query_ids: Tensor, ids: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """For each query id, whether it is in ``ids`` (same row) and its value there (0 if not).

    query_ids: [T, Kq]; ids, values: [T, K] -> ([T, Kq] bool, [T, Kq]). Padding (< 0) never matches.
    """
    order = ids.argsort(dim=1)
    sorted_ids = ids.gather(1, order)
    pos = torch.searchsorted(sorted_ids.contiguous(), query_ids.contiguous()).clamp(max=ids.shape[1] - 1)
    found = (sorted_ids.gather(1, pos) == query_ids) & (query_ids >= 0)
    vals = values.gather(1, order.gather(1, pos))
    return found, torch.where(found, vals, torch.zeros((), dtype=values.dtype, device=values.device))


def _list_min(probs: Tensor, ids: Tensor) -> Tensor:
    """Smallest probability in each list (1 for an all-padding row): [T, K] -> [T, 1]."""
    return torch.where(ids >= 0, probs, torch.ones((), dtype=probs.dtype, device=probs.device)).amin(1, keepdim=True)


def topk_acceptance_bounds(sparse_ids: Tensor, sparse_logprobs: Tensor, dense_ids: Tensor,
                           dense_logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """``(lower, upper)`` of acceptance from two top-k lists: ([T], [T]), clamped to [0, 1].

    Lower: ``sum over ids in both lists of min(p_s, p_d)``. Upper: lower plus the most the other ids
    can add, ``min(all mass outside B, one-list ids + ids in neither)`` with ``B`` the ids in both and
    an id missing from a list at most that list's smallest probability (the docstring of
    ``topk_acceptance_upper_bound`` spells it out). With K = V both equal the exact value.
    """
    _check_lists("sparse", sparse_ids, sparse_logprobs)
    _check_lists("dense", dense_ids, dense_logprobs)
    if sparse_ids.shape[0] != dense_ids.shape[0]:
        raise ValueError(f"token counts differ: sparse {sparse_ids.shape[0]} vs dense {dense_ids.shape[0]}")
    dtype = _dtype(sparse_logprobs, dense_logprobs)
    ps, pd = _probs(sparse_ids, sparse_logprobs, dtype), _probs(dense_ids, dense_logprobs, dtype)
    s_in_d, pd_at_s = _lookup(sparse_ids, dense_ids, pd)  # [T, Ks]
    d_in_s, _ = _lookup(dense_ids, sparse_ids, ps)  # [T, Kd]
    lower = (torch.minimum(ps, pd_at_s) * s_in_d).sum(1)
    outside_b = torch.minimum(1 - (ps * s_in_d).sum(1), 1 - (pd * d_in_s).sum(1))
    one_list = ((torch.minimum(ps, _list_min(pd, dense_ids)) * ~s_in_d).sum(1)
                + (torch.minimum(pd, _list_min(ps, sparse_ids)) * ~d_in_s).sum(1))
    neither = torch.minimum(1 - ps.sum(1), 1 - pd.sum(1))
    slack = torch.minimum(outside_b, one_list + neither).clamp(min=0.0)
    return lower.clamp(0.0, 1.0), (lower + slack).clamp(0.0, 1.0)


def sparse_topk_dense_full_bounds(sparse_ids: Tensor, sparse_logprobs: Tensor,
                                  dense_logprobs: Tensor) -> tuple[Tensor, Tensor]:
    """``(lower, upper)`` of acceptance from the sparse top-k and the full dense distribution.

    sparse_ids/sparse_logprobs: [T, K]; dense_logprobs: [T, V] (normalised log-softmax). With ``S`` the
    sparse list, ``c`` its smallest probability and ``r = 1 - P_s(S)`` the sparse mass outside it:
    lower ``sum_{v in S} min(p_s, p_d)``; upper adds ``min(r, sum_{v not in S} min(c, p_d(v)))``, the
    most any sparse distribution with that top-k list can add (fill ``min(c, p_d)`` outside ``S``).
    Returns ([T], [T]) clamped to [0, 1]; with K = V both equal the exact value.
    """
    _check_lists("sparse", sparse_ids, sparse_logprobs)
    if dense_logprobs.dim() != 2 or dense_logprobs.shape[0] != sparse_ids.shape[0]:
        raise ValueError(f"dense_logprobs {tuple(dense_logprobs.shape)} must be [T, V] with T = {sparse_ids.shape[0]}")
    dtype = _dtype(sparse_logprobs, dense_logprobs)
    ps = _probs(sparse_ids, sparse_logprobs, dtype)
    pd_full = dense_logprobs.to(dtype).exp()
    pd_at_s = pd_full.gather(1, sparse_ids.clamp(min=0)) * (sparse_ids >= 0)
    lower = torch.minimum(ps, pd_at_s).sum(1)
    c = _list_min(ps, sparse_ids)  # [T, 1]
    capped_outside = torch.minimum(pd_full, c).sum(1) - torch.minimum(pd_at_s, c).sum(1)
    rest = torch.minimum((1 - ps.sum(1)).clamp(min=0.0), capped_outside.clamp(min=0.0))
    return lower.clamp(0.0, 1.0), (lower + rest).clamp(0.0, 1.0)


def residual_sampled_estimate(lower: Tensor, upper: Tensor, sampled_known: Tensor, sparse_logprob: Tensor,
                              dense_logprob: Tensor) -> Tensor:
    """Unbiased-then-clipped estimate of acceptance from the sampled token x_t ~ p_s. All [T] -> [T].

    ``lower`` must be ``sum_{v in B} min(p_s, p_d)`` over a known id set ``B`` (both bounds'
    lower side is) and ``sampled_known`` whether ``x_t`` is in ``B``; then
    ``lower + [x_t not in B] min(1, p_d(x_t) / p_s(x_t))`` has expectation ``a_t`` (the sampled-token
    ratio applied to the mass outside ``B`` only). Clipping to ``[lower, upper]`` can only move it
    closer to ``a_t`` (which lies in the interval); it then is no longer exactly unbiased.
    """
    ratio = torch.exp(torch.clamp(dense_logprob - sparse_logprob, max=0.0)).to(lower.dtype)
    est = lower + torch.where(sampled_known, torch.zeros_like(ratio), ratio)
    return torch.minimum(torch.maximum(est, lower), upper)


__all__ = ["topk_acceptance_bounds", "sparse_topk_dense_full_bounds", "residual_sampled_estimate"]
