"""Two configurations of ``score.py`` on the same tokens: p5 of exact acceptance per bin of total length for each,
and a 95 % interval of their difference from a bootstrap over rollouts (the tokens of one rollout are correlated,
so rollouts are resampled, paired: the same picks for both).

    PYTHONPATH=. python benchmarks/fidelity/paired_p5.py --rollouts R --work W \\
        --base fixed-256-dense01 --other fixed-256-dense01-lm-float8_e4m3fn
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

BIN = 512
N_BOOT = 1000
MIN_TOKENS = 100  # a bin with fewer tokens has no p5 worth printing

PerRollout = list[tuple[np.ndarray, np.ndarray]]


def load(rollouts: Path, work: Path, config: str) -> PerRollout:
    """Per rollout: (acceptance [n], total length of the step that produced each token [n])."""
    out = []
    for line in (rollouts / "rollouts.jsonl").read_text().splitlines():
        r = json.loads(line)
        a = np.load(work / "acc" / f"{r['id']}__{config}.npy").astype(np.float64)
        out.append((a, len(r["prompt_ids"]) + np.arange(a.size)))
    return out


def p5(values: np.ndarray) -> float:
    return float(np.quantile(values, 0.05))


def binned(per_rollout: PerRollout, lo: int) -> np.ndarray:
    return np.concatenate([a[(n >= lo) & (n < lo + BIN)] for a, n in per_rollout])


def paired_rows(base: PerRollout, other: PerRollout, rng: np.random.Generator) -> list[str]:
    """Table rows: bin, tokens, p5 base, p5 other, difference [95 %], means."""
    top = max(int(n.max()) for _, n in base)
    rows = []
    for lo in range(0, top + 1, BIN):
        a, b = binned(base, lo), binned(other, lo)
        if a.size < MIN_TOKENS:
            continue
        boot = []
        for _ in range(N_BOOT):
            pick = rng.integers(0, len(base), len(base))
            boot.append(p5(binned([other[i] for i in pick], lo)) - p5(binned([base[i] for i in pick], lo)))
        low, high = np.quantile(boot, [0.025, 0.975])
        rows.append(f"| {lo} | {a.size} | {p5(a):.3f} | {p5(b):.3f} | {p5(b) - p5(a):+.3f} [{low:+.3f}, {high:+.3f}] "
                    f"| {a.mean():.3f} / {b.mean():.3f} |")
    return rows


def table(title: str, base_label: str, other_label: str, rows: list[str], means_label: str | None = None) -> list[str]:
    means_label = means_label or f"{base_label} / {other_label}"
    return [f"### {title}", "",
            f"| bin from | tokens | p5, {base_label} | p5, {other_label} | difference [95 %] | mean, {means_label} |",
            "|---|---|---|---|---|---|", *rows, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--base", required=True, help="a configuration name of score.py (its acc/*__NAME.npy)")
    ap.add_argument("--other", required=True)
    a = ap.parse_args()
    rows = paired_rows(load(a.rollouts, a.work, a.base), load(a.rollouts, a.work, a.other), np.random.default_rng(0))
    print("\n".join(table(f"{a.other} against {a.base}", a.base, a.other, rows)))


if __name__ == "__main__":
    main()
