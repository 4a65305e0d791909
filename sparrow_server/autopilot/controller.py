"""The schedule autopilot's controller: per-bin acceptance samples in, next budgets out (pure numpy).

Each length bin keeps an *evidence window*: the verified tokens generated at the bin's current
budget (under the current weights). Once a window holds ``min_tokens`` tokens, the bin's p5 and a
distribution-free confidence interval (order statistics, normal approximation to the binomial)
decide:

- **raise** (fast) when the interval's upper end is below ``target``: back to the smallest budget
  that held the target before (if any), else ``raise_factor`` times the budget;
- **lower** (slow, ``lower_pages`` pages) when the interval's lower end is above ``target + margin``,
  not to a budget that failed before until the current budget's window holds ``retry_windows`` x
  ``min_tokens`` tokens that clear ``target + margin`` (doubled after each failure of the bin, so a
  budget on the target's edge is retried ever more rarely; 0: never retried);
- **hold** otherwise (the window keeps filling, so a later decision rests on more tokens).

Budgets stay page multiples, non-decreasing across bins (a raise carries the later bins up with
it; a bin is never lowered below the one before it) and within ``[floor_tokens, ceiling_tokens]``.
Given ``bin_tokens``, a bin's budget is also kept at most the page multiple that covers the bin's
longest length (every step in the bin is dense from there on, so a larger budget serves nothing
different): such a ``trim`` needs no evidence, and without it a bin that never sees tokens (lengths
no request reaches, e.g. prompt-only bin 0) would block every later bin from being lowered.
A bin whose budget changes starts a new window, so a bin changes at most once per ``min_tokens``
verified tokens. Every change carries the evidence that caused it (``BudgetChange``).

The evidence is keyed on the policy that generated it: the weight version and the adapter version
(a DistillSparse adapter changes the sparse actor). A rollout on a new weight version or a new
adapter version (``observe(..., weight_version=..., adapter=...)``) resets every window and the
memory of held/failed budgets, and retires the previous one: samples of a retired weight or
adapter version (late results of rollouts admitted before the change) are ignored, so they never
drive the new policy's budgets. The controller follows the newest policy it has seen; ``adapter``
None (no adapter) is the starting one.

The evidence has a kind (``config.acceptance``): exact acceptance, or the top-k lower bound SGLang's
verifier measures, which reads lower and so settles on larger budgets. The target is stated on one kind;
evidence of the other is refused and counted (``refused_tokens``), never mixed into a window.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

DEFAULT_MARGIN = 0.03
DEFAULT_MIN_TOKENS = 512
DEFAULT_CONFIDENCE = 0.9
DEFAULT_RAISE_FACTOR = 1.5
DEFAULT_LOWER_PAGES = 1
DEFAULT_QUANTILE = 0.05
DEFAULT_MAX_WINDOW_TOKENS = 20_000
DEFAULT_RETRY_WINDOWS = 4
RAISE, LOWER, FOLLOW, TRIM = "raise", "lower", "follow", "trim"
# What a verified token's acceptance is: exact (reference engine), or the top-k lower bound (SGLang), which
# reads lower (on SmolLM2-135M by 0.2-0.66 at p5: docs/autopilot.md). A target is stated on one of them.
EXACT_ACCEPTANCE, TOPK_BOUND_ACCEPTANCE = "exact", "topk_lower_bound"
ACCEPTANCE_KINDS = (EXACT_ACCEPTANCE, TOPK_BOUND_ACCEPTANCE)
DEFAULT_ACCEPTANCE = EXACT_ACCEPTANCE


class AutopilotConfigError(ValueError):
    """An invalid autopilot setting. ``field`` names it, ``value`` is its value."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field = field_name
        self.value = value
        self.reason = reason
        super().__init__(f"autopilot field {field_name!r} = {value!r}: {reason}")


@dataclass(frozen=True)
class AutopilotConfig:
    """What the controller holds: p5 in ``[target, target + margin]`` at the cheapest budgets in
    ``[floor_tokens, ceiling_tokens]`` (``None``: the smallest valid budget / no ceiling)."""

    target: float
    margin: float = DEFAULT_MARGIN
    floor_tokens: int | None = None
    ceiling_tokens: int | None = None
    min_tokens: int = DEFAULT_MIN_TOKENS
    confidence: float = DEFAULT_CONFIDENCE
    raise_factor: float = DEFAULT_RAISE_FACTOR
    lower_pages: int = DEFAULT_LOWER_PAGES
    quantile: float = DEFAULT_QUANTILE
    max_window_tokens: int = DEFAULT_MAX_WINDOW_TOKENS
    retry_windows: int = DEFAULT_RETRY_WINDOWS
    acceptance: str = DEFAULT_ACCEPTANCE  # the kind of acceptance ``target`` is stated on; other evidence is refused

    def __post_init__(self) -> None:
        if self.acceptance not in ACCEPTANCE_KINDS:
            raise AutopilotConfigError("acceptance", self.acceptance, f"must be one of {list(ACCEPTANCE_KINDS)}")
        _check_number("target", self.target, 0.0, 1.0, low_open=True)
        _check_number("margin", self.margin, 0.0, 1.0)
        _check_number("confidence", self.confidence, 0.0, 1.0, low_open=True, high_open=True)
        _check_number("quantile", self.quantile, 0.0, 1.0, low_open=True, high_open=True)
        _check_number("raise_factor", self.raise_factor, 1.0, math.inf, low_open=True)
        for name in ("min_tokens", "lower_pages", "max_window_tokens"):
            _check_int(name, getattr(self, name), 1)
        _check_int("retry_windows", self.retry_windows, 0)
        for name in ("floor_tokens", "ceiling_tokens"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        if self.max_window_tokens < self.min_tokens:
            raise AutopilotConfigError("max_window_tokens", self.max_window_tokens,
                                       f"must be >= min_tokens ({self.min_tokens})")
        if self.floor_tokens is not None and self.ceiling_tokens is not None and self.floor_tokens > self.ceiling_tokens:
            raise AutopilotConfigError("floor_tokens", self.floor_tokens, f"exceeds ceiling_tokens ({self.ceiling_tokens})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_number(name: str, value: Any, low: float, high: float, low_open: bool = False, high_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise AutopilotConfigError(name, value, "must be a number")
    if value < low or (low_open and value == low) or value > high or (high_open and value == high):
        raise AutopilotConfigError(name, value, f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AutopilotConfigError(name, value, f"must be an integer >= {minimum}")


def quantile_interval(values: np.ndarray, q: float, confidence: float) -> tuple[float, float, float]:
    """(quantile, low, high) of ``values`` ([N], N >= 1): the order statistics around rank ``N q``,
    ``z`` binomial standard deviations either side (distribution-free; no resampling)."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    n = x.size
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    spread = z * math.sqrt(n * q * (1 - q))
    lo = min(max(math.floor(n * q - spread), 0), n - 1)
    hi = min(max(math.ceil(n * q + spread), 0), n - 1)
    return float(np.quantile(x, q)), float(x[lo]), float(x[hi])


@dataclass(frozen=True)
class BinEvidence:
    """The verified tokens of one bin at one budget: their p5 and its confidence interval."""

    bin_index: int
    budget_tokens: int
    n_tokens: int
    p5: float
    p5_low: float
    p5_high: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BudgetChange:
    """One bin's budget change. ``evidence`` is ``None`` for a bin carried up by an earlier bin's
    raise (``reason == "follow"``), which keeps the schedule non-decreasing, and for a budget cut to the
    dense-equivalent size of its bin (``"trim"``: nothing served changes)."""

    bin_index: int
    old_tokens: int
    new_tokens: int
    reason: str  # RAISE, LOWER, FOLLOW or TRIM
    evidence: BinEvidence | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["evidence"] = self.evidence.to_dict() if self.evidence else None
        return d


@dataclass
class _Bin:
    window: list[np.ndarray] = field(default_factory=list)
    n_tokens: int = 0
    held: int | None = None  # smallest budget whose p5 reached the target
    failed: int = 0  # largest budget whose p5 interval lay below the target
    failures: int = 0  # raises of this bin (each doubles the evidence a retry of a failed budget needs)

    def add(self, values: np.ndarray, cap: int) -> None:
        self.window.append(values)
        self.n_tokens += values.size
        if self.n_tokens > cap:  # keep the newest ``cap`` tokens
            joined = np.concatenate(self.window)[-cap:]
            self.window, self.n_tokens = [joined], joined.size

    def clear(self) -> None:
        self.window, self.n_tokens = [], 0


class BudgetController:
    """Next budgets of one schedule from its verified tokens (module docstring). Not thread-safe."""

    def __init__(self, config: AutopilotConfig, budgets_tokens: Sequence[int], page_size: int, reserved_pages: int,
                 weight_version: str | None = None, bin_tokens: int | None = None):
        if not budgets_tokens:
            raise AutopilotConfigError("budgets_tokens", list(budgets_tokens), "a dense schedule has no budgets to steer")
        self.config = config
        self.page_size = page_size
        smallest = (reserved_pages + 1) * page_size
        self.floor = config.floor_tokens if config.floor_tokens is not None else smallest
        self.ceiling = config.ceiling_tokens if config.ceiling_tokens is not None else math.inf
        for name, value in (("floor_tokens", config.floor_tokens), ("ceiling_tokens", config.ceiling_tokens)):
            if value is not None and (value % page_size or value < smallest):
                raise AutopilotConfigError(name, value, f"must be a multiple of page_size {page_size} and >= {smallest} "
                                                        f"(one page more than the {reserved_pages} reserved)")
        self.budgets = tuple(int(b) for b in budgets_tokens)
        self.bin_tokens = bin_tokens
        self.weight_version = weight_version
        self.adapter: str | None = None  # the adapter version of the policy the windows describe
        self._retired: set[str] = set()
        self._retired_adapters: set[str | None] = set()
        self._bins = [_Bin() for _ in self.budgets]
        self.refused_tokens: dict[str, int] = {}  # per acceptance kind other than config.acceptance

    def observe(self, budgets_used: Sequence[int], acceptance, bin_indices, weight_version: str | None = None,
                adapter: str | None = None, kind: str = EXACT_ACCEPTANCE) -> int:
        """Add one verified rollout: ``acceptance`` [N] of kind ``kind`` and each token's bin index [N]
        (clamped to the last bin), generated under ``budgets_used`` by weights ``weight_version`` (None:
        not checked) with adapter version ``adapter`` (None: none). Only tokens of bins whose budget then
        equals the current one count; a rollout of another acceptance kind than ``config.acceptance`` is
        refused (counted in ``refused_tokens``). Returns how many tokens were added."""
        if kind != self.config.acceptance:
            n = int(np.asarray(acceptance).size)
            self.refused_tokens[kind] = self.refused_tokens.get(kind, 0) + n
            return 0
        new_weights = weight_version is not None and weight_version != self.weight_version
        if (new_weights and weight_version in self._retired) or adapter in self._retired_adapters:
            return 0  # generated by a policy already replaced
        if new_weights:
            self.new_weights(weight_version)
        if adapter != self.adapter:
            self.new_adapter(adapter)
        if len(budgets_used) != len(self.budgets):
            return 0
        acceptance = np.asarray(acceptance, dtype=np.float64).ravel()
        bins = np.minimum(np.asarray(bin_indices, dtype=np.int64).ravel(), len(self.budgets) - 1)
        added = 0
        for b in np.unique(bins):
            b = int(b)
            if budgets_used[b] == self.budgets[b]:
                values = acceptance[bins == b]
                self._bins[b].add(values, self.config.max_window_tokens)
                added += values.size
        return added

    def new_weights(self, weight_version: str | None) -> None:
        """Forget every sample and every held/failed budget: they described another policy."""
        if self.weight_version is not None:
            self._retired.add(self.weight_version)
        self.weight_version = weight_version
        self._bins = [_Bin() for _ in self.budgets]

    def new_adapter(self, adapter: str | None) -> None:
        """Forget every sample and every held/failed budget, and retire the previous adapter version."""
        self._retired_adapters.add(self.adapter)
        self.adapter = adapter
        self._bins = [_Bin() for _ in self.budgets]

    def adopt(self, budgets_tokens: Sequence[int]) -> None:
        """Budgets set from outside (a new schedule version): bins whose budget changed start over."""
        budgets = tuple(int(b) for b in budgets_tokens)
        if len(budgets) != len(self.budgets):
            self.budgets, self._bins = budgets, [_Bin() for _ in budgets]
            return
        for b, (old, new) in enumerate(zip(self.budgets, budgets)):
            if old != new:
                self._bins[b].clear()
        self.budgets = budgets

    def evidence(self, bin_index: int) -> BinEvidence | None:
        """The bin's current window (``None`` while empty)."""
        state = self._bins[bin_index]
        if not state.n_tokens:
            return None
        p5, low, high = quantile_interval(np.concatenate(state.window), self.config.quantile, self.config.confidence)
        return BinEvidence(bin_index, self.budgets[bin_index], state.n_tokens, p5, low, high)

    def at_ceiling_below_target(self) -> list[int]:
        """Bins at the ceiling whose decided p5 interval still lies below the target (they need more than the ceiling)."""
        out = []
        for b, budget in enumerate(self.budgets):
            ev = self.evidence(b)
            if (budget >= self.ceiling and ev is not None and ev.n_tokens >= self.config.min_tokens
                    and ev.p5_high < self.config.target):
                out.append(b)
        return out

    def step(self) -> list[BudgetChange]:
        """Decide every bin with a full window; apply and return the changes (empty: hold)."""
        proposed: list[int] = list(self.budgets)
        causes: dict[int, tuple[str, BinEvidence]] = {}
        for b in range(len(self.budgets)):
            ev = self.evidence(b)
            if ev is None or ev.n_tokens < self.config.min_tokens:
                continue
            decision = self._decide(b, ev)
            if decision is not None:
                proposed[b] = decision
                causes[b] = (RAISE if decision > self.budgets[b] else LOWER, ev)
        for b in range(len(proposed)):
            cap = self._dense_cap(b)
            if proposed[b] > cap:
                proposed[b] = cap
                if cap < self.budgets[b] and causes.get(b, (TRIM,))[0] != LOWER:
                    causes[b] = (TRIM, None)  # a dense bin's budget cut to its dense size (a raise there is moot)
        for b in range(1, len(proposed)):  # non-decreasing: a raise carries later bins, a lower stops at the bin before
            proposed[b] = max(proposed[b], proposed[b - 1])
        changes = []
        for b, (old, new) in enumerate(zip(self.budgets, proposed)):
            if old == new:
                continue
            reason, ev = causes.get(b, (FOLLOW, None))
            if reason in (LOWER, TRIM) and new > old:
                reason, ev = FOLLOW, None
            changes.append(BudgetChange(b, old, new, reason, ev))
            self._bins[b].clear()
        self.budgets = tuple(proposed)
        return changes

    def _decide(self, b: int, ev: BinEvidence) -> int | None:
        cfg, state, budget = self.config, self._bins[b], self.budgets[b]
        if ev.p5 >= cfg.target:
            state.held = budget if state.held is None else min(state.held, budget)
        if ev.p5_high < cfg.target:
            state.failed, state.failures = max(state.failed, budget), state.failures + 1
            if state.held is not None and state.held <= budget:
                state.held = None  # it held once, no longer does
            grown = self._pages_up(budget * cfg.raise_factor)
            target_budget = state.held if state.held is not None and state.held > budget else grown
            new = self._clamp(max(target_budget, budget + self.page_size))
            return new if new != budget else None
        if ev.p5_low > cfg.target + cfg.margin:
            new = self._clamp(budget - cfg.lower_pages * self.page_size)
            if new <= state.failed and not self._may_retry(state, ev):
                new = self._clamp(self._pages_up(state.failed + 1))
            return new if new < budget else None
        return None

    def _may_retry(self, state: _Bin, ev: BinEvidence) -> bool:
        """Whether the current budget's window (``ev``, clearing target + margin) is long enough to try a failed
        budget again: ``retry_windows`` x ``min_tokens`` tokens, doubled per earlier failure of the bin."""
        cfg = self.config
        return cfg.retry_windows > 0 and ev.n_tokens >= cfg.retry_windows * cfg.min_tokens * 2 ** (state.failures - 1)

    def _dense_cap(self, b: int) -> float:
        """Smallest budget that is dense over all of bin ``b`` (no cap for the open-ended last bin)."""
        if self.bin_tokens is None or b == len(self.budgets) - 1:
            return math.inf
        return max(self._pages_up((b + 1) * self.bin_tokens), self._clamp(0))

    def _pages_up(self, tokens: float) -> int:
        return int(math.ceil(tokens / self.page_size - 1e-9)) * self.page_size

    def _clamp(self, tokens: int) -> int:
        low = self._pages_up(self.floor)
        high = self.ceiling if math.isinf(self.ceiling) else int(self.ceiling) // self.page_size * self.page_size
        return int(min(max(tokens, low), high))

    def state(self) -> dict[str, Any]:
        """JSON-ready view: budgets, weights, and per bin the window, held and failed budgets."""
        bins = []
        for b, s in enumerate(self._bins):
            ev = self.evidence(b)
            bins.append({"bin_index": b, "budget_tokens": self.budgets[b], "window_tokens": s.n_tokens,
                         "held_tokens": s.held, "failed_tokens": s.failed or None,
                         "evidence": ev.to_dict() if ev else None})
        return {"config": self.config.to_dict(), "budgets_tokens": list(self.budgets), "floor_tokens": self.floor,
                "ceiling_tokens": None if math.isinf(self.ceiling) else int(self.ceiling),
                "weight_version": self.weight_version, "adapter": self.adapter, "bins": bins,
                "refused_tokens": dict(self.refused_tokens),
                "ceiling_bins_below_target": self.at_ceiling_below_target()}


__all__ = [
    "AutopilotConfig", "AutopilotConfigError", "BudgetController", "BudgetChange", "BinEvidence", "quantile_interval",
    "RAISE", "LOWER", "FOLLOW", "TRIM", "ACCEPTANCE_KINDS", "DEFAULT_ACCEPTANCE", "EXACT_ACCEPTANCE",
    "TOPK_BOUND_ACCEPTANCE",
]
