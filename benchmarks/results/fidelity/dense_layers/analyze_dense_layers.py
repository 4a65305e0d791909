"""What keeping layers 0-1 dense buys in acceptance (issue 24's decode ceiling drops them): per 512-token bin of
total length, p5 of exact acceptance under a fixed budget with layers 0-1 dense and with every layer sparse, on
the same tokens (paired), with a 95 % interval of the difference from a bootstrap over rollouts.

    PYTHONPATH=. python benchmarks/results/fidelity/dense_layers/analyze_dense_layers.py \\
        --rollouts benchmarks/results/fidelity/long --work W --budgets 128,256 > .../dense_layers.md
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BIN = 512
N_BOOT = 1000


def load(rollouts: Path, work: Path, config: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per rollout: (acceptance [n], total length of the step that produced each token [n])."""
    out = []
    for line in (rollouts / "rollouts.jsonl").read_text().splitlines():
        r = json.loads(line)
        a = np.load(work / "acc" / f"{r['id']}__{config}.npy").astype(np.float64)
        out.append((a, len(r["prompt_ids"]) + np.arange(a.size)))
    return out


def p5(values: np.ndarray) -> float:
    return float(np.quantile(values, 0.05))


def binned(per_rollout: list[tuple[np.ndarray, np.ndarray]], lo: int) -> np.ndarray:
    return np.concatenate([a[(n >= lo) & (n < lo + BIN)] for a, n in per_rollout])


def table(rollouts: Path, work: Path, budget: int, rng: np.random.Generator) -> list[str]:
    dense01, sparse = load(rollouts, work, f"fixed-{budget}-dense01"), load(rollouts, work, f"fixed-{budget}-nodense")
    top = max(int(n.max()) for _, n in dense01)
    lines = [f"### {budget} tokens of KV per sparse layer", "",
             "| bin from | tokens | p5, layers 0-1 dense | p5, every layer sparse | difference [95 %] | mean, dense / sparse |",
             "|---|---|---|---|---|---|"]
    for lo in range(0, top + 1, BIN):
        a, b = binned(dense01, lo), binned(sparse, lo)
        if a.size < 100:
            continue
        boot = []
        for _ in range(N_BOOT):  # resample rollouts (tokens of one rollout are correlated), paired
            pick = rng.integers(0, len(dense01), len(dense01))
            boot.append(p5(binned([sparse[i] for i in pick], lo)) - p5(binned([dense01[i] for i in pick], lo)))
        low, high = np.quantile(boot, [0.025, 0.975])
        lines.append(f"| {lo} | {a.size} | {p5(a):.3f} | {p5(b):.3f} | {p5(b) - p5(a):+.3f} [{low:+.3f}, {high:+.3f}] "
                     f"| {a.mean():.3f} / {b.mean():.3f} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--budgets", default="128,256")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for budget in (int(b) for b in a.budgets.split(",")):
        print("\n".join(table(a.rollouts, a.work, budget, rng)))


if __name__ == "__main__":
    main()
