"""The calibration pipeline: for each candidate budget, sparse rollouts under a fixed-budget
schedule, exact dense verification, p5 per length bin with bootstrap intervals; then the cost
model's search picks, per bin, the cheapest budget whose p5 (or its lower confidence bound) meets
the threshold, keeping budgets non-decreasing with length.

Note on the intervals: the bootstrap resamples tokens, and tokens of one rollout are correlated,
so the intervals are optimistic; use several rollouts per prompt and many prompts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from sparrow_server.calibrate.sources import Rollout
from sparrow_server.cost.search import SearchResult, search_schedule
from sparrow_server.engine.base import SamplingParams
from sparrow_server.sparsity.schedule import (
    DEFAULT_BIN_TOKENS, DEFAULT_DENSE_LAYERS, DEFAULT_PAGE_SIZE, DEFAULT_RECENT_PAGES, DEFAULT_SINK_PAGES,
    LENGTH_BASES, Schedule,
)
from sparrow_server.stats.tail import DEFAULT_BOOTSTRAP, BinQuantile, binned_quantiles

DEFAULT_THRESHOLD = 0.86
DEFAULT_BUDGETS = (512, 1024, 2048, 4096)
DEFAULT_MAX_NEW_TOKENS = 8192
DEFAULT_CALIBRATION_TEMPERATURE = 1.0  # RL rollouts sample at T = 1
DEFAULT_SAMPLES_PER_PROMPT = 1
DEFAULT_SEED = 0


class CalibrationError(ValueError):
    """A bad calibration setting; ``field`` names it (as the CLI flag's name), ``value`` its value."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field, self.value = field_name, value
        super().__init__(f"{field_name} = {value!r}: {reason}")


@dataclass(frozen=True)
class CalibrationConfig:
    name: str
    threshold: float = DEFAULT_THRESHOLD
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    bin_tokens: int = DEFAULT_BIN_TOKENS
    page_size: int = DEFAULT_PAGE_SIZE
    sink_pages: int = DEFAULT_SINK_PAGES
    recent_pages: int = DEFAULT_RECENT_PAGES
    dense_layers: tuple[int, ...] = DEFAULT_DENSE_LAYERS
    length_basis: str = "total"
    temperature: float = DEFAULT_CALIBRATION_TEMPERATURE
    samples_per_prompt: int = DEFAULT_SAMPLES_PER_PROMPT
    seed: int = DEFAULT_SEED
    ignore_eos: bool = False
    use_lower_bound: bool = False  # compare the bootstrap lower bound of p5 (conservative) instead of p5
    n_boot: int = DEFAULT_BOOTSTRAP

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise CalibrationError("threshold", self.threshold, "must be in (0, 1]")
        if not self.budgets:
            raise CalibrationError("budgets", list(self.budgets), "give at least one budget")
        reserved = (self.sink_pages + self.recent_pages) * self.page_size
        for b in self.budgets:
            if isinstance(b, bool) or not isinstance(b, int) or b % self.page_size or b <= reserved:
                raise CalibrationError("budgets", b, f"each budget must be a multiple of the page size "
                                       f"({self.page_size}) above the reserved {reserved} tokens")
        if len(set(self.budgets)) != len(self.budgets):
            raise CalibrationError("budgets", list(self.budgets), "has duplicates")
        for key in ("max_new_tokens", "bin_tokens", "samples_per_prompt"):
            if getattr(self, key) < 1:
                raise CalibrationError(key.replace("_", "-"), getattr(self, key), "must be >= 1")
        if self.length_basis not in LENGTH_BASES:
            raise CalibrationError("length-basis", self.length_basis, f"must be one of {list(LENGTH_BASES)}")
        if not self.temperature >= 0:
            raise CalibrationError("temperature", self.temperature, "must be >= 0")

    @property
    def acceptance_temperature(self) -> float:
        """Acceptance is computed at the rollout temperature (1 for greedy, as logprobs are reported)."""
        return self.temperature or 1.0

    def sampling(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed,
                              ignore_eos=self.ignore_eos)

    def schedule_fields(self) -> dict[str, Any]:
        return dict(page_size=self.page_size, bin_tokens=self.bin_tokens, sink_pages=self.sink_pages,
                    recent_pages=self.recent_pages, dense_layers=self.dense_layers, length_basis=self.length_basis)


def fixed_budget_schedule(config: CalibrationConfig, budget: int) -> Schedule:
    """The schedule calibration rollouts run under: ``budget`` tokens at every length."""
    return Schedule(name=f"{config.name}-fixed-{budget}", budgets_tokens=(budget,),
                    description=f"calibration: fixed {budget}-token budget", **config.schedule_fields())


@dataclass(frozen=True)
class BudgetMeasurement:
    budget: int
    acceptance: np.ndarray = field(repr=False)  # [N] every generated token, pooled over rollouts
    basis_lengths: np.ndarray = field(repr=False)  # [N]
    bins: tuple[BinQuantile, ...]
    rollouts: int

    def p5s(self, n_bins: int) -> list[float]:
        return [self.bins[b].quantile if b < len(self.bins) else math.nan for b in range(n_bins)]

    def lower_bounds(self, n_bins: int) -> list[float]:
        return [self.bins[b].ci_low if b < len(self.bins) else math.nan for b in range(n_bins)]


def measure_budget(source: Any, scorer: Any, prompts: Sequence[tuple[int, ...]], config: CalibrationConfig,
                   budget: int, show_progress: bool = True) -> BudgetMeasurement:
    """Sparse rollouts at a fixed ``budget``, verified exactly against the dense policy."""
    from tqdm import tqdm

    schedule = fixed_budget_schedule(config, budget)
    total = len(prompts) * config.samples_per_prompt
    with tqdm(total=total, desc=f"rollouts @ {budget}", unit="rollout", disable=not show_progress) as bar:
        rollouts: list[Rollout] = source.generate(prompts, schedule, config.sampling(), config.samples_per_prompt,
                                                  bar.update)
    acc, lengths = [], []
    for r in tqdm(rollouts, desc=f"verify @ {budget}", unit="rollout", disable=not show_progress):
        if not r.completion_ids:
            continue
        scores = scorer.exact(r.prompt_ids, r.completion_ids, schedule, config.acceptance_temperature)
        acc.append(scores.acceptance)
        lengths.append(scores.basis_lengths)
    if not acc:
        raise CalibrationError("prompts", len(prompts), f"no rollout at budget {budget} generated any token")
    acceptance, basis = np.concatenate(acc), np.concatenate(lengths)
    bins = binned_quantiles(acceptance, basis, config.bin_tokens, n_boot=config.n_boot, seed=config.seed)
    return BudgetMeasurement(budget, acceptance, basis, tuple(bins), len(rollouts))


@dataclass(frozen=True)
class CalibrationResult:
    config: CalibrationConfig
    measurements: tuple[BudgetMeasurement, ...]
    search: SearchResult
    mean_prompt_tokens: float

    @property
    def schedule(self) -> Schedule:
        return self.search.schedule

    @property
    def n_bins(self) -> int:
        return max(len(m.bins) for m in self.measurements)


def search_measured(measurements: Sequence[BudgetMeasurement], config: CalibrationConfig,
                    model_shape: Any = None, prompt_len: int = 0) -> SearchResult:
    n_bins = max(len(m.bins) for m in measurements)
    p5 = {m.budget: m.p5s(n_bins) for m in measurements}
    lower = {m.budget: m.lower_bounds(n_bins) for m in measurements} if config.use_lower_bound else None
    return search_schedule(p5, config.threshold, config.name, lower_bounds=lower, model=model_shape,
                           prompt_len=prompt_len, gen_len=config.max_new_tokens, **config.schedule_fields())


def run_calibration(source: Any, scorer: Any, prompts: Sequence[tuple[int, ...]], config: CalibrationConfig,
                    model_shape: Any = None, show_progress: bool = True) -> CalibrationResult:
    """Measure every budget, then search (``model_shape`` adds the predicted speedup)."""
    measurements = tuple(measure_budget(source, scorer, prompts, config, b, show_progress)
                         for b in sorted(config.budgets))
    mean_prompt = float(np.mean([len(p) for p in prompts]))
    search = search_measured(measurements, config, model_shape, int(round(mean_prompt)))
    return CalibrationResult(config, measurements, search, mean_prompt)


__all__ = [
    "CalibrationConfig", "CalibrationError", "BudgetMeasurement", "CalibrationResult", "fixed_budget_schedule",
    "measure_budget", "search_measured", "run_calibration", "DEFAULT_THRESHOLD", "DEFAULT_BUDGETS",
]
