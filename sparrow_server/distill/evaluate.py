"""Held-out acceptance of the sparse actor (with its adapter) against the dense base model.

Uses the monitor's scorer (``sparrow_server.monitor.scoring.HFScorer``), the same code as dense
verification: dense logits from the base model with stock attention and every adapter disabled,
sparse logits from ``teacher_forced_logits`` with the named adapter on. Per generated token the
exact acceptance ``sum_v min(p_sparse, p_dense)`` at the rollout temperature; pooled and
summarised as p5 / mean overall and per length bin. The dense logits do not depend on the
adapter or the schedule, so an ``AcceptanceProbe`` computes them once and measures any number
of (adapter, schedule) pairs against them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from sparrow_server.monitor.scoring import HFScorer, chunked_exact_acceptance, completion_basis_lengths
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.tail import DEFAULT_QUANTILE, binned_quantiles

from .rollouts import Rollout


@dataclass(frozen=True)
class BinAcceptance:
    bin_index: int
    n_tokens: int
    p5: float
    mean: float


@dataclass(frozen=True)
class AcceptanceSummary:
    """Pooled acceptance of generated tokens: ``p5`` is the 5th percentile (the schedule's target)."""

    n_tokens: int
    p5: float
    mean: float
    bins: tuple[BinAcceptance, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"n_tokens": self.n_tokens, "p5": self.p5, "mean": self.mean,
                "bins": [b.__dict__ for b in self.bins]}


def summarise(acceptance: np.ndarray, lengths: np.ndarray, bin_tokens: int, q: float = DEFAULT_QUANTILE) -> AcceptanceSummary:
    """acceptance, lengths: [N] (schedule-basis length of the step that made each token)."""
    bins = binned_quantiles(acceptance, lengths, bin_tokens=bin_tokens, q=q, n_boot=0)
    return AcceptanceSummary(
        n_tokens=int(acceptance.size), p5=float(np.quantile(acceptance, q)), mean=float(acceptance.mean()),
        bins=tuple(BinAcceptance(b.bin_index, b.n_tokens, b.quantile, b.mean) for b in bins if b.n_tokens),
    )


class AcceptanceProbe:
    """Held-out rollouts with their dense logits, computed once (adapter disabled, stock attention).

    The dense logits ([G, V] float32 per rollout) are kept in host memory: on a GPU, a few dozen
    rollouts of 2K tokens at SmolLM2's 49K vocabulary would otherwise hold tens of GiB of device
    memory for the whole run. For many long rollouts use ``score_arms`` (nothing kept)."""

    def __init__(self, model: Any, rollouts: Sequence[Rollout]):
        if not rollouts:
            raise ValueError("rollouts: empty, nothing to measure acceptance on")
        self.rollouts = list(rollouts)
        scorer = HFScorer(model)
        self._dense = [scorer.dense_logits(_prompt(r), _completion(r)).cpu() for r in self.rollouts]  # each [G, V]

    def measure(self, model: Any, schedule: Schedule, temperature: float, adapter: str | None) -> AcceptanceSummary:
        """Acceptance of ``model`` with ``adapter`` (None: no adapter) under ``schedule``."""
        scorer = HFScorer(model)
        acc, lengths = [], []
        for rollout, dense in zip(self.rollouts, self._dense):
            sparse = scorer.sparse_logits(_prompt(rollout), _completion(rollout), schedule, adapter)
            acc.append(chunked_exact_acceptance(sparse, dense.to(sparse.device), temperature))
            lengths.append(completion_basis_lengths(schedule, rollout.prompt_len, rollout.n_generated))
        return summarise(np.concatenate(acc), np.concatenate(lengths), schedule.bin_tokens)


@dataclass(frozen=True)
class Arm:
    """One (schedule, adapter) pair to score rollouts under; ``adapter`` None: the base model."""

    name: str
    schedule: Schedule
    adapter: str | None = None


def score_arms(model: Any, rollouts: Sequence[Rollout], arms: Sequence[Arm], temperature: float) -> dict[str, list[np.ndarray]]:
    """Exact acceptance of every generated token of each rollout under each arm: ``{arm: [[G] per rollout]}``.

    One dense forward per rollout, shared by the arms and dropped before the next rollout, so
    device memory stays at one rollout's logits however many rollouts there are."""
    if len({a.name for a in arms}) != len(arms):
        raise ValueError(f"arms: names must be distinct, got {[a.name for a in arms]}")
    scorer = HFScorer(model)
    out: dict[str, list[np.ndarray]] = {a.name: [] for a in arms}
    for rollout in rollouts:
        dense = scorer.dense_logits(_prompt(rollout), _completion(rollout))
        for arm in arms:
            sparse = scorer.sparse_logits(_prompt(rollout), _completion(rollout), arm.schedule, arm.adapter)
            out[arm.name].append(chunked_exact_acceptance(sparse, dense.to(sparse.device), temperature))
        del dense
    return out


def _prompt(r: Rollout) -> tuple[int, ...]:
    return r.input_ids[: r.prompt_len]


def _completion(r: Rollout) -> tuple[int, ...]:
    return r.input_ids[r.prompt_len:]
