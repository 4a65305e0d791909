"""Replay of the failed-budget retry rule on the measured bin-1 acceptance of the CPU autopilot runs.

Bin 1 (lengths 64-127) of the SmolLM2 demonstrations sat on the target at 96 tokens and ended one page
above it, at 112, whenever one window at 96 measured below the target. This replays one bin's controller
over the committed verified rollouts (``evidence.json`` of the three runs: base weights, no adapter):
each simulated verified rollout is one real rollout's bin-1 tokens at the bin's current budget, drawn
with replacement (tokens of a rollout stay together: they are correlated). Budgets 96, 112 and 128 (dense
over the bin) are the ones the runs measured, so the bin is held to [96, 128]. For each ``retry_windows``
it reports, over many seeds, the share of tokens at each budget, the mean budget, the raises, and the p5 of
all tokens served.

    PYTHONPATH=. python benchmarks/autopilot/retry_replay.py --out benchmarks/results/autopilot/retry_replay.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "autopilot"
RUNS = {"": lambda r: True, "weight_update": lambda r: r["weight_version"] != "perturbed",
        "distill": lambda r: r.get("adapter") is None}  # the base policy's rollouts of each run
BIN, BIN_TOKENS, PAGE, RESERVED = 1, 64, 16, 3
FLOOR, CEILING = 96, 128  # the budgets with measured rollouts; 128 is dense over the bin
SETTINGS = {"target": 0.89, "margin": 0.03, "min_tokens": 128, "confidence": 0.8}  # the runs' autopilot


def pools() -> dict[int, list[np.ndarray]]:
    """Bin-1 acceptance of every verified rollout, by the bin's budget when it ran."""
    out: dict[int, list[np.ndarray]] = {}
    for run, keep in RUNS.items():
        for r in json.loads((RESULTS / run / "evidence.json").read_text())["records"]:
            lengths, values = np.asarray(r["basis_lengths"]), np.asarray(r["acceptance"])
            in_bin = lengths // BIN_TOKENS == BIN
            if keep(r) and in_bin.any() and FLOOR <= r["budgets_tokens"][BIN] <= CEILING:
                out.setdefault(r["budgets_tokens"][BIN], []).append(values[in_bin])
    return out


def replay(pool: dict[int, list[np.ndarray]], retry_windows: int, tokens: int, seed: int) -> dict:
    from sparrow_server.autopilot.controller import AutopilotConfig, BudgetController

    config = AutopilotConfig(**SETTINGS, floor_tokens=FLOOR, ceiling_tokens=CEILING, retry_windows=retry_windows)
    ctl = BudgetController(config, [FLOOR], PAGE, RESERVED)
    rng = np.random.default_rng(seed)
    served, at, raises = [], {b: 0 for b in pool}, 0
    while sum(at.values()) < tokens:
        budget = ctl.budgets[0]
        chunk = pool[budget][rng.integers(len(pool[budget]))]
        served.append(chunk)
        at[budget] += chunk.size
        ctl.observe(ctl.budgets, chunk, np.zeros(chunk.size, dtype=np.int64))
        raises += sum(c.reason == "raise" for c in ctl.step())
    total = sum(at.values())
    return {"share": {b: n / total for b, n in at.items()}, "mean_budget": sum(b * n for b, n in at.items()) / total,
            "raises": raises, "p5_served": float(np.quantile(np.concatenate(served), 0.05))}


def summarize(runs: list[dict], pool: dict[int, list[np.ndarray]]) -> dict:
    return {"share_of_tokens": {b: float(np.mean([r["share"][b] for r in runs])) for b in sorted(pool)},
            "mean_budget": float(np.mean([r["mean_budget"] for r in runs])),
            "raises_mean": float(np.mean([r["raises"] for r in runs])),
            "p5_served_median": float(np.median([r["p5_served"] for r in runs])),
            "p5_served_5th_percentile": float(np.quantile([r["p5_served"] for r in runs], 0.05))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tokens", type=int, default=20_000, help="bin-1 tokens verified per replay")
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--retry-windows", default="0,4", help="comma-separated values to compare (0: never retry)")
    args = p.parse_args()
    pool = pools()
    measured = {b: {"rollouts": len(v), "tokens": int(sum(x.size for x in v)),
                    "p5": float(np.quantile(np.concatenate(v), 0.05))} for b, v in sorted(pool.items())}
    out = {"settings": SETTINGS, "budgets": [FLOOR, CEILING], "tokens_per_replay": args.tokens, "seeds": args.seeds,
           "measured_bin1": measured, "by_retry_windows": {}}
    for k in (int(v) for v in args.retry_windows.split(",")):
        out["by_retry_windows"][k] = summarize([replay(pool, k, args.tokens, s) for s in range(args.seeds)], pool)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
