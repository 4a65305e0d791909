"""Rolling (streaming) tail quantiles for the live monitor.

``RollingQuantile`` keeps the last ``capacity`` values in a ring buffer and answers the exact
quantile over them (numpy ``linear`` method), so memory and query cost are bounded however long
the server runs. ``RollingTailMonitor`` keeps one per (schedule name, length bin); bins past
``n_bins - 1`` fold into the last (open-ended) bin, which bounds the label cardinality of the
``sparrow_acceptance_p5`` metric (docs/metrics.md).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from sparrow_server.sparsity.schedule import DEFAULT_BIN_TOKENS
from sparrow_server.stats.tail import DEFAULT_CONFIDENCE, DEFAULT_QUANTILE, length_bins, quantile_interval

DEFAULT_WINDOW = 20_000  # tokens kept per (schedule, bin): p5 then rests on ~1,000 tail tokens
DEFAULT_MAX_BINS = 20


class RollingQuantile:
    """Exact quantile of the last ``capacity`` values added (not thread-safe on its own)."""

    def __init__(self, capacity: int = DEFAULT_WINDOW, q: float = DEFAULT_QUANTILE):
        if capacity < 1:
            raise ValueError(f"capacity = {capacity!r}: must be >= 1")
        if not 0 <= q <= 1:
            raise ValueError(f"q = {q!r}: must be in [0, 1]")
        self.capacity = capacity
        self.q = q
        self._buf = np.empty(capacity, dtype=np.float64)
        self._next = 0  # ring position of the next write
        self._size = 0
        self.total_seen = 0

    def __len__(self) -> int:
        return self._size

    def add(self, values) -> None:
        """Append values ([N] array-like, or a scalar); the oldest fall out past ``capacity``."""
        values = np.asarray(values, dtype=np.float64).ravel()
        self.total_seen += values.size
        if values.size >= self.capacity:
            self._buf[:] = values[-self.capacity:]
            self._next, self._size = 0, self.capacity
            return
        idx = (self._next + np.arange(values.size)) % self.capacity
        self._buf[idx] = values
        self._next = (self._next + values.size) % self.capacity
        self._size = min(self._size + values.size, self.capacity)

    def values(self) -> np.ndarray:
        """The window's values, oldest first: [len(self)]."""
        if self._size < self.capacity:
            return self._buf[: self._size].copy()
        return np.roll(self._buf, -self._next)

    def quantile(self, q: float | None = None) -> float:
        """Exact quantile of the window (NaN when empty)."""
        if self._size == 0:
            return float("nan")
        return float(np.quantile(self._buf[: self._size], self.q if q is None else q))

    def interval(self, confidence: float = DEFAULT_CONFIDENCE,
                 support: tuple[float, float] = (-np.inf, np.inf)) -> tuple[float, float]:
        """Distribution-free ``confidence`` interval of the window's quantile (``tail.quantile_interval``:
        the window's values as a uniform sample); (NaN, NaN) when empty."""
        return quantile_interval(self._buf[: self._size], self.q, confidence, support)


@dataclass(frozen=True)
class RollingBinStat:
    schedule: str
    bin_index: int
    quantile: float
    window_tokens: int  # tokens the quantile rests on
    total_tokens: int  # tokens seen since start


class RollingTailMonitor:
    """Thread-safe rolling quantile of acceptance per (schedule, length bin)."""

    def __init__(
        self,
        capacity: int = DEFAULT_WINDOW,
        q: float = DEFAULT_QUANTILE,
        bin_tokens: int = DEFAULT_BIN_TOKENS,
        n_bins: int = DEFAULT_MAX_BINS,
    ):
        if n_bins < 1:
            raise ValueError(f"n_bins = {n_bins!r}: must be >= 1")
        RollingQuantile(capacity, q)  # validates capacity and q
        self.capacity, self.q, self.bin_tokens, self.n_bins = capacity, q, bin_tokens, n_bins
        self._windows: dict[tuple[str, int], RollingQuantile] = {}
        self._lock = threading.Lock()

    def add(self, schedule: str, acceptance, positions) -> list[int]:
        """Record tokens of one schedule. acceptance, positions: [N]. Returns the bins touched."""
        acceptance = np.asarray(acceptance, dtype=np.float64).ravel()
        bins = length_bins(np.asarray(positions).ravel(), self.bin_tokens, self.n_bins)
        if bins.shape != acceptance.shape:
            raise ValueError(f"acceptance has {acceptance.size} values but positions has {bins.size}")
        touched = sorted(int(b) for b in np.unique(bins))
        with self._lock:
            for b in touched:
                window = self._windows.setdefault((schedule, b), RollingQuantile(self.capacity, self.q))
                window.add(acceptance[bins == b])
        return touched

    def quantile(self, schedule: str, bin_index: int) -> float:
        """Current rolling quantile of one (schedule, bin); NaN when no tokens yet."""
        with self._lock:
            window = self._windows.get((schedule, bin_index))
            return window.quantile() if window is not None else float("nan")

    def interval(self, schedule: str, bin_index: int, confidence: float = DEFAULT_CONFIDENCE,
                 support: tuple[float, float] = (-np.inf, np.inf)) -> tuple[float, float]:
        """``RollingQuantile.interval`` of one (schedule, bin); (NaN, NaN) when no tokens yet."""
        with self._lock:
            window = self._windows.get((schedule, bin_index))
            return window.interval(confidence, support) if window is not None else (float("nan"), float("nan"))

    def snapshot(self) -> list[RollingBinStat]:
        """Every (schedule, bin) seen so far, sorted."""
        with self._lock:
            return [
                RollingBinStat(s, b, w.quantile(), len(w), w.total_seen)
                for (s, b), w in sorted(self._windows.items())
            ]

    def reset(self, schedule: str | None = None) -> None:
        """Forget one schedule's windows (all schedules when ``None``)."""
        with self._lock:
            for key in [k for k in self._windows if schedule is None or k[0] == schedule]:
                del self._windows[key]


__all__ = ["RollingQuantile", "RollingTailMonitor", "RollingBinStat", "DEFAULT_WINDOW", "DEFAULT_MAX_BINS"]
