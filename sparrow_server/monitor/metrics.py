"""Prometheus metrics of dense verification (``docs/metrics.md``, "Tail mismatch").

``AcceptanceMetrics.observe(schedule, acceptance, basis_lengths)`` records one verified rollout:
every token into the ``sparrow_acceptance`` histogram, then the rolling exact p5 of each touched
(schedule, length bin) into ``sparrow_acceptance_p5``. A bin's p5 is published only once its
window holds ``min_tokens`` tokens (a p5 over a handful of tokens is noise, and would page people).
``sparrow_tail_violations_total`` counts crossings: each time a published p5 goes from at/above the
schedule's threshold (or unpublished) to below it. ``length_bin`` is the schedule's bin index,
clamped to ``0 .. max_bins - 1`` (bounded cardinality). With each published p5 go the ends of its
distribution-free 95% interval (``sparrow_acceptance_p5_low`` / ``_high``: order statistics of the window,
``stats.tail.quantile_interval``), which say how far a p5 from that many tokens may be from the p5 of
the tokens it was sampled from (``benchmarks/results/fidelity/live_tail/``).
"""
from __future__ import annotations

import math
import threading

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.rolling import DEFAULT_MAX_BINS, DEFAULT_WINDOW, RollingTailMonitor

ACCEPTANCE_BUCKETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.84, 0.86, 0.88, 0.9, 0.95, 0.99, 0.999, 1.0)
DEFAULT_MIN_TOKENS = 200  # tokens a (schedule, bin) window needs before its p5 is published
P5_CONFIDENCE = 0.95  # of the interval published with each p5


class AcceptanceMetrics:
    """The tail-mismatch metrics, registered on ``registry`` (the app's own registry)."""

    def __init__(self, registry: CollectorRegistry, window: int = DEFAULT_WINDOW, max_bins: int = DEFAULT_MAX_BINS,
                 min_tokens: int = DEFAULT_MIN_TOKENS):
        if min_tokens < 1:
            raise ValueError(f"min_tokens = {min_tokens!r}: must be >= 1")
        r = registry
        self.acceptance = Histogram("sparrow_acceptance", "Per-token acceptance sum_v min(p_sparse, p_dense)",
                                    ["schedule", "length_bin"], buckets=ACCEPTANCE_BUCKETS, registry=r)
        self.p5 = Gauge("sparrow_acceptance_p5", "Rolling exact 5th percentile of acceptance",
                        ["schedule", "length_bin"], registry=r)
        self.p5_low = Gauge("sparrow_acceptance_p5_low",
                            "Lower end of the 95% distribution-free interval of the rolling p5",
                            ["schedule", "length_bin"], registry=r)
        self.p5_high = Gauge("sparrow_acceptance_p5_high",
                             "Upper end of the 95% distribution-free interval of the rolling p5",
                             ["schedule", "length_bin"], registry=r)
        self.threshold = Gauge("sparrow_acceptance_threshold", "The schedule's calibrated p5 target", ["schedule"],
                               registry=r)
        self.violations = Counter("sparrow_tail_violations_total", "Times the rolling p5 fell below the threshold",
                                  ["schedule", "length_bin"], registry=r)
        self.verified_tokens = Counter("sparrow_verified_tokens_total", "Tokens re-scored densely", ["schedule"],
                                       registry=r)
        self.verified_requests = Counter("sparrow_verified_requests_total", "Requests re-scored densely",
                                         ["schedule"], registry=r)
        self.unscored_tokens = Counter("sparrow_verified_unscored_tokens_total",
                                       "Verified tokens left out of the windows: not of the verifier's acceptance kind "
                                       "(exact values missing, only the lower bound)", ["schedule"], registry=r)
        self.exact_missing_tokens = Counter("sparrow_exact_missing_tokens_total",
                                            "Kept positions without an exact value (re-prefilled, row store full)",
                                            ["schedule"], registry=r)
        self.max_bins = max_bins
        self.min_tokens = min_tokens
        self._windows: dict[int, RollingTailMonitor] = {}  # per bin width (schedules may differ)
        self._window = window
        self._below: set[tuple[str, int]] = set()  # (schedule, bin) whose published p5 is below threshold
        self._lock = threading.Lock()

    def _monitor(self, bin_tokens: int) -> RollingTailMonitor:
        if bin_tokens not in self._windows:
            self._windows[bin_tokens] = RollingTailMonitor(self._window, bin_tokens=bin_tokens, n_bins=self.max_bins)
        return self._windows[bin_tokens]

    def observe(self, schedule: Schedule, acceptance: np.ndarray, basis_lengths: np.ndarray) -> None:
        """Record one verified rollout. acceptance, basis_lengths: [N] (see ``AcceptanceScores``)."""
        acceptance = np.asarray(acceptance, dtype=np.float64).ravel()
        basis_lengths = np.asarray(basis_lengths).ravel()
        if acceptance.shape != basis_lengths.shape:
            raise ValueError(f"acceptance has {acceptance.size} values but basis_lengths has {basis_lengths.size}")
        name = schedule.name
        with self._lock:
            monitor = self._monitor(schedule.bin_tokens)
            bins = np.minimum(basis_lengths // schedule.bin_tokens, self.max_bins - 1)
            for b in np.unique(bins):
                child = self.acceptance.labels(name, str(int(b)))
                for value in acceptance[bins == b]:
                    child.observe(float(value))
            touched = monitor.add(name, acceptance, basis_lengths)
            self.verified_tokens.labels(name).inc(acceptance.size)
            self.verified_requests.labels(name).inc()
            if schedule.threshold is not None:
                self.threshold.labels(name).set(schedule.threshold)
            stats = {(s.schedule, s.bin_index): s for s in monitor.snapshot() if s.schedule == name}
            for b in touched:
                stat = stats[(name, b)]
                if stat.window_tokens < self.min_tokens or math.isnan(stat.quantile):
                    continue
                self.p5.labels(name, str(b)).set(stat.quantile)
                low, high = monitor.interval(name, b, P5_CONFIDENCE, support=(0.0, 1.0))
                self.p5_low.labels(name, str(b)).set(low)
                self.p5_high.labels(name, str(b)).set(high)
                self._track_violation(name, b, stat.quantile, schedule.threshold)

    def unscored(self, schedule: Schedule, n_tokens: int) -> None:
        self.unscored_tokens.labels(schedule.name).inc(n_tokens)

    def exact_missing(self, schedule: Schedule, n_tokens: int) -> None:
        self.exact_missing_tokens.labels(schedule.name).inc(n_tokens)

    def _track_violation(self, name: str, bin_index: int, p5: float, threshold: float | None) -> None:
        key = (name, bin_index)
        if threshold is None or p5 >= threshold:
            self._below.discard(key)
        elif key not in self._below:
            self._below.add(key)
            self.violations.labels(name, str(bin_index)).inc()

    def rolling_p5_interval(self, schedule: Schedule, bin_index: int) -> tuple[float, float]:
        """The 95% interval of ``rolling_p5`` (ends clamped to [0, 1]; NaN when no tokens yet)."""
        with self._lock:
            return self._monitor(schedule.bin_tokens).interval(schedule.name, bin_index, P5_CONFIDENCE, (0.0, 1.0))

    def rolling_p5(self, schedule: Schedule, bin_index: int) -> float:
        """Current rolling p5 of one (schedule, bin) (NaN when no tokens yet), published or not."""
        with self._lock:
            return self._monitor(schedule.bin_tokens).quantile(schedule.name, bin_index)


__all__ = ["AcceptanceMetrics", "ACCEPTANCE_BUCKETS", "DEFAULT_MIN_TOKENS", "P5_CONFIDENCE"]
