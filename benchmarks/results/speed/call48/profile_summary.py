"""Call 48's per-layer profiles of Qwen3-4B at rollout A's first wave (48 requests at 8K and 16K of context, one
graph replay each, dense and sparse servers on one H200: 16K dense in call 1, sparse in call 2, both at 8K in call 4)
summed by part of the step, beside the byte roofline of that step (``benchmarks/profile_parts.py``; schedule
qwen3-4b-0.86, bfloat16 landmarks, the sparse layers' attention on FlashInfer's tensor-core decode).
    PYTHONPATH=. python benchmarks/results/speed/call48/profile_summary.py > benchmarks/results/speed/call48/profile_summary.md
"""
from __future__ import annotations

import sys
from pathlib import Path

from sparrow_server.cost.model_shape import MODEL_PRESETS
from sparrow_server.sparsity.registry import ScheduleRegistry

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # benchmarks/
import profile_parts  # noqa: E402

PROFILES = {
    (16384, "flashinfer"): "1_landmark_reads_4b_bench_dense_profile/profile_4b_dense_16k_b48",
    (16384, "sparrow"): "2_4b_sparse_half_profile/profile_4b_sparse_16k_b48",
    (8192, "flashinfer"): "4_4b_profiles_8k/profile_4b_8k_b48",
    (8192, "sparrow"): "4_4b_profiles_8k/profile_4b_8k_b48",
}
BATCH = 48
parts = profile_parts.parts


def replay(backend: str, context: int) -> dict:
    path = HERE / PROFILES[context, backend] / "decode_profile.json"
    return profile_parts.replay(path, backend, context, BATCH)


def main() -> None:
    runs = {c: (replay("flashinfer", c), replay("sparrow", c)) for c in (8192, 16384)}
    print(profile_parts.table(runs, MODEL_PRESETS["qwen3-4b"], ScheduleRegistry().get("qwen3-4b-0.86"), BATCH), end="")


if __name__ == "__main__":
    main()
