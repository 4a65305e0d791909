"""Call 47's per-layer profiles at rollout A's shape (64 requests at 8K and 16K of context, one graph replay each,
dense and sparse servers on one H200) summed by part of the step, beside the byte roofline of that step
(``sparrow_server.cost.roofline.roofline_bytes``, Qwen3-1.7B, schedule qwen3-1.7b-0.86, bfloat16 landmarks).
    PYTHONPATH=. python benchmarks/results/speed/call47/profile_summary.py > benchmarks/results/speed/call47/profile_summary.md
"""
from __future__ import annotations

import json
from pathlib import Path

from sparrow_server.cost.model_shape import MODEL_PRESETS
from sparrow_server.cost.roofline import roofline_bytes
from sparrow_server.sparsity.registry import ScheduleRegistry

HERE = Path(__file__).resolve().parent
RUNS = {"sparrow": "2_sparse_half_profiles", "flashinfer": "3_dense_profiles_decode16"}


def replay(backend: str, context: int) -> dict:
    d = json.loads((HERE / RUNS[backend] / f"profile_{context}_b64" / "decode_profile.json").read_text())
    assert d["context"] == context and d["batch"] == 64
    return next(b for b in d["backends"] if b["backend"] == backend)


def parts(r: dict) -> dict:
    """µs of one replay: its two first layers (dense in both servers), the other 26 by class, the tail, the gaps."""
    seg = {s["segment"]: s for s in r["segments"]}
    layers = [s for k, s in seg.items() if isinstance(k, int) and k >= 2]
    return {"span": r["replay_span_us"], "layers 0-1": seg[0]["us_total"] + seg[1]["us_total"],
            "attention (26)": sum(s["us_attention"] for s in layers),
            "selection (26)": sum(s["us_selection"] for s in layers),
            "other (26)": sum(s["us_other"] for s in layers), "tail": seg["tail"]["us_total"], "gaps": r["gaps_us"],
            "attn TB/s": sum(s["attn_bytes"] for s in layers) / sum(s["us_attention"] for s in layers) / 1e6,
            "select TB/s": (sum(s["landmark_bytes"] for s in layers) / max(sum(s["us_selection"] for s in layers), 1)
                            / 1e6)}


def main() -> None:
    shape, schedule = MODEL_PRESETS["qwen3-1.7b"], ScheduleRegistry().get("qwen3-1.7b-0.86")
    print("| 64 requests at | part of one graph replay | dense µs | sparse µs |\n| --- | --- | --- | --- |")
    for context in (8192, 16384):
        dense, sparse = parts(replay("flashinfer", context)), parts(replay("sparrow", context))
        for key in dense:
            fmt = "{:.2f}" if "TB/s" in key else "{:,.1f}"
            print(f"| {context} | {key} | {fmt.format(dense[key])} | {fmt.format(sparse[key])} |")
        ratio = dense["span"] / sparse["span"]
        roof = roofline_bytes(shape, schedule, context, batch=64).ratio
        print(f"| {context} | replay ratio dense / sparse (byte roofline) | {ratio:.3f} | ({roof:.3f}) |")


if __name__ == "__main__":
    main()
