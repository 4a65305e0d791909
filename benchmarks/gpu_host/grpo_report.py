"""The GRPO runs' report (``grpo_gpu.py``): each arm's ``steps.jsonl`` (examples/grpo_loop.py's per-step log)
summarised, and one PNG with reward, the sampled-token acceptance estimate and the capped-TIS fraction per step.

    python benchmarks/gpu_host/grpo_report.py OUT dense calibrated aggressive   # OUT/<arm>/steps.jsonl

writes ``OUT/grpo_summary.json`` and ``OUT/grpo_steps.png``. Runs on a CPU (matplotlib, Agg)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

WINDOW = 10  # steps in the first / last window and in the plot's running mean
PLOTTED = (("reward_mean", "reward (exact match)"), ("acceptance_est", "sampled-token acceptance estimate"),
           ("tis_capped_frac", "capped-TIS fraction"))


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The rows of a steps.jsonl, in step order; a torn last line (a trainer killed mid-write) is dropped."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return sorted(rows, key=lambda r: r["step"])


def _mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return round(sum(finite) / len(finite), 4) if finite else None


def summarize_arm(rows: Sequence[dict[str, Any]], window: int = WINDOW) -> dict[str, Any]:
    """Reward, acceptance and capped-TIS fraction over the first and last ``window`` steps and overall,
    KV budget and timings: the numbers a reader compares between arms."""
    if not rows:
        return {"steps": 0}
    first, last = rows[:window], rows[-window:]
    col = lambda rs, key: [r.get(key) for r in rs]
    return {
        "steps": len(rows),
        "reward_first": _mean(col(first, "reward_mean")), "reward_last": _mean(col(last, "reward_mean")),
        "reward_all": _mean(col(rows, "reward_mean")),
        "acceptance_first": _mean(col(first, "acceptance_est")), "acceptance_last": _mean(col(last, "acceptance_est")),
        "acceptance_min": min(r["acceptance_est"] for r in rows),
        "tis_capped_first": _mean(col(first, "tis_capped_frac")), "tis_capped_last": _mean(col(last, "tis_capped_frac")),
        "tis_capped_max": max(r["tis_capped_frac"] for r in rows),
        "kv_budget_tokens_mean": _mean(col(rows, "kv_budget_tokens_mean")),
        "completion_tokens_mean": _mean(col(rows, "completion_tokens")),
        "step_s_mean": _mean([r["rollout_s"] + r["train_s"] + r["sync_s"] for r in rows]),
        "rollout_s_mean": _mean(col(rows, "rollout_s")), "train_s_mean": _mean(col(rows, "train_s")),
        "sync_s_mean": _mean(col(rows, "sync_s")),
        "weight_versions_ok": all(r["sampled_weight_versions"] == [str(r["step"] - 1)] for r in rows),
    }


def summarize(arms: dict[str, Sequence[dict[str, Any]]], window: int = WINDOW) -> dict[str, Any]:
    return {"window": window, "arms": {name: summarize_arm(rows, window) for name, rows in arms.items()}}


def running_mean(values: Sequence[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def plot(arms: dict[str, Sequence[dict[str, Any]]], path: Path, window: int = WINDOW) -> Path:
    """Three panels, one line per arm (thin: per step; thick: running mean over ``window`` steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PLOTTED), 1, figsize=(9, 3.2 * len(PLOTTED)), sharex=True)
    for ax, (key, label) in zip(axes, PLOTTED):
        for i, (name, rows) in enumerate(arms.items()):
            steps, values = [r["step"] for r in rows], [r[key] for r in rows]
            color, style = f"C{i}", ("-", "--", ":", "-.")[i % 4]  # arms that coincide stay visible
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
            ax.plot(steps, running_mean(values, window), color=color, linestyle=style, linewidth=2, label=name)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best")
    axes[-1].set_xlabel("GRPO step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, names: Sequence[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read ``out/<arm>/steps.jsonl`` for every arm; write ``grpo_summary.json`` and ``grpo_steps.png``."""
    arms = {name: read_steps(out / name / "steps.jsonl") for name in names}
    summary = {**summarize(arms), **(extra or {})}
    if any(arms.values()):
        summary["plot"] = plot({n: r for n, r in arms.items() if r}, out / "grpo_steps.png").name
    (out / "grpo_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the run's folder (OUT/<arm>/steps.jsonl)")
    p.add_argument("arms", nargs="+")
    a = p.parse_args(argv)
    print(json.dumps(write_report(a.out, a.arms)["arms"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
