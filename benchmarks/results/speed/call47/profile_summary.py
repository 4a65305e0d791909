"""Call 47's per-layer profiles at rollout A's shape (64 requests at 8K and 16K of context, one graph replay each,
dense and sparse servers on one H200) summed by part of the step, beside the byte roofline of that step
(``benchmarks/profile_parts.py``; Qwen3-1.7B, schedule qwen3-1.7b-0.86, bfloat16 landmarks).
    PYTHONPATH=. python benchmarks/results/speed/call47/profile_summary.py > benchmarks/results/speed/call47/profile_summary.md
"""
from __future__ import annotations

import sys
from pathlib import Path

from sparrow_server.cost.model_shape import MODEL_PRESETS
from sparrow_server.sparsity.registry import ScheduleRegistry

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # benchmarks/
import profile_parts  # noqa: E402

RUNS = {"sparrow": "2_sparse_half_profiles", "flashinfer": "3_dense_profiles_decode16"}
parts = profile_parts.parts


def replay(backend: str, context: int) -> dict:
    return profile_parts.replay(HERE / RUNS[backend] / f"profile_{context}_b64" / "decode_profile.json", backend,
                                context, 64)


def main() -> None:
    runs = {c: (replay("flashinfer", c), replay("sparrow", c)) for c in (8192, 16384)}
    print(profile_parts.table(runs, MODEL_PRESETS["qwen3-1.7b"], ScheduleRegistry().get("qwen3-1.7b-0.86"), 64), end="")


if __name__ == "__main__":
    main()
