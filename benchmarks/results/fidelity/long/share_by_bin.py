"""Share of tokens with acceptance >= 0.99 per length bin (fixed budgets), for the longer-sequence run.

    PYTHONPATH=. python benchmarks/results/fidelity/long/share_by_bin.py /tmp/fid-long /tmp/fid-work-long \
        benchmarks/results/fidelity/long/share_by_bin.json
Bins as in analyze.py (256 tokens of total length, the last one open-ended).
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, "benchmarks/fidelity")
from analyze import load, pooled, usable_bins  # noqa: E402

R, W, OUT = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
BT = 256
rollouts = load(R)
NB = usable_bins(rollouts, BT)
out = {"bin_tokens": BT, "threshold": 0.99, "share_ge_0.99_by_bin": {}}
for c in ("fixed-128", "fixed-256"):
    acc, lengths = pooled(W, rollouts, c)
    idx = np.minimum(lengths // BT, NB - 1)
    out["share_ge_0.99_by_bin"][c] = [{"bin": int(b), "tokens": int((idx == b).sum()),
                                       "share": round(float(np.mean(acc[idx == b] >= 0.99)), 4)} for b in range(NB)]
OUT.write_text(json.dumps(out, indent=2) + "\n")
print(json.dumps(out))
