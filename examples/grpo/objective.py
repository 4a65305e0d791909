"""GRPO with truncated importance sampling (TIS) against the sparse behaviour policy.

The rollouts come from the *sparse* actor; the policy being trained is the *dense* model. As in
the Sparrow paper's trainer (``compute_policy_loss_vanilla`` with ``tis_imp_ratio_cap``), every
token's clipped-PPO term is multiplied by ``min(exp(logp_dense_old - logp_sparse), C)``, where
``logp_dense_old`` is the trainer's own dense logprob of the sampled token (full attention, no
adapter) at the weights the servers sampled with, and ``logp_sparse`` is what the server returned.

Dense logprobs come from the model's ordinary causal forward (what ``sparrow_server.modeling.
sparse_forward.dense_logits`` computes per sequence), batched with right padding. One optimizer
step per batch (on-policy), so the PPO ratio is exactly 1 and its clip never binds; it is kept
so that the loss reads as the one a multi-epoch trainer uses. Shapes: ``G`` generated
tokens of one sample, ``P`` prompts, ``n`` samples per prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from sparrow_server.stats.acceptance import sampled_acceptance, truncated_importance_weights

from .sampling import Sample

ADVANTAGE_EPS = 1e-6
DEFAULT_TIS_CAP = 2.0  # the paper's code example uses 3.0; smaller is safer on a tight toy schedule
DEFAULT_CLIP_LOW = 0.2
DEFAULT_CLIP_HIGH = 0.28
DEFAULT_MAX_GRAD_NORM = 1.0
DEFAULT_MICRO_BATCH = 8  # samples per forward/backward


@dataclass(frozen=True)
class ObjectiveSettings:
    temperature: float
    tis_cap: float = DEFAULT_TIS_CAP
    clip_low: float = DEFAULT_CLIP_LOW
    clip_high: float = DEFAULT_CLIP_HIGH
    max_grad_norm: float = DEFAULT_MAX_GRAD_NORM
    micro_batch: int = DEFAULT_MICRO_BATCH


@dataclass(frozen=True)
class UpdateStats:
    loss: float
    grad_norm: float
    tokens: int
    trained_samples: int  # samples with a non-zero advantage (the others carry no gradient)
    dense_logprobs: tuple[tuple[float, ...], ...]  # per sample, [G] each: old dense logprobs


def group_advantages(rewards: Tensor, eps: float = ADVANTAGE_EPS) -> Tensor:
    """GRPO advantages: each reward minus its group's mean, over the group's std. [P, n] -> [P, n]."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


def sampled_token_logprobs(model: Any, samples: Sequence[Sample], temperature: float) -> list[Tensor]:
    """Dense logprob of each generated token, ``log_softmax(logits / T)``: one [G] tensor per sample.

    One forward over the samples right-padded into a batch (``attention_mask`` zero on the padding;
    causal attention, so the real positions see exactly what ``dense_logits`` of each sequence would).
    Gradients flow if enabled by the caller.
    """
    device = next(model.parameters()).device  # the trainer's device: batches go where the weights are
    seqs = [torch.tensor(x.prompt_ids + x.token_ids, device=device) for x in samples]
    width = max(len(q) for q in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
    for row, q in enumerate(seqs):
        ids[row, : len(q)], mask[row, : len(q)] = q, 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()  # [B, W, V]
    out = []
    for row, (x, q) in enumerate(zip(samples, seqs)):
        p = len(x.prompt_ids)
        rows = torch.log_softmax(logits[row, p - 1: len(q) - 1] / temperature, dim=-1)  # row t predicts t + 1
        out.append(rows.gather(1, q[p:, None])[:, 0])
    return out


def token_loss(logp: Tensor, logp_old: Tensor, advantage: float, tis: Tensor, s: ObjectiveSettings) -> Tensor:
    """Clipped PPO surrogate times the TIS weight, per token: [G]."""
    ratio = torch.exp(logp - logp_old)
    clipped = torch.clamp(ratio, 1.0 - s.clip_low, 1.0 + s.clip_high)
    return -torch.minimum(ratio * advantage, clipped * advantage) * tis


def importance_weights(dense_old: Tensor, sample: Sample, cap: float) -> Tensor:
    """TIS weights ``min(exp(dense_old - sparse), cap)``: [G] float64, on ``dense_old``'s device."""
    sparse = torch.tensor(sample.sparse_logprobs, dtype=torch.float64, device=dense_old.device)
    return truncated_importance_weights(dense_old.double(), sparse, cap)


def acceptance(dense_old: Tensor, sample: Sample) -> Tensor:
    """Sampled-token acceptance ``min(1, p_dense / p_sparse)``: [G] float64 (its mean estimates alpha)."""
    sparse = torch.tensor(sample.sparse_logprobs, dtype=torch.float64, device=dense_old.device)
    return sampled_acceptance(dense_old.double(), sparse)


def policy_update(model: Any, optimizer: torch.optim.Optimizer, samples: Sequence[Sample], advantages: Sequence[float],
                  s: ObjectiveSettings) -> UpdateStats:
    """One optimizer step on the token-mean loss over every generated token of the batch.

    Samples go through the model ``s.micro_batch`` at a time (bounds activation memory); a
    micro-batch whose advantages are all zero carries no gradient, so it gets a no-grad forward
    only (its dense logprobs still feed the TIS and acceptance statistics).
    """
    tokens = sum(len(x.token_ids) for x in samples)
    assert tokens > 0 and all(x.token_ids for x in samples), "every sample needs a generated token"
    optimizer.zero_grad(set_to_none=True)
    total, dense, trained = 0.0, [], 0
    for start in range(0, len(samples), s.micro_batch):
        chunk, adv = samples[start: start + s.micro_batch], advantages[start: start + s.micro_batch]
        learn = any(a != 0.0 for a in adv)
        with torch.set_grad_enabled(learn):
            logps = sampled_token_logprobs(model, chunk, s.temperature)
        dense += [tuple(lp.detach().tolist()) for lp in logps]
        if not learn:
            continue
        loss = sum(token_loss(lp, lp.detach(), a, importance_weights(lp.detach(), x, s.tis_cap).to(lp.dtype), s).sum()
                   for lp, a, x in zip(logps, adv, chunk)) / tokens
        loss.backward()
        total += float(loss.detach())
        trained += sum(a != 0.0 for a in adv)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)) if trained else 0.0
    if trained:
        optimizer.step()
    return UpdateStats(total, grad_norm, tokens, trained, tuple(dense))
