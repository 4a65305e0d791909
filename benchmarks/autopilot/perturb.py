"""Write a perturbed copy of a checkpoint for the autopilot's weight-update run: every sparse layer's
query projection scaled by ``--q-scale`` (< 1 flattens attention, so a page budget keeps less of its
mass and the tail acceptance of a sparse schedule drops; the model stays the same architecture).

    PYTHONPATH=. python benchmarks/autopilot/perturb.py --model DIR --out DIR --q-scale 0.6
"""
from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

DENSE_LAYERS = (0, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--q-scale", type=float, default=0.6)
    args = p.parse_args()
    src, out = Path(args.model), Path(args.out)
    shutil.copytree(src, out, dirs_exist_ok=True)
    tensors = load_file(src / "model.safetensors")
    scaled = 0
    for name, tensor in tensors.items():
        m = re.search(r"layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)$", name)
        if m and int(m.group(1)) not in DENSE_LAYERS:
            tensors[name] = tensor * args.q_scale
            scaled += 1
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    print(f"scaled {scaled} q_proj tensors by {args.q_scale}: {out}")


if __name__ == "__main__":
    main()
