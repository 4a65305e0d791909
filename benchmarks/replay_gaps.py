"""Idle time between the kernels of one decode graph replay, per layer, from ``decode_profile.py``'s saved
``replay-kernels-BACKEND.json``: where in the replay the gaps are, and whether the same kernels run longer early
in it (a clock effect) or only start later (the launch path).

    python benchmarks/replay_gaps.py DIR [DIR ...] [--batch 16]   # folders holding replay-kernels-*.json
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

# SGLang's decode log line (as sglang_throughput.DEC_RE): running requests, output tokens/s since the previous line
DECODE_LINE = re.compile(r"Decode batch.*?#running-req: (\d+).*?gen throughput \(token/s\): ([\d.]+)")

# Layers are split at each attention kernel: ``decode_profile.ATTN_RE``'s decode kernel (not its merge).
ATTENTION = "BatchDecodeWithPagedKVCache"
# Kernels every layer of both backends runs, timed early and late in the replay.
SAME_KERNELS = ("act_and_mul", "FusedAddRMSNorm", "nvjet_sm90_tst_128x16_64x11", "fused_rope")


def gaps(kernels: list[dict]) -> list[float]:
    """µs between each kernel's end and the next one's start (negative: they overlap)."""
    return [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(kernels, kernels[1:])]


def layer_gaps(kernels: list[dict]) -> list[tuple[float, float]]:
    """(µs into the replay, µs of gaps) from each attention kernel up to the next one's start."""
    at = [i for i, k in enumerate(kernels) if ATTENTION in k["name"]]
    between = gaps(kernels)
    t0 = kernels[0]["ts"]
    return [(kernels[a]["ts"] - t0, sum(between[a:b])) for a, b in zip(at, at[1:])]


def early_late(kernels: list[dict], split_us: float) -> dict[str, tuple[float, float]]:
    """Median duration of each of SAME_KERNELS before and after ``split_us`` into the replay."""
    t0, out = kernels[0]["ts"], {}
    for name in SAME_KERNELS:
        durs = [(k["ts"] - t0, k["dur"]) for k in kernels if name in k["name"]]
        early, late = [d for t, d in durs if t < split_us], [d for t, d in durs if t >= split_us]
        if early and late:
            out[name] = (statistics.median(early), statistics.median(late))
    return out


def served_step_us(log: Path, batch: int) -> float | None:
    """The server's own decode step at ``batch`` running requests: ``batch`` over its log's median tokens/s."""
    rates = [float(m.group(2)) for m in DECODE_LINE.finditer(log.read_text(errors="replace"))
             if int(m.group(1)) == batch]
    return batch / statistics.median(rates) * 1e6 if rates else None


def report(path: Path, batch: int) -> list[str]:
    kernels = json.loads(path.read_text())
    per_layer = layer_gaps(kernels)
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    half = span / 2
    lines = [f"## {path}", "", f"{len(kernels)} kernels, span {span:.1f} µs, gaps {sum(gaps(kernels)):.1f} µs", "",
             "| layer | µs into the replay | gaps µs |", "|---|---|---|"]
    lines += [f"| {i} | {t:.0f} | {g:.2f} |" for i, (t, g) in enumerate(per_layer)]
    lines += ["", f"Median kernel µs before / after {half:.0f} µs into the replay:", ""]
    lines += [f"- `{name}`: {a:.2f} / {b:.2f}" for name, (a, b) in early_late(kernels, half).items()]
    log = path.with_name(path.name.replace("replay-kernels-", "server-profile-").replace(".json", ".log"))
    step = served_step_us(log, batch) if log.exists() else None
    if step is not None:
        lines += ["", f"The server's step at {batch} running requests (`{log.name}`, median of its log lines): "
                      f"{step:.0f} µs, the replay's span {span:.0f} µs."]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--batch", type=int, default=16, help="the profiled decode batch (the server log's lines)")
    args = ap.parse_args(argv)
    for folder in args.dirs:
        for path in sorted(folder.glob("replay-kernels-*.json")):
            print("\n".join(report(path, args.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
