"""Distillation losses between the sparse actor (with LoRA) and the dense base model.

Shapes: ``T`` sequence positions, ``G = T - prompt_len`` generated tokens, ``V`` vocabulary,
``K`` top-k list length. Logprobs are natural-log at the rollout temperature.
"""
from __future__ import annotations

import torch
from torch import Tensor

from sparrow_server.stats.acceptance import exact_acceptance

# Mass below this is treated as zero in the top-k "rest" bucket (keeps the log finite).
_REST_FLOOR = 1e-12


def generated_rows(logits: Tensor, prompt_len: int) -> Tensor:
    """Rows of ``logits`` [T, V] that predict the generated tokens: [G, V] (row t predicts token t+1)."""
    return logits[prompt_len - 1 : -1]


def generated_logprobs(logits: Tensor, input_ids: Tensor, prompt_len: int, temperature: float) -> Tensor:
    """Logprob of each generated token. logits: [T, V], input_ids: [T] -> [G] float32."""
    logp = torch.log_softmax(generated_rows(logits, prompt_len).float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[prompt_len:, None].to(logp.device))[:, 0]


def k3_per_token(dense_logprob: Tensor, sparse_logprob: Tensor, delta_clamp: float, clamp: float) -> Tensor:
    """k3 estimate of KL(sparse || dense) per sampled token: ``exp(d) - d - 1``, ``d = dense - sparse``.

    As the paper's ``low_var_kl``: ``d`` clamped to ``[-delta_clamp, delta_clamp]`` before the
    exponential, the result to ``[-clamp, clamp]``. [G], [G] -> [G]; >= 0, zero iff equal.
    """
    delta = torch.clamp(dense_logprob - sparse_logprob, -delta_clamp, delta_clamp)
    return torch.clamp(torch.exp(delta) - delta - 1.0, -clamp, clamp)


def topk_forward_kl_per_token(dense_topk_ids: Tensor, dense_topk_logprobs: Tensor, sparse_logprobs: Tensor) -> Tensor:
    """Forward KL(dense || sparse) over the dense top-k ids plus one "rest" bucket per token.

    dense_topk_ids/logprobs: [G, K]; sparse_logprobs: [G, V] (full log-softmax). The rest bucket
    holds the mass outside the top-k on each side, so this is the KL of two proper (coarse)
    distributions: >= 0, zero when they agree on the top-k, and a lower bound on the full KL.
    Returns [G].
    """
    lp_d = dense_topk_logprobs.to(sparse_logprobs.dtype)
    lp_s = sparse_logprobs.gather(-1, dense_topk_ids)
    head = (lp_d.exp() * (lp_d - lp_s)).sum(-1)
    rest_d = (1.0 - lp_d.exp().sum(-1)).clamp_min(_REST_FLOOR)
    rest_s = (1.0 - lp_s.exp().sum(-1)).clamp_min(_REST_FLOOR)
    return head + rest_d * (rest_d.log() - rest_s.log())


def tv_per_token(dense_logprobs: Tensor, sparse_logprobs: Tensor) -> Tensor:
    """Total variation ``0.5 * sum_v |p_sparse(v) - p_dense(v)|`` over the full vocabulary, per token.

    dense_logprobs, sparse_logprobs: [G, V] (full log-softmax) -> [G] in [0, 1]. It is
    ``1 - acceptance`` (``sum min(p, q) = 1 - TV``), computed by the monitor's own
    ``exact_acceptance``, so this loss pushes directly on the quantity whose p5 the schedule's
    target bounds, with the whole distribution as its signal rather than one sampled token (k3).
    """
    return 1.0 - exact_acceptance(sparse_logprobs, dense_logprobs.to(sparse_logprobs.dtype))
