"""``train_lora``: DistillSparse, a LoRA that makes the sparse actor match the dense base model.

Per step, for each rollout of the batch: the sparse logits come from ``teacher_forced_logits``
(the serving selection semantics) with the adapter on and gradients; the dense side is the
base model with the adapter disabled, without gradients, and since neither the base weights
nor the rollouts change it is computed once per rollout before training. The loss is a token
mean over the batch's generated tokens of the k3 estimate of KL(sparse || dense) on the sampled
tokens (the paper's), the forward KL over the dense top-k, or the total variation over the full
vocabulary (``tv`` = 1 - acceptance). Every generated token is in the loss, also those where the
schedule attends every page: there the target is "stay equal to the base model". Only LoRA
parameters train.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from sparrow_server.adapter_meta.fingerprint import model_fingerprint
from sparrow_server.modeling.sparse_forward import teacher_forced_logits
from sparrow_server.monitor.scoring import HFScorer
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.acceptance import logits_to_topk

from .config import DistillConfig
from .evaluate import AcceptanceProbe, AcceptanceSummary
from .loss import (
    generated_logprobs, generated_rows, k3_per_token, topk_forward_kl_per_token, tv_per_token,
)
from .rollouts import Rollout, split_heldout


ADAPTER_NAME = "default"  # peft's name for the adapter get_peft_model creates


@dataclass(frozen=True)
class DenseTarget:
    """What the loss needs from the dense base for one rollout (G generated tokens)."""

    logprob: Tensor  # [G] logprob of each sampled token
    topk_ids: Tensor | None  # [G, K] (topk_forward_kl only)
    topk_logprobs: Tensor | None  # [G, K]
    logprobs: Tensor | None = None  # [G, V] full log-softmax (tv only)


@dataclass(frozen=True)
class DistillReport:
    config: DistillConfig
    schedule_id: str
    base_fingerprint: str
    target_modules: tuple[str, ...]  # resolved module names the adapter wraps
    trainable_parameters: int
    n_train: int
    n_heldout: int
    n_train_tokens: int
    steps: int
    loss_curve: tuple[float, ...]  # per step, the batch loss before that step's update
    before: AcceptanceSummary | None  # held-out, adapter at its (zero) initialisation
    after: AcceptanceSummary | None
    seconds: float
    extra: dict = field(default_factory=dict)


def dense_target(model: Any, rollout: Rollout, config: DistillConfig) -> DenseTarget:
    """Dense-side targets of one rollout: the base model, stock attention, every adapter disabled."""
    completion = rollout.input_ids[rollout.prompt_len:]
    logits = HFScorer(model).dense_logits(rollout.input_ids[: rollout.prompt_len], completion)  # [G, V]
    logp = torch.log_softmax(logits / config.temperature, dim=-1)
    logprob = logp.gather(-1, torch.tensor(completion, device=logp.device)[:, None])[:, 0]
    if config.loss == "tv":
        return DenseTarget(logprob.clone(), None, None, logp.float().clone())
    if config.loss != "topk_forward_kl":
        return DenseTarget(logprob.clone(), None, None)
    topk_ids, topk_lp = logits_to_topk(logits, min(config.topk, logits.shape[-1]), config.temperature)
    return DenseTarget(logprob.clone(), topk_ids.clone(), topk_lp.float().clone())


def sequence_loss(model: Any, rollout: Rollout, target: DenseTarget, schedule: Schedule, config: DistillConfig) -> Tensor:
    """Per generated token loss of one rollout under the sparse actor with the adapter: [G]."""
    ids = torch.tensor(rollout.input_ids)
    logits = teacher_forced_logits(model, ids, rollout.prompt_len, schedule)
    if config.loss == "k3":
        sparse_lp = generated_logprobs(logits, ids, rollout.prompt_len, config.temperature)
        return k3_per_token(target.logprob, sparse_lp, config.delta_clamp, config.clamp)
    sparse_all = torch.log_softmax(generated_rows(logits, rollout.prompt_len) / config.temperature, dim=-1)
    if config.loss == "tv":
        return tv_per_token(target.logprobs, sparse_all)
    return topk_forward_kl_per_token(target.topk_ids, target.topk_logprobs, sparse_all)


def wrap_with_lora(base_model: Any, config: DistillConfig) -> Any:
    """A peft model with a fresh LoRA (B = 0, so it starts as the base model). Modifies ``base_model``."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.rank, lora_alpha=config.alpha, target_modules=config.peft_target_modules(),
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(base_model, lora)


def batches(n: int, batch: int, steps: int, seed: int) -> list[list[int]]:
    """``steps`` batches of indices into ``range(n)``: seeded passes over a reshuffled order."""
    rng, order, out = random.Random(seed), [], []
    for _ in range(steps):
        if len(order) < batch:
            fresh = list(range(n))
            rng.shuffle(fresh)
            order += fresh
        out.append(order[:batch])
        order = order[batch:]
    return out


def train_lora(
    base_model: Any,
    rollouts: Sequence[Rollout],
    schedule: Schedule,
    config: DistillConfig,
    heldout: Sequence[Rollout] | None = None,
    log: Callable[[str], None] | None = None,
    compare_schedules: Sequence[Schedule] = (),
    stop: Callable[[], bool] | None = None,
) -> tuple[Any, DistillReport]:
    """Train a LoRA on ``rollouts`` so the sparse actor under ``schedule`` matches the dense base.

    ``heldout``: rollouts to measure acceptance on before/after; by default
    ``config.heldout_fraction`` of ``rollouts`` is split off (none when the fraction is 0).
    ``compare_schedules``: also measure these schedules on the held-out rollouts without any
    adapter (e.g. the looser calibrated schedule), into ``report.extra["compare"]``.
    ``stop``: asked before each step; True ends training there (a caller's deadline), and the
    report's ``steps`` is the number of steps taken (``extra["stopped_early"]`` set).
    Returns (peft model, report). ``base_model`` is modified in place (peft injects the LoRA).
    """
    log = log or (lambda _msg: None)
    start = time.monotonic()
    torch.manual_seed(config.seed)
    if heldout is None:
        train, heldout = split_heldout(rollouts, config.heldout_fraction, config.seed)
    else:
        train = list(rollouts)
    if not train:
        raise ValueError("rollouts: none left to train on")
    fingerprint = model_fingerprint(base_model)
    model = wrap_with_lora(base_model, config)
    model.eval()  # no dropout anywhere; gradients still flow into the LoRA
    probe = AcceptanceProbe(model, heldout) if heldout else None
    before = probe.measure(model, schedule, config.temperature, ADAPTER_NAME) if probe else None
    if before:
        log(f"held-out before: p5={before.p5:.4f} mean={before.mean:.4f} ({before.n_tokens} tokens)")
    compare = {}
    for other in compare_schedules if probe else ():
        compare[other.id] = probe.measure(model, other, config.temperature, None).to_dict()
        log(f"held-out {other.id} (no adapter): p5={compare[other.id]['p5']:.4f} mean={compare[other.id]['mean']:.4f}")
    targets = [dense_target(model, r, config) for r in train]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    curve = []
    for step, batch in enumerate(batches(len(train), config.batch, config.steps, config.seed)):
        if stop is not None and stop():
            log(f"stopped before step {step + 1}/{config.steps}")
            break
        curve.append(_train_step(model, [train[i] for i in batch], [targets[i] for i in batch],
                                 schedule, config, params, optimizer))
        log(f"step {step + 1}/{config.steps} loss={curve[-1]:.6f}")
    after = probe.measure(model, schedule, config.temperature, ADAPTER_NAME) if probe else None
    if after:
        log(f"held-out after: p5={after.p5:.4f} mean={after.mean:.4f}")
    report = DistillReport(
        config=config, schedule_id=schedule.id, base_fingerprint=fingerprint,
        target_modules=_resolved_targets(model), trainable_parameters=sum(p.numel() for p in params),
        n_train=len(train), n_heldout=len(heldout), n_train_tokens=sum(r.n_generated for r in train),
        steps=len(curve), loss_curve=tuple(curve), before=before, after=after,
        seconds=time.monotonic() - start, extra=_extra(compare, len(curve) < config.steps),
    )
    return model, report


def _train_step(model, rollouts, targets, schedule, config, params, optimizer) -> float:
    """One optimizer step; backward per sequence (memory of one graph), weighted to a token mean."""
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(r.n_generated for r in rollouts)
    total = 0.0
    for rollout, target in zip(rollouts, targets):
        per_token = sequence_loss(model, rollout, target, schedule, config)
        (per_token.sum() / n_tokens).backward()
        total += float(per_token.detach().sum())
    torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
    optimizer.step()
    return total / n_tokens


def _extra(compare: dict, stopped_early: bool) -> dict:
    extra: dict = {"compare": compare} if compare else {}
    if stopped_early:
        extra["stopped_early"] = True
    return extra


def _resolved_targets(model: Any) -> tuple[str, ...]:
    targets = model.peft_config[ADAPTER_NAME].target_modules
    return tuple(sorted(targets)) if not isinstance(targets, str) else (targets,)


__all__ = ["DistillReport", "DenseTarget", "train_lora", "dense_target", "sequence_loss", "wrap_with_lora",
           "batches"]
