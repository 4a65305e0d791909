"""Issue 25 item 1, CPU study, step 3: exact on a subsample of positions, alone or with every token's bounds.

For each (budget, 512-token bin) of ``tail_estimators.py``'s files, ``m`` positions are drawn without
replacement and the bin's p5 is estimated two ways:

- ``plain``: the p5 of the ``m`` exact values;
- ``hybrid``: the fraction of tokens with ``a <= x`` is counted exactly for tokens whose upper bound is
  ``<= x`` (known for every token from the top-K bounds), and estimated from the subsample only among
  tokens whose bounds straddle ``x`` (a Horvitz-Thompson estimate, unbiased for the CDF); the p5 is where
  that CDF first reaches 0.05 (``stats.tail.subsample_bounds_quantile``). Both use numpy's
  ``inverted_cdf`` quantile here (the estimate is a step function).

Prints, per budget and ``m``, the worst bin's 95% half-range of each estimate over ``--reps`` draws.

    PYTHONPATH=. python benchmarks/fidelity/tail_hybrid.py --work /tmp/tail-work --k 20
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sparrow_server.stats.tail import subsample_bounds_quantile

Q = 0.05


def hybrid_p5(a: np.ndarray, lo: np.ndarray, up: np.ndarray, kept: np.ndarray) -> float:
    """The p5 from every token's bounds plus exact values at ``kept`` (indices). [N] x3, [m] -> float."""
    return subsample_bounds_quantile(lo, up, kept, a[kept], Q)


def half_range(values: list[float]) -> float:
    low, high = np.quantile(values, [0.025, 0.975])
    return float(high - low) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--k", type=int, default=20, help="the two-list bounds' K")
    parser.add_argument("--bin-tokens", type=int, default=512)
    parser.add_argument("--m", default="256,512,1024")
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for budget in (128, 256):
        files = [np.load(p) for p in sorted(args.work.glob(f"*__fixed-{budget}.npz"))]
        if not files:
            continue
        names = ("exact", f"lo2_k{args.k}", f"up2_k{args.k}", "position")
        col = {k: np.concatenate([f[k] for f in files]) for k in names}
        bins = col["position"] // args.bin_tokens
        for m in (int(x) for x in args.m.split(",")):
            worst = {"plain": 0.0, "hybrid": 0.0}
            for b in np.unique(bins):
                sel = bins == b
                a, lo, up = col["exact"][sel], col[f"lo2_k{args.k}"][sel], col[f"up2_k{args.k}"][sel]
                draws = [rng.choice(a.size, m, replace=False) for _ in range(args.reps)]
                plain = [np.quantile(a[d], Q, method="inverted_cdf") for d in draws]
                worst["plain"] = max(worst["plain"], half_range(plain))
                worst["hybrid"] = max(worst["hybrid"], half_range([hybrid_p5(a, lo, up, d) for d in draws]))
            print(json.dumps({"budget": budget, "k": args.k, "m": m, "bin_tokens": int(sel.sum()),
                              "plain_half_range_95": round(worst["plain"], 4),
                              "hybrid_half_range_95": round(worst["hybrid"], 4)}), flush=True)


if __name__ == "__main__":
    main()
