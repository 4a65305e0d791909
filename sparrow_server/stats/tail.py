"""Tail statistics of acceptance per length bin (the quantity the schedule is calibrated on).

Tokens are pooled over all trajectories, grouped by the length bin of their position (2,000
tokens by default), and each bin's low quantile (default the 5th percentile) is taken with
numpy's default ``linear`` method; a percentile bootstrap gives its confidence interval.
Pure numpy. Shapes: ``N`` pooled tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparrow_server.sparsity.schedule import DEFAULT_BIN_TOKENS

DEFAULT_QUANTILE = 0.05
DEFAULT_BOOTSTRAP = 1000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_SEED = 0
# Bootstrap resamples are drawn in chunks of at most this many token indices (bounds memory).
_BOOTSTRAP_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class BinQuantile:
    """One length bin: ``[bin_index * bin_tokens, (bin_index + 1) * bin_tokens)`` tokens."""

    bin_index: int
    n_tokens: int
    quantile: float  # NaN when the bin has no tokens
    ci_low: float
    ci_high: float
    mean: float


def length_bins(positions: np.ndarray, bin_tokens: int = DEFAULT_BIN_TOKENS, n_bins: int | None = None) -> np.ndarray:
    """Bin index of each token position. positions: [N] int >= 0 -> [N] int64.

    With ``n_bins`` the last bin is open-ended (indices clamped to ``n_bins - 1``), as in schedules.
    """
    positions = np.asarray(positions)
    if bin_tokens < 1:
        raise ValueError(f"bin_tokens = {bin_tokens!r}: must be >= 1")
    if positions.size and positions.min() < 0:
        raise ValueError(f"positions: minimum {positions.min()} is negative")
    bins = positions.astype(np.int64) // bin_tokens
    return bins if n_bins is None else np.minimum(bins, n_bins - 1)


def bootstrap_quantile_ci(
    values: np.ndarray,
    q: float = DEFAULT_QUANTILE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int | np.random.Generator = DEFAULT_SEED,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``np.quantile(values, q)``. values: [N] -> (low, high).

    Resamples are vectorised (``[chunk, N]`` index draws). NaNs when ``values`` is empty.
    """
    values = np.asarray(values, dtype=np.float64)
    _check_quantile(q)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence!r}: must be in (0, 1)")
    if n_boot < 1:
        raise ValueError(f"n_boot = {n_boot!r}: must be >= 1")
    n = values.size
    if n == 0:
        return float("nan"), float("nan")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    chunk = max(1, _BOOTSTRAP_CHUNK_ELEMENTS // n)
    stats = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        stop = min(start + chunk, n_boot)
        idx = rng.integers(0, n, size=(stop - start, n))
        stats[start:stop] = np.quantile(values[idx], q, axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(low), float(high)


def binned_quantiles(
    acceptance: np.ndarray,
    positions: np.ndarray,
    bin_tokens: int = DEFAULT_BIN_TOKENS,
    q: float = DEFAULT_QUANTILE,
    n_bins: int | None = None,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_SEED,
) -> list[BinQuantile]:
    """Per-bin quantile of pooled per-token acceptance, with bootstrap CIs.

    acceptance: [N] in [0, 1]; positions: [N] the length (per the schedule's basis) at which
    each token was generated. Returns one ``BinQuantile`` per bin ``0 .. n_bins - 1``
    (default: up to the last non-empty bin); empty bins carry NaN. ``n_boot = 0`` skips the CIs.
    """
    acceptance = np.asarray(acceptance, dtype=np.float64)
    positions = np.asarray(positions)
    if acceptance.shape != positions.shape or acceptance.ndim != 1:
        raise ValueError(f"acceptance {acceptance.shape} and positions {positions.shape} must both be [N]")
    _check_quantile(q)
    bins = length_bins(positions, bin_tokens, n_bins)
    total = n_bins if n_bins is not None else (int(bins.max()) + 1 if bins.size else 0)
    rng = np.random.default_rng(seed)
    order = np.argsort(bins, kind="stable")
    edges = np.searchsorted(bins[order], np.arange(total + 1))
    out = []
    for b in range(total):
        vals = acceptance[order[edges[b]:edges[b + 1]]]
        if vals.size == 0:
            out.append(BinQuantile(b, 0, *(float("nan"),) * 4))
            continue
        low, high = (
            bootstrap_quantile_ci(vals, q, n_boot, confidence, rng) if n_boot else (float("nan"), float("nan"))
        )
        out.append(BinQuantile(b, int(vals.size), float(np.quantile(vals, q)), low, high, float(vals.mean())))
    return out


@dataclass(frozen=True)
class QuantileBracket:
    """One length bin's quantile of acceptance known only to lie in ``[low, high]``."""

    bin_index: int
    n_tokens: int
    low: float  # quantile of the per-token lower bounds; NaN when the bin has no tokens
    high: float  # quantile of the per-token upper bounds

    @property
    def mid(self) -> float:
        """The bracket's midpoint: within ``(high - low) / 2`` of the true quantile."""
        return (self.low + self.high) / 2


def binned_quantile_brackets(
    lower: np.ndarray,
    upper: np.ndarray,
    positions: np.ndarray,
    bin_tokens: int = DEFAULT_BIN_TOKENS,
    q: float = DEFAULT_QUANTILE,
    n_bins: int | None = None,
) -> list[QuantileBracket]:
    """Per-bin bracket of the quantile of acceptance from per-token bounds ``lower <= a <= upper``.

    lower, upper, positions: [N]. A quantile is monotone in its values, so the bin's quantile of the
    (unknown) per-token acceptance lies between the same quantile of the lower and of the upper
    bounds (numpy's ``linear`` method, as ``binned_quantiles``). Bins as in ``binned_quantiles``.
    """
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if lower.shape != upper.shape:
        raise ValueError(f"lower {lower.shape} and upper {upper.shape} must have the same shape")
    if np.any(lower > upper):
        raise ValueError(f"lower > upper at {int(np.sum(lower > upper))} tokens")
    lows = binned_quantiles(lower, positions, bin_tokens, q, n_bins, n_boot=0)
    highs = binned_quantiles(upper, positions, bin_tokens, q, n_bins, n_boot=0)
    return [QuantileBracket(lo.bin_index, lo.n_tokens, lo.quantile, hi.quantile) for lo, hi in zip(lows, highs)]


def subsample_bounds_quantile(
    lower: np.ndarray, upper: np.ndarray, kept: np.ndarray, kept_exact: np.ndarray, q: float = DEFAULT_QUANTILE,
) -> float:
    """Quantile of acceptance from every token's bounds and the exact value at a uniform subsample.

    lower, upper: [N] per-token bounds; kept: [m] indices of the tokens whose exact value ``kept_exact``
    ([m]) is known, drawn uniformly. The CDF at ``x`` is the share of tokens with ``upper <= x`` (known)
    plus ``N / m`` times the kept tokens with ``exact <= x < upper`` (a Horvitz-Thompson estimate of the
    straddling tokens at or below ``x``), unbiased for the true CDF; the result is the smallest ``x``
    where it reaches ``q``, raised to the same quantile of ``lower`` if below it (it never exceeds that of
    ``upper``). With every token kept it is ``np.quantile(exact, q, method="inverted_cdf")``. NaN when
    there are no tokens.
    """
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    kept, kept_exact = np.asarray(kept, dtype=np.int64), np.asarray(kept_exact, dtype=np.float64)
    _check_quantile(q)
    if lower.shape != upper.shape or lower.ndim != 1 or kept.shape != kept_exact.shape or kept.ndim != 1:
        raise ValueError(f"lower {lower.shape}, upper {upper.shape} must be [N]; kept {kept.shape}, "
                         f"kept_exact {kept_exact.shape} must be [m]")
    n = lower.size
    if n == 0:
        return float("nan")
    if kept.size == 0:
        raise ValueError("kept: no exact values")
    if np.any(kept_exact < lower[kept] - 1e-9) or np.any(kept_exact > upper[kept] + 1e-9):
        raise ValueError("kept_exact: a value lies outside its token's bounds")
    candidates = np.unique(np.concatenate([upper, kept_exact]))
    ups, k_exact, k_up = np.sort(upper), np.sort(kept_exact), np.sort(upper[kept])
    below = np.searchsorted(ups, candidates, side="right")
    straddling = np.searchsorted(k_exact, candidates, side="right") - np.searchsorted(k_up, candidates, side="right")
    cdf = (below + straddling * (n / kept.size)) / n
    estimate = candidates[np.argmax(cdf >= q - 1e-12)]  # the last candidate has every upper <= it: cdf 1
    return float(max(estimate, np.quantile(lower, q, method="inverted_cdf")))  # the truth is in the bracket


def _check_quantile(q: float) -> None:
    if not 0 <= q <= 1:
        raise ValueError(f"q = {q!r}: must be in [0, 1]")


def quantile_order_interval(n: int, q: float = DEFAULT_QUANTILE,
                            confidence: float = DEFAULT_CONFIDENCE) -> tuple[int, int]:
    """0-based order-statistic indices ``(lo, hi)`` of a distribution-free interval for the ``q``-quantile.

    For ``n`` values drawn uniformly and independently, the count below the true quantile is
    Binomial(n, q); ``[x_(lo), x_(hi)]`` of the sorted sample covers the quantile with probability at
    least ``confidence``, each side missing with probability at most ``(1 - confidence) / 2`` (exact
    binomial tails, no normal approximation). ``lo = -1`` when ``n`` is too small for a lower end (no
    lower bound), ``hi = n`` when it is too small for an upper end. Pure numpy; O(n).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n = {n!r}: must be an integer >= 0")
    _check_quantile(q)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence!r}: must be in (0, 1)")
    n = int(n)
    if n == 0:
        return -1, 0
    if q in (0.0, 1.0):
        return (-1, 0) if q == 0.0 else (n - 1, n)
    k = np.arange(1, n + 1, dtype=np.float64)
    # log Binomial(n, q) pmf at 0..n by its ratio recurrence: pmf(k) / pmf(k - 1) = (n - k + 1) / k * q / (1 - q)
    log_pmf = np.concatenate([[n * np.log1p(-q)],
                              n * np.log1p(-q) + np.cumsum(np.log((n - k + 1) / k) + np.log(q) - np.log1p(-q))])
    pmf = np.exp(log_pmf - log_pmf.max())
    pmf /= pmf.sum()
    below = np.cumsum(pmf)  # below[j] = P(B <= j)
    above = np.cumsum(pmf[::-1])[::-1]  # above[j] = P(B >= j)
    tail = (1.0 - confidence) / 2.0
    # x_(j) (1-based) is at or below the quantile iff B >= j: the lower end misses when B < l, i.e. P(B <= l - 1)
    ok_low = np.flatnonzero(below <= tail)  # l - 1 candidates
    lo = int(ok_low[-1]) if ok_low.size else -1  # 0-based index of x_(l) = l - 1
    # x_(u) is above the quantile iff B < u: the upper end misses when B >= u
    ok_high = np.flatnonzero(above <= tail)  # u candidates (1-based), u in 1..n
    hi = int(ok_high[0]) - 1 if ok_high.size and ok_high[0] >= 1 else n
    return lo, hi


def quantile_interval(values: np.ndarray, q: float = DEFAULT_QUANTILE, confidence: float = DEFAULT_CONFIDENCE,
                      support: tuple[float, float] = (-np.inf, np.inf)) -> tuple[float, float]:
    """Distribution-free ``confidence`` interval of the ``q``-quantile from a uniform sample: values [N].

    The order statistics of ``quantile_order_interval``; an end the sample is too small for is the
    matching end of ``support`` (e.g. ``(0, 1)`` for acceptance). Valid for independent draws (or a
    stratified subsample, e.g. ``stats.exact_subsample``'s jittered positions, about a fixed set of
    tokens); tokens of one rollout are correlated, so about the model's tail it is too narrow when few
    rollouts supply the values (``cluster_bootstrap`` resamples rollouts). (NaN, NaN) when empty.
    """
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        return float("nan"), float("nan")
    lo, hi = quantile_order_interval(values.size, q, confidence)
    picks = [i for i in (lo, hi) if 0 <= i < values.size]
    part = np.partition(values, picks) if picks else values
    low = float(part[lo]) if lo >= 0 else float(support[0])
    high = float(part[hi]) if hi < values.size else float(support[1])
    return low, high


__all__ = [
    "BinQuantile", "QuantileBracket", "length_bins", "bootstrap_quantile_ci", "binned_quantiles",
    "binned_quantile_brackets", "subsample_bounds_quantile", "quantile_order_interval", "quantile_interval",
    "DEFAULT_QUANTILE",
]
