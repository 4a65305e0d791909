"""Least-squares fit of the default's fused scoring time against the landmark bytes a launch reads, over call 28's
kernel-bench cases at batch 16 and 34 (every row in the fused launch). Run from the repository root:
python benchmarks/results/speed/call28/offline/scoring_fit.py"""
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[1]
points = [(c["bytes_landmarks"] / 1e6, c["variants"]["fused_packed_narrow"]["score_us"])
          for name in ("kb_b16.json", "kb_b34.json")
          for c in json.loads((HERE / "kernel_bench_row_loop" / name).read_text())["cases"]]
mb, us = np.array(points).T
(slope, fixed), *_ = np.linalg.lstsq(np.vstack([mb, np.ones_like(mb)]).T, us, rcond=None)
print(f"score_us = {fixed:.2f} + MB * {slope:.4f}  (stream {1 / slope:.2f} TB/s)")
for x, y in points:
    print(f"  {x:7.1f} MB: measured {y:5.1f} us, fit {fixed + slope * x:5.1f} us, off {y - fixed - slope * x:+.1f}")
