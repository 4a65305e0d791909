"""Re-analysis of this folder's ``live_tail_tokens.npz`` (GPU run of 2026-11-26, code 01ce3e9) under the rule
of 669a381: a kept position whose step attended every page scores 1 (the server had measured the decode
and verify kernels' bf16 difference there). Point p5 per 512-token bin, live vs the float32 oracle:

    PYTHONPATH=. python benchmarks/results/fidelity/live_tail_gpu/rescore_dense_steps.py > .../rescore.txt

Measured data re-read, not a new measurement: the next GPU run of ``host.sh 7`` checks the served values."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from sparrow_server.sparsity.schedule import is_sparse_at, schedule_from_dict

HERE = Path(__file__).resolve().parent


def rescore(folder: Path = HERE) -> dict[str, list[dict]]:
    tokens = np.load(folder / "live_tail_tokens.npz")
    meta = json.loads((folder / "live_tail.json").read_text())
    out = {}
    for arm_index, arm in enumerate(("check", "floor")):
        sched = schedule_from_dict(meta["schedules"][arm])
        sel = tokens["arm"] == arm_index
        basis, position, kept = tokens["basis"][sel], tokens["position"][sel], tokens["kept"][sel]
        server, oracle = tokens["server"][sel].astype(float), tokens["oracle"][sel].astype(float)
        dense = np.array([not is_sparse_at(sched, int(n), int(n - g)) for n, g in zip(basis, position)])
        rescored = np.where(dense, 1.0, server)
        rows = []
        for lo in range(0, int(basis.max()) + 1, meta["config"]["bin_tokens"]):
            in_bin = (basis >= lo) & (basis < lo + meta["config"]["bin_tokens"])
            k = in_bin & kept & ~np.isnan(server)
            if k.any():
                rows.append({"bin_from": lo, "kept": int(k.sum()), "dense_kept": int((k & dense).sum()),
                             "live_measured": float(np.quantile(server[k], 0.05)),
                             "live_rule": float(np.quantile(rescored[k], 0.05)),
                             "oracle": float(np.quantile(oracle[in_bin], 0.05))})
        out[f"{arm} ({sched.name})"] = rows
    return out


def main() -> int:
    for arm, rows in rescore().items():
        print(f"{arm}\nbin from | kept (dense steps) | live p5 measured | live p5, dense steps = 1 | oracle p5 | diff")
        for r in rows:
            print(f"{r['bin_from']} | {r['kept']} ({r['dense_kept']}) | {r['live_measured']:.3f} | {r['live_rule']:.3f} "
                  f"| {r['oracle']:.3f} | {r['live_rule'] - r['oracle']:+.3f}")
        print(f"max |diff| with the rule: {max(abs(r['live_rule'] - r['oracle']) for r in rows):.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
