"""The calibration report folder: ``report.json`` (the table) and PNG plots.

Plots (matplotlib, imported lazily; ``pip install matplotlib`` when it is missing):
``p5_vs_length.png`` (p5 per length bin for each budget, bootstrap bands, the threshold line and
the chosen schedule), ``acceptance_histogram.png`` (per-token acceptance per budget: the skew),
``cost_vs_budget.png`` (predicted rollout time relative to dense, per fixed budget and for the
schedule, from the cost model; only with a model shape).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from sparrow_server.calibrate.pipeline import CalibrationResult, fixed_budget_schedule
from sparrow_server.sparsity.schedule import Schedule

HIGH_ACCEPTANCE = 0.99  # "agrees" in the skew summary: share of tokens at or above this
HIST_BINS = 50


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def summary(acceptance: np.ndarray) -> dict[str, Any]:
    """Skew of a pooled acceptance sample: share >= 0.99, mean, p5, p1, min."""
    a = np.asarray(acceptance, dtype=np.float64)
    return {"tokens": int(a.size), "share_ge_0.99": _num(np.mean(a >= HIGH_ACCEPTANCE)), "mean": _num(a.mean()),
            "p5": _num(np.quantile(a, 0.05)), "p1": _num(np.quantile(a, 0.01)), "min": _num(a.min())}


def relative_costs(result: CalibrationResult, model_shape: Any) -> dict[str, float]:
    """Predicted rollout time / dense for each fixed budget and for the chosen schedule."""
    from sparrow_server.cost.roofline import rollout_estimate

    prompt_len, gen_len = int(round(result.mean_prompt_tokens)), result.config.max_new_tokens
    out = {}
    schedules: list[tuple[str, Schedule]] = [(str(m.budget), fixed_budget_schedule(result.config, m.budget))
                                             for m in result.measurements]
    schedules.append(("schedule", result.schedule))
    for key, schedule in schedules:
        est = rollout_estimate(model_shape, schedule, prompt_len, gen_len)
        out[key] = est.sparse_s / est.dense_s
    return out


def report_table(result: CalibrationResult, costs: dict[str, float] | None = None) -> dict[str, Any]:
    cfg = result.config
    return {
        "config": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()}},
        "mean_prompt_tokens": result.mean_prompt_tokens,
        "budgets": [
            {"budget_tokens": m.budget, "rollouts": m.rollouts, "summary": summary(m.acceptance),
             "relative_cost": _num(costs.get(str(m.budget))) if costs else None,
             "bins": [{"bin": b.bin_index, "from_tokens": b.bin_index * cfg.bin_tokens, "tokens": b.n_tokens,
                       "p5": _num(b.quantile), "p5_ci": [_num(b.ci_low), _num(b.ci_high)], "mean": _num(b.mean)}
                      for b in m.bins]}
            for m in result.measurements
        ],
        "search": result.search.to_dict(),
        "schedule_relative_cost": _num(costs.get("schedule")) if costs else None,
    }


def write_report(result: CalibrationResult, out_dir: str | Path, model_shape: Any = None,
                 plots: bool = True) -> Path:
    """Write ``report.json`` (+ plots) into ``out_dir``; returns the JSON path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    costs = relative_costs(result, model_shape) if model_shape is not None else None
    path = out_dir / "report.json"
    path.write_text(json.dumps(report_table(result, costs), indent=2, allow_nan=False) + "\n")
    if plots:
        plot_p5_vs_length(result, out_dir / "p5_vs_length.png")
        plot_histogram(result, out_dir / "acceptance_histogram.png")
        if costs is not None:
            plot_costs(costs, out_dir / "cost_vs_budget.png")
    return path


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # a dev dependency: the report's JSON is written regardless
        raise RuntimeError("the calibration plots need matplotlib: pip install matplotlib (or pass --no-plots)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_p5_vs_length(result: CalibrationResult, path: Path) -> None:
    plt = _pyplot()
    cfg = result.config
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m in result.measurements:
        x = np.array([(b.bin_index + 0.5) * cfg.bin_tokens for b in m.bins])
        y = np.array([b.quantile for b in m.bins])
        (line,) = ax.plot(x, y, marker="o", label=f"fixed {m.budget}")
        ax.fill_between(x, [b.ci_low for b in m.bins], [b.ci_high for b in m.bins], alpha=0.15,
                        color=line.get_color())
    ax.axhline(cfg.threshold, color="k", linestyle="--", label=f"threshold {cfg.threshold}")
    budgets = result.schedule.budgets_tokens
    for b, budget in enumerate(budgets):
        ax.annotate(str(budget), ((b + 0.5) * cfg.bin_tokens, cfg.threshold), textcoords="offset points",
                    xytext=(0, -14), ha="center", fontsize=8)
    ax.set_xlabel(f"length ({cfg.length_basis} tokens; bins of {cfg.bin_tokens})")
    ax.set_ylabel("p5 of per-token acceptance")
    ax.set_title(f"{cfg.name}: p5 per length bin (numbers: chosen budget per bin)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_histogram(result: CalibrationResult, path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    edges = np.linspace(0, 1, HIST_BINS + 1)
    for m in result.measurements:
        ax.hist(m.acceptance, bins=edges, histtype="step", label=f"fixed {m.budget}", density=True)
    ax.set_yscale("log")
    ax.axvline(result.config.threshold, color="k", linestyle="--")
    ax.set_xlabel("per-token acceptance")
    ax.set_ylabel("density (log)")
    ax.set_title("acceptance is concentrated at 1 with a long low tail")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_costs(costs: dict[str, float], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    fixed = sorted((int(k), v) for k, v in costs.items() if k != "schedule")
    ax.plot([b for b, _ in fixed], [v for _, v in fixed], marker="o", label="fixed budget")
    ax.axhline(costs["schedule"], color="C1", linestyle="--", label="calibrated schedule")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV budget (tokens)")
    ax.set_ylabel("predicted rollout time / dense")
    ax.set_title("cost model (roofline)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["write_report", "report_table", "summary", "relative_costs"]
