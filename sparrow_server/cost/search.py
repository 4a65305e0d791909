"""Schedule search, the pure part of calibration: measured tail quantiles -> a schedule.

Input: for each candidate budget (tokens), the measured p5 acceptance per length bin (NaN where
the bin has no data), and optionally the lower confidence bound of each p5. Per bin the chosen
budget is the cheapest one whose statistic (the lower bound when given, else the p5) reaches the
threshold; at a fixed page size cost is monotone in the budget, so this is the cost-optimal
choice. Then:

- budgets must not decrease with length: a bin whose cheapest feasible budget is below the
  previous bin's budget is raised (flagged ``raised``) to the cheapest budget >= the previous one
  that also meets the threshold there (measured p5 is noisy, so it need not rise with the budget;
  when it does, this is exactly the running maximum);
- a bin where no budget (at or above the previous bin's) reaches the threshold takes the largest
  budget and is flagged ``infeasible``;
- a bin with no data takes the choice of the next bin that has data (trailing bins without data are
  dropped: the last schedule bin extends to infinity) and is flagged ``no_data``.

The result is the element-wise smallest non-decreasing budget sequence in which every bin either
meets the threshold or has the largest budget.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from sparrow_server.cost.hardware import Hardware
from sparrow_server.cost.model_shape import ModelShape
from sparrow_server.cost.roofline import DEFAULT_DECODE_BATCH, DEFAULT_SAMPLES, rollout_estimate
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.tail import BinQuantile

BIN_OK, BIN_RAISED, BIN_INFEASIBLE, BIN_NO_DATA = "ok", "raised", "infeasible", "no_data"


@dataclass(frozen=True)
class BinChoice:
    bin_index: int
    budget_tokens: int  # in the schedule (after the running maximum)
    cheapest_feasible: int | None  # None when no budget met the threshold or the bin has no data
    statistic: float  # the compared value at the chosen budget (NaN if unmeasured)
    status: str  # ok | raised | infeasible | no_data


@dataclass(frozen=True)
class SearchResult:
    schedule: Schedule
    bins: tuple[BinChoice, ...]
    predicted_speedup: float | None  # when a model was given

    @property
    def infeasible_bins(self) -> tuple[int, ...]:
        return tuple(b.bin_index for b in self.bins if b.status == BIN_INFEASIBLE)

    def to_dict(self) -> dict:
        return {
            "schedule": self.schedule.to_dict(),
            "bins": [b.__dict__ for b in self.bins],
            "infeasible_bins": list(self.infeasible_bins),
            "predicted_speedup": self.predicted_speedup,
        }


def _as_table(table: Mapping[int, Sequence[float]], field_name: str) -> tuple[np.ndarray, np.ndarray]:
    """-> (budgets [K] ascending, values [K, n_bins])."""
    if not table:
        raise ValueError(f"{field_name}: empty table")
    budgets = sorted(table)
    rows = [np.asarray(table[b], dtype=np.float64) for b in budgets]
    if len({r.shape for r in rows}) != 1 or rows[0].ndim != 1:
        raise ValueError(f"{field_name}: every budget needs the same number of bins")
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"{field_name}: budget {b!r} must be a positive integer (tokens)")
    return np.asarray(budgets, dtype=np.int64), np.stack(rows)


def search_schedule(
    p5: Mapping[int, Sequence[float]],
    threshold: float,
    name: str,
    lower_bounds: Mapping[int, Sequence[float]] | None = None,
    model: ModelShape | None = None,
    hardware: Hardware | None = None,
    prompt_len: int = 0,
    gen_len: int = 32_000,
    samples: int = DEFAULT_SAMPLES,
    batch: int = DEFAULT_DECODE_BATCH,
    **schedule_fields,
) -> SearchResult:
    """Cheapest non-decreasing per-bin budgets meeting ``threshold`` (see the module docstring).

    p5 / lower_bounds: {budget_tokens: [n_bins] values}. ``schedule_fields`` go to ``Schedule``
    (page_size, bin_tokens, sink_pages, ...; ``threshold`` is set). With ``model`` the result
    carries the predicted rollout speedup for (prompt_len, gen_len, samples, hardware, batch).
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold = {threshold!r}: must be in (0, 1]")
    budgets, values = _as_table(p5, "p5")
    if lower_bounds is not None:
        lb_budgets, lb_values = _as_table(lower_bounds, "lower_bounds")
        if not np.array_equal(lb_budgets, budgets) or lb_values.shape != values.shape:
            raise ValueError("lower_bounds: must have the same budgets and bins as p5")
        compared = np.where(np.isnan(values), np.nan, lb_values)
    else:
        compared = values
    has_data = ~np.all(np.isnan(compared), axis=0)  # [n_bins]
    if not has_data.any():
        raise ValueError("p5: no bin has any data")
    n_bins = int(np.nonzero(has_data)[0][-1]) + 1
    choices: list[BinChoice] = []
    running = int(budgets[0])
    for b in range(n_bins):
        col = compared[:, b]
        if not has_data[b]:
            choices.append(BinChoice(b, -1, None, math.nan, BIN_NO_DATA))  # filled in below
            continue
        feasible = col >= threshold
        cheapest = int(budgets[np.argmax(feasible)]) if feasible.any() else None
        allowed = np.nonzero(feasible & (budgets >= running))[0]
        if allowed.size:
            i = int(allowed[0])
            status = BIN_OK if int(budgets[i]) == cheapest else BIN_RAISED
        else:
            i, status = len(budgets) - 1, BIN_INFEASIBLE
        running = int(budgets[i])
        choices.append(BinChoice(b, running, cheapest, float(col[i]), status))
    # No-data bins take the next data bin's budget (>= the previous one, so the order holds).
    for b in range(n_bins - 1, -1, -1):
        if choices[b].status == BIN_NO_DATA:
            choices[b] = replace(choices[b], budget_tokens=choices[b + 1].budget_tokens)
    schedule = Schedule(
        name=name,
        budgets_tokens=tuple(c.budget_tokens for c in choices),
        threshold=float(threshold),
        **{"description": f"searched for p5 >= {threshold} over budgets {budgets.tolist()}", **schedule_fields},
    )
    speedup = None
    if model is not None:
        speedup = rollout_estimate(model, schedule, prompt_len, gen_len, samples, hardware, batch).speedup
    return SearchResult(schedule, tuple(choices), speedup)


def tables_from_bin_quantiles(
    per_budget: Mapping[int, Sequence[BinQuantile]],
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """``{budget: binned_quantiles(...)}`` -> the ``(p5, lower_bounds)`` tables ``search_schedule``
    takes, padded with NaN to the longest bin list."""
    n_bins = max((len(rows) for rows in per_budget.values()), default=0)
    p5, lower = {}, {}
    for budget, rows in per_budget.items():
        pad = [math.nan] * (n_bins - len(rows))
        p5[budget] = [r.quantile for r in rows] + pad
        lower[budget] = [r.ci_low for r in rows] + pad
    return p5, lower


__all__ = ["BinChoice", "tables_from_bin_quantiles", "SearchResult", "search_schedule", "BIN_OK", "BIN_RAISED", "BIN_INFEASIBLE", "BIN_NO_DATA"]
