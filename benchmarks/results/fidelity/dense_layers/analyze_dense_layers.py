"""What keeping layers 0-1 dense buys in acceptance (issue 24's decode ceiling drops them): per 512-token bin of
total length, p5 of exact acceptance under a fixed budget with layers 0-1 dense and with every layer sparse, on
the same tokens (paired), with a 95 % interval of the difference from a bootstrap over rollouts
(``benchmarks/fidelity/paired_p5.py``).

    PYTHONPATH=. python benchmarks/results/fidelity/dense_layers/analyze_dense_layers.py \\
        --rollouts benchmarks/results/fidelity/long --work W --budgets 128,256 > .../dense_layers.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "fidelity"))
from paired_p5 import load, paired_rows, table  # noqa: E402  (benchmarks/fidelity is no package)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--budgets", default="128,256")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    for budget in (int(b) for b in a.budgets.split(",")):
        base, other = (load(a.rollouts, a.work, f"fixed-{budget}-{c}") for c in ("dense01", "nodense"))
        rows = paired_rows(base, other, rng)
        print("\n".join(table(f"{budget} tokens of KV per sparse layer", "layers 0-1 dense", "every layer sparse",
                              rows, means_label="dense / sparse")))


if __name__ == "__main__":
    main()
