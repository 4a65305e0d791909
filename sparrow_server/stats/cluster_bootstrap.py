"""Paired cluster bootstrap of a low quantile: several arms scored on the same tokens, resampled by cluster.

Why clusters: the tokens of one rollout (one prompt) are strongly correlated, so resampling tokens
(``tail.bootstrap_quantile_ci``) gives intervals far too narrow when a few dozen prompts supply tens of
thousands of tokens. Resampling whole clusters (prompts) with replacement keeps that correlation.
Why paired: when every arm scores the *same* tokens (e.g. a schedule with and without an adapter on
held-out rollouts), the difference of two arms' quantiles on one resample cancels the prompt-to-prompt
variation both share; its interval is much narrower than one built from two independent intervals.

Pure numpy. Shapes: ``N`` tokens, each with a cluster id; ``C`` distinct clusters.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from sparrow_server.stats.tail import DEFAULT_BOOTSTRAP, DEFAULT_CONFIDENCE, DEFAULT_QUANTILE, DEFAULT_SEED


@dataclass(frozen=True)
class Interval:
    estimate: float  # on the full sample
    low: float
    high: float

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class PairedQuantiles:
    """Each arm's quantile and each requested difference ``a - b``, with percentile-bootstrap intervals."""

    n_tokens: int
    n_clusters: int
    arms: dict[str, Interval]
    diffs: dict[tuple[str, str], Interval]
    means: dict[str, float]

    def to_dict(self) -> dict:
        return {"n_tokens": self.n_tokens, "n_clusters": self.n_clusters,
                "arms": {k: v.to_dict() for k, v in self.arms.items()},
                "diffs": {f"{a} - {b}": v.to_dict() for (a, b), v in self.diffs.items()}, "means": self.means}


def paired_cluster_quantiles(
    values: Mapping[str, np.ndarray],
    clusters: np.ndarray,
    pairs: Sequence[tuple[str, str]] = (),
    q: float = DEFAULT_QUANTILE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> PairedQuantiles:
    """values: ``{arm: [N]}`` (the same N tokens in the same order for every arm); clusters: [N] ids.

    Every resample draws ``C`` clusters with replacement and takes all their tokens, for all arms
    at once. Raises ``ValueError`` naming the argument on empty, misshapen or unknown inputs."""
    arrays, clusters = _check(values, clusters, pairs, q, n_boot, confidence)
    ids, inverse = np.unique(clusters, return_inverse=True)
    members = [np.flatnonzero(inverse == c) for c in range(ids.size)]
    rng = np.random.default_rng(seed)
    boot = {name: np.empty(n_boot) for name in arrays}
    for r in range(n_boot):
        idx = np.concatenate([members[c] for c in rng.integers(0, ids.size, ids.size)])
        for name, arr in arrays.items():
            boot[name][r] = np.quantile(arr[idx], q)
    alpha = (1.0 - confidence) / 2.0

    def interval(estimate: float, samples: np.ndarray) -> Interval:
        low, high = np.quantile(samples, [alpha, 1.0 - alpha])
        return Interval(float(estimate), float(low), float(high))

    point = {name: float(np.quantile(arr, q)) for name, arr in arrays.items()}
    return PairedQuantiles(
        n_tokens=int(clusters.size), n_clusters=int(ids.size),
        arms={name: interval(point[name], boot[name]) for name in arrays},
        diffs={(a, b): interval(point[a] - point[b], boot[a] - boot[b]) for a, b in pairs},
        means={name: float(arr.mean()) for name, arr in arrays.items()},
    )


def _check(values, clusters, pairs, q, n_boot, confidence) -> tuple[dict[str, np.ndarray], np.ndarray]:
    if not values:
        raise ValueError("values: no arms")
    clusters = np.asarray(clusters)
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}
    for name, arr in arrays.items():
        if arr.ndim != 1 or arr.shape != clusters.shape:
            raise ValueError(f"values[{name!r}]: shape {arr.shape}, clusters {clusters.shape}: both must be the same [N]")
    if clusters.size == 0:
        raise ValueError("clusters: empty, no tokens to resample")
    for a, b in pairs:
        for name in (a, b):
            if name not in arrays:
                raise ValueError(f"pairs: {name!r} is not an arm (arms: {sorted(arrays)})")
    if not 0 < q < 1:
        raise ValueError(f"q = {q!r}: must be in (0, 1)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence!r}: must be in (0, 1)")
    if n_boot < 1:
        raise ValueError(f"n_boot = {n_boot!r}: must be >= 1")
    return arrays, clusters


__all__ = ["Interval", "PairedQuantiles", "paired_cluster_quantiles"]
