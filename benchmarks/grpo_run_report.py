"""Tables for a finished GRPO run of ``benchmarks/gpu_host/grpo_gpu.py``: the per-step logs of each arm
(``steps-<arm>.jsonl`` as the run packs them, or ``<arm>/steps.jsonl``) read back and compared.

``grpo_summary.json`` (the runner's own report) has first/last-window means; this adds what a reader needs
to judge the arms against each other: reward per 10-step window and its least-squares slope, the first
step whose trailing-window reward reaches 0.5, the per-step acceptance estimate's 5th percentile (over
steps: each step's value is the mean of ``min(1, p_dense / p_sparse)`` over its sampled tokens, not a
per-token tail), how many steps had more than 0, 1 % or 5 % of their tokens' TIS weights capped, completion
lengths per sample, the correlation of acceptance with completion length, and every arm's reward and
acceptance minus the reference arm's (the same problems at every step in every arm).

    python benchmarks/grpo_run_report.py benchmarks/results/grpo_gpu/run1 [--arms dense calibrated aggressive]

writes ``grpo_run_report.json`` and ``grpo_run_report.md`` into that folder (``--out`` elsewhere) and
prints the Markdown. Stdlib and numpy only."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ARMS = ("dense", "calibrated", "aggressive")
WINDOW = 10
CAPPED_ABOVE = (0.0, 0.01, 0.05)  # fractions of a step's tokens whose TIS weight hit the cap
REWARD_REACHED = 0.5


def steps_path(folder: Path, arm: str) -> Path:
    packed = folder / f"steps-{arm}.jsonl"
    return packed if packed.is_file() else folder / arm / "steps.jsonl"


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The rows in step order; a torn last line (a trainer stopped mid-write) is dropped."""
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(rows, key=lambda r: r["step"])


def _r(x: float, digits: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def window_means(values: np.ndarray, window: int) -> list[float]:
    """Means of consecutive ``window``-step blocks (a shorter last block is kept)."""
    return [_r(values[i: i + window].mean()) for i in range(0, len(values), window)]


def first_step_reaching(steps: np.ndarray, values: np.ndarray, level: float, window: int) -> int | None:
    """The first step whose trailing ``window``-step mean is >= ``level`` (only full windows count)."""
    for i in range(window - 1, len(values)):
        if values[i - window + 1: i + 1].mean() >= level:
            return int(steps[i])
    return None


def slope(x: np.ndarray, y: np.ndarray) -> float | None:
    return _r(np.polyfit(x, y, 1)[0], 6) if len(x) >= 2 else None


def arm_table(rows: Sequence[dict[str, Any]], window: int = WINDOW) -> dict[str, Any]:
    if not rows:
        return {"steps": 0}
    col = lambda key: np.array([r[key] for r in rows], dtype=float)  # noqa: E731
    step, reward, acc, capped = col("step"), col("reward_mean"), col("acceptance_est"), col("tis_capped_frac")
    length = col("completion_tokens") / col("samples")  # generated tokens per sample, per step
    half = len(rows) // 2
    return {
        "steps": len(rows),
        "samples_per_step": sorted({int(r["samples"]) for r in rows}),
        "reward_mean": _r(reward.mean()),
        "reward_windows": window_means(reward, window),
        "reward_slope_per_step": slope(step, reward),
        "reward_slope_second_half": slope(step[half:], reward[half:]),
        f"first_step_window_reward_ge_{REWARD_REACHED}": first_step_reaching(step, reward, REWARD_REACHED, window),
        "steps_no_correct": int((col("correct") == 0).sum()),
        "acceptance_mean": _r(acc.mean()),
        "acceptance_p5_over_steps": _r(np.percentile(acc, 5)),
        "acceptance_min": _r(acc.min()),
        "acceptance_windows": window_means(acc, window),
        "tis_mean": _r(col("tis_mean").mean()),
        "tis_capped_mean": _r(capped.mean()),
        "tis_capped_max": _r(capped.max()),
        "tis_capped_windows": window_means(capped, window),
        **{f"steps_capped_gt_{x:g}": _r((capped > x).mean(), 3) for x in CAPPED_ABOVE},
        "tokens_per_sample_mean": _r(length.mean(), 2),
        "tokens_per_sample_windows": [_r(v, 2) for v in window_means(length, window)],
        "corr_acceptance_tokens_per_sample": _r(np.corrcoef(acc, length)[0, 1], 3)
        if len(rows) > 2 and acc.std() > 0 and length.std() > 0 else None,  # undefined for a constant column
        "kv_budget_tokens_mean": _r(np.nanmean([r["kv_budget_tokens_mean"] if r.get("kv_budget_tokens_mean") is not None
                                                else np.nan for r in rows]), 1),
        "grad_norm_windows": window_means(col("grad_norm"), window),
        "rollout_s_mean": _r(col("rollout_s").mean(), 3), "train_s_mean": _r(col("train_s").mean(), 3),
        "sync_s_mean": _r(col("sync_s").mean(), 3), "sync_s_max": _r(col("sync_s").max(), 3),
        "weight_versions_ok": all(list(r["sampled_weight_versions"]) == [str(r["step"] - 1)] for r in rows),
    }


def versus(rows: Sequence[dict[str, Any]], ref: Sequence[dict[str, Any]], window: int = WINDOW) -> dict[str, Any]:
    """This arm minus the reference arm, step by step over the steps both have."""
    mine, theirs = {r["step"]: r for r in rows}, {r["step"]: r for r in ref}
    common = sorted(set(mine) & set(theirs))
    if not common:
        return {"steps": 0}
    diff = lambda key: np.array([mine[s][key] - theirs[s][key] for s in common], dtype=float)  # noqa: E731
    reward, acc = diff("reward_mean"), diff("acceptance_est")
    return {"steps": len(common), "reward_minus_ref_mean": _r(reward.mean()),
            "reward_minus_ref_windows": window_means(reward, window), "acceptance_minus_ref_mean": _r(acc.mean())}


def build(folder: Path, arms: Sequence[str], reference: str, window: int = WINDOW) -> dict[str, Any]:
    rows = {arm: read_steps(steps_path(folder, arm)) for arm in arms}
    report = {"folder": str(folder), "window": window, "arms": {a: arm_table(r, window) for a, r in rows.items()}}
    if reference in rows and len(rows) > 1:
        report["versus_" + reference] = {a: versus(r, rows[reference], window) for a, r in rows.items() if a != reference}
    return report


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return " ".join(_fmt(x) for x in v)
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown(report: dict[str, Any]) -> str:
    arms = list(report["arms"])
    keys = list(next(iter(report["arms"].values())))
    lines = [f"Per arm ({report['window']}-step windows; acceptance = the per-step sampled-token estimate):", "",
             "| | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    lines += [f"| {k} | " + " | ".join(_fmt(report["arms"][a].get(k)) for a in arms) + " |" for k in keys]
    for name, table in ((k, v) for k, v in report.items() if k.startswith("versus_")):
        others = list(table)
        lines += ["", f"Minus `{name[len('versus_'):]}`, step by step:", "",
                  "| | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
        lines += [f"| {k} | " + " | ".join(_fmt(table[a].get(k)) for a in others) + " |"
                  for k in next(iter(table.values()))]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="the run's folder (steps-<arm>.jsonl or <arm>/steps.jsonl)")
    p.add_argument("--arms", nargs="+", default=list(ARMS))
    p.add_argument("--reference", default="dense", help="the arm the others are compared with step by step")
    p.add_argument("--window", type=int, default=WINDOW)
    p.add_argument("--out", type=Path, default=None, help="where the two files go (default: the folder)")
    a = p.parse_args(argv)
    missing = [arm for arm in a.arms if not steps_path(a.folder, arm).is_file()]
    if missing:
        p.error(f"no steps file for {', '.join(missing)} in {a.folder}")
    report = build(a.folder, a.arms, a.reference, a.window)
    out = a.out or a.folder
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpo_run_report.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (out / "grpo_run_report.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
