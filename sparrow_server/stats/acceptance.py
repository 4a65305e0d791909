"""Per-token agreement between the sparse (rollout) policy and the dense policy.

Acceptance (paper Eq. 2, after Leviathan et al.): ``a_t = sum_v min(p_sparse(v), p_dense(v))``
= 1 - TV(p_sparse, p_dense), in [0, 1], 1 when the two distributions agree. Probabilities are
``softmax(logits / temperature)`` with no top-k/top-p truncation, as SGLang reports logprobs.

Shapes: ``T`` tokens, ``V`` vocabulary, ``K`` top-k list length.
"""
from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_TEMPERATURE = 1.0
DEFAULT_CHUNK_TOKENS = 256  # rows per chunk: 256 x 152K vocab x 4 B = 156 MB per temporary


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature = {temperature!r}: must be > 0")


def _acc_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def exact_acceptance(
    sparse_logits: Tensor,
    dense_logits: Tensor,
    temperature: float = DEFAULT_TEMPERATURE,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Tensor:
    """Exact acceptance from full logits. sparse_logits, dense_logits: [T, V] -> [T].

    Computed in float32 (float64 if either input is float64), in log space:
    ``min(p, q) = exp(min(log p, log q))``, ``chunk_tokens`` rows at a time (bounds the
    temporaries at a large vocabulary). Result clamped to [0, 1].
    """
    _check_temperature(temperature)
    if sparse_logits.shape != dense_logits.shape or sparse_logits.dim() != 2:
        raise ValueError(
            f"dense_logits shape {tuple(dense_logits.shape)} and sparse_logits shape "
            f"{tuple(sparse_logits.shape)} must be the same [T, V]"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens = {chunk_tokens!r}: must be >= 1")
    dtype = _acc_dtype(sparse_logits, dense_logits)
    out = []
    for s, d in zip(sparse_logits.split(chunk_tokens), dense_logits.split(chunk_tokens)):
        log_p = torch.log_softmax(s.to(dtype) / temperature, dim=-1)
        log_q = torch.log_softmax(d.to(dtype) / temperature, dim=-1)
        out.append(torch.minimum(log_p, log_q).exp().sum(dim=-1))
    if not out:
        return torch.zeros(0, dtype=dtype, device=sparse_logits.device)
    return torch.cat(out).clamp(0.0, 1.0)


def topk_acceptance_lower_bound(
    sparse_ids: Tensor, sparse_logprobs: Tensor, dense_ids: Tensor, dense_logprobs: Tensor
) -> Tensor:
    """Lower bound on acceptance from two top-k lists (what the paper's trainer computes).

    sparse_ids/sparse_logprobs: [T, Ks], dense_ids/dense_logprobs: [T, Kd] (ids int, logprobs
    natural log at the rollout temperature; ids < 0 are padding). Over the union of ids, an id
    missing from one list counts probability 0 there, so only ids in both lists contribute
    ``min(p_s, p_d)``; every term is a term of the exact sum, so the result never exceeds it.
    Returns [T] in the logprobs' float dtype (float32 at least).
    """
    for name, ids, lp in (("sparse", sparse_ids, sparse_logprobs), ("dense", dense_ids, dense_logprobs)):
        if ids.shape != lp.shape or ids.dim() != 2:
            raise ValueError(f"{name}_ids {tuple(ids.shape)} and {name}_logprobs {tuple(lp.shape)} must both be [T, K]")
    if sparse_ids.shape[0] != dense_ids.shape[0]:
        raise ValueError(f"token counts differ: sparse {sparse_ids.shape[0]} vs dense {dense_ids.shape[0]}")
    dtype = _acc_dtype(sparse_logprobs, dense_logprobs)
    same = (sparse_ids[:, :, None] == dense_ids[:, None, :]) & (sparse_ids[:, :, None] >= 0)  # [T, Ks, Kd]
    both = torch.minimum(sparse_logprobs.to(dtype)[:, :, None], dense_logprobs.to(dtype)[:, None, :])
    # A list may repeat an id only through padding; count each sparse entry at most once.
    per_sparse = torch.where(same, both.exp(), torch.zeros((), dtype=dtype)).amax(dim=2)  # [T, Ks]
    return per_sparse.sum(dim=1).clamp(0.0, 1.0)


def topk_acceptance_upper_bound(
    sparse_ids: Tensor, sparse_logprobs: Tensor, dense_ids: Tensor, dense_logprobs: Tensor
) -> Tensor:
    """Upper bound on acceptance from the same two top-k lists (arguments as ``topk_acceptance_lower_bound``).

    Each list is taken to hold its distribution's most likely ids, so an id missing from a list has at
    most the list's smallest probability there (``p_s_min``, ``p_d_min``). With ``L`` the lower bound,
    ``B = S ∩ D`` the ids in both lists, the exact value's remaining terms are at most either of
    ``1 - P_s(B)``, ``1 - P_d(B)`` (all the mass outside ``B``) or
    ``Σ_{S \\ D} min(p_s, p_d_min) + Σ_{D \\ S} min(p_d, p_s_min) + min(1 - P_s(S), 1 - P_d(D))``
    (ids in one list; ids in neither). Returns ``L`` plus the smallest, clamped to [0, 1]: [T].
    """
    lower = topk_acceptance_lower_bound(sparse_ids, sparse_logprobs, dense_ids, dense_logprobs)
    dtype = lower.dtype
    ps = torch.where(sparse_ids >= 0, sparse_logprobs.to(dtype).exp(), torch.zeros((), dtype=dtype))  # [T, Ks]
    pd = torch.where(dense_ids >= 0, dense_logprobs.to(dtype).exp(), torch.zeros((), dtype=dtype))  # [T, Kd]
    same = (sparse_ids[:, :, None] == dense_ids[:, None, :]) & (sparse_ids[:, :, None] >= 0)  # [T, Ks, Kd]
    s_in_d, d_in_s = same.any(dim=2), same.any(dim=1)  # [T, Ks], [T, Kd]
    ps_min = torch.where(sparse_ids >= 0, ps, torch.ones((), dtype=dtype)).amin(dim=1, keepdim=True)  # [T, 1]
    pd_min = torch.where(dense_ids >= 0, pd, torch.ones((), dtype=dtype)).amin(dim=1, keepdim=True)
    outside_b = torch.minimum(1 - (ps * s_in_d).sum(1), 1 - (pd * d_in_s).sum(1))
    one_list = (torch.minimum(ps, pd_min) * ~s_in_d).sum(1) + (torch.minimum(pd, ps_min) * ~d_in_s).sum(1)
    neither = torch.minimum(1 - ps.sum(1), 1 - pd.sum(1))
    slack = torch.minimum(outside_b, one_list + neither).clamp(min=0.0)
    return (lower + slack).clamp(0.0, 1.0)


def sampled_acceptance(dense_logprob: Tensor, sparse_logprob: Tensor) -> Tensor:
    """Per-token ``min(1, p_dense(x_t) / p_sparse(x_t))`` for the sampled tokens x_t ~ p_sparse.

    dense_logprob, sparse_logprob: [...] logprobs of the sampled tokens -> [...]. Its mean over
    tokens is an unbiased estimate of the mean acceptance (E_{x~p_s} min(1, p_d/p_s) = a).
    """
    return torch.exp(torch.clamp(dense_logprob - sparse_logprob, max=0.0))


def truncated_importance_weights(dense_logprob: Tensor, sparse_logprob: Tensor, cap: float) -> Tensor:
    """TIS weights ``min(exp(dense - sparse), cap)`` (paper Eq. 1). [...] -> [...]."""
    if not cap > 0:
        raise ValueError(f"cap = {cap!r}: must be > 0")
    return torch.exp(dense_logprob - sparse_logprob).clamp(max=cap)


def logits_to_topk(logits: Tensor, k: int, temperature: float = DEFAULT_TEMPERATURE) -> tuple[Tensor, Tensor]:
    """Top-k (ids, logprobs) of ``log_softmax(logits / temperature)``. logits: [T, V] -> ([T, k], [T, k])."""
    _check_temperature(temperature)
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"k = {k!r}: must be in [1, {logits.shape[-1]}]")
    logprobs = torch.log_softmax(logits.to(_acc_dtype(logits)) / temperature, dim=-1)
    values, ids = torch.topk(logprobs, k, dim=-1)
    return ids, values


def compact_logits(logits: Tensor) -> Tensor:
    """A logits row kept in 16 bits for a later exact acceptance: ``logits - max`` as float16. [..., V] -> [..., V].

    Softmax is shift-invariant, so ``exact_acceptance`` of the result equals that of ``logits`` up to the
    rounding: float16 steps are at most 2^-7 nats within 16 nats of the maximum, where the probability is
    (SmolLM2 against the float32 oracle: at most 3e-4 per token; raw bfloat16 logits: up to 0.044).
    """
    return (logits - logits.amax(dim=-1, keepdim=True)).to(torch.float16)


__all__ = [
    "exact_acceptance", "topk_acceptance_lower_bound", "topk_acceptance_upper_bound", "sampled_acceptance",
    "truncated_importance_weights", "logits_to_topk", "compact_logits", "DEFAULT_TEMPERATURE",
]
