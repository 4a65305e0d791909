"""One graph replay of ``decode_profile.py`` summed by part of the decode step, beside the step's byte roofline
(``sparrow_server.cost.roofline.roofline_bytes``): the table a call's ``profile_summary.py`` prints.

The parts: the schedule's dense layers (the first two in every preset, dense in both servers), the attention,
selection and other kernels of the remaining layers, the tail (LM head, sampling) and the gaps between kernels; they
add up to the replay's span.
"""
from __future__ import annotations

import json
from pathlib import Path

DENSE_FIRST = 2  # layers 0-1: dense in every preset schedule, so in both servers


def replay(path: Path, backend: str, context: int, batch: int) -> dict:
    """``backend``'s replay in a ``decode_profile.json``, which must be of ``batch`` requests at ``context``."""
    d = json.loads(Path(path).read_text())
    assert (d["context"], d["batch"]) == (context, batch), f"{path}: {d['batch']} x {d['context']}"
    return next(b for b in d["backends"] if b["backend"] == backend)


def parts(r: dict) -> dict:
    """µs of one replay by part, and the bandwidths of the later layers' attention and selection."""
    seg = {s["segment"]: s for s in r["segments"]}
    layers = [s for k, s in seg.items() if isinstance(k, int) and k >= DENSE_FIRST]
    n = len(layers)
    selection_us = sum(s["us_selection"] for s in layers)
    return {"span": r["replay_span_us"], "layers 0-1": sum(seg[i]["us_total"] for i in range(DENSE_FIRST)),
            f"attention ({n})": sum(s["us_attention"] for s in layers), f"selection ({n})": selection_us,
            f"other ({n})": sum(s["us_other"] for s in layers), "tail": seg["tail"]["us_total"], "gaps": r["gaps_us"],
            "attn TB/s": sum(s["attn_bytes"] for s in layers) / sum(s["us_attention"] for s in layers) / 1e6,
            "select TB/s": sum(s["landmark_bytes"] for s in layers) / max(selection_us, 1) / 1e6}


def table(runs: dict, shape, schedule, batch: int) -> str:
    """Markdown rows of every context in ``runs`` ({context: (dense replay, sparse replay)}), ending in the replay
    ratio beside ``shape``'s byte roofline under ``schedule``."""
    from sparrow_server.cost.roofline import roofline_bytes

    lines = [f"| {batch} requests at | part of one graph replay | dense µs | sparse µs |", "| --- | --- | --- | --- |"]
    for context, (dense_replay, sparse_replay) in runs.items():
        dense, sparse = parts(dense_replay), parts(sparse_replay)
        for key in dense:
            fmt = "{:.2f}" if "TB/s" in key else "{:,.1f}"
            lines.append(f"| {context} | {key} | {fmt.format(dense[key])} | {fmt.format(sparse[key])} |")
        ratio = dense["span"] / sparse["span"]
        roof = roofline_bytes(shape, schedule, context, batch=batch).ratio
        lines.append(f"| {context} | replay ratio dense / sparse (byte roofline) | {ratio:.3f} | ({roof:.3f}) |")
    return "\n".join(lines) + "\n"
