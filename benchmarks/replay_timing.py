"""Decode graph replays timed by CUDA events, with and without the torch profiler, against the profiler's kernels.

The question (``results/speed/call44/replay_gaps.md``): the profiled sparse replay at 32K x 16 spends ~180 µs
between its kernels, the dense one ~60. Are those gaps on the GPU when nobody profiles? Each backend's server runs
as ``decode_profile.py`` runs it, with ``replay_timing_hook/sitecustomize.py`` timing every graph replay by CUDA
events; the report sets the replay of the batch's graph unprofiled and profiled beside the profiled replay's kernel
busy time and span (the trace), and the server's own step (its log). Unprofiled replay minus kernel busy time is
what the gaps cost when nothing profiles.

Usage (GPU host, kit installed): python benchmarks/replay_timing.py --out-dir $OUT [--context 32768 --batch 16]
``--from-dir DIR`` (any machine) rebuilds ``replay_timing.md`` from what a run saved in DIR.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay_gaps  # noqa: E402

HOOK_DIR = Path(__file__).resolve().parent / "replay_timing_hook"
# Unprofiled replays on either side of the profiled ones that the report sets beside them.
NEIGHBOURS = 20
COLUMNS = ("wall", "graph", "profiled", "gpu_us", "host_us", "since_prev_us")


def read_replays(folder: Path) -> list[dict]:
    """Every replay line the hook wrote under ``folder`` (one file per process)."""
    rows = []
    for path in sorted(folder.glob("replays-*.tsv")):
        for line in path.read_text().splitlines():
            vals = line.split("\t")
            if len(vals) == len(COLUMNS):
                rows.append({k: float(v) for k, v in zip(COLUMNS, vals)})
    return rows


def batch_graph(rows: list[dict]) -> float | None:
    """The graph the profiler saw: the one replayed most while it was on (the batch's, once every request decodes)."""
    ids = [r["graph"] for r in rows if r["profiled"]]
    return statistics.mode(ids) if ids else None


def summary(rows: list[dict], kernels: list[dict], step_us: float | None) -> dict:
    graph = batch_graph(rows)
    mine = [r for r in rows if r["graph"] == graph]
    off = [r for r in mine if not r["profiled"]]
    on = [r for r in mine if r["profiled"]]
    busy = sum(k["dur"] for k in kernels)
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"] if kernels else 0.0

    def med(rs, key):
        vals = [r[key] for r in rs if r[key] == r[key]]  # NaN: no earlier replay
        return round(statistics.median(vals), 1) if vals else None

    out = {"replays_unprofiled": len(off), "replays_profiled": len(on),
           "gpu_us_unprofiled": med(off, "gpu_us"), "gpu_us_profiled": med(on, "gpu_us"),
           "host_launch_us_unprofiled": med(off, "host_us"), "host_launch_us_profiled": med(on, "host_us"),
           "between_replays_us_unprofiled": med(off, "since_prev_us"),
           "trace_kernels": len(kernels), "trace_busy_us": round(busy, 1), "trace_span_us": round(span, 1),
           "served_step_us": round(step_us, 1) if step_us else None}
    if out["gpu_us_unprofiled"] is not None and kernels:
        out["unprofiled_minus_busy_us"] = round(out["gpu_us_unprofiled"] - busy, 1)
    if on:  # the replays at the profiled ones' context: the profiler pauses the card, which then clocks up
        first, last = mine.index(on[0]), mine.index(on[-1])
        before, after = mine[max(0, first - NEIGHBOURS):first], mine[last + 1:last + 1 + NEIGHBOURS]
        out["gpu_us_just_before_profile"], out["gpu_us_just_after_profile"] = med(before, "gpu_us"), med(after, "gpu_us")
        if before and kernels:
            out["just_before_minus_busy_us"] = round(out["gpu_us_just_before_profile"] - busy, 1)
    return out


def markdown(res: dict) -> str:
    keys = list(res["backends"][0]["timing"]) if res["backends"] else []
    lines = [f"# Decode graph replays by CUDA events: {res['size']}, {res['context']} x {res['batch']}\n",
             f"`{res['command']}`\n", "| | " + " | ".join(b["backend"] for b in res["backends"]) + " |",
             "|---|" + "---|" * len(res["backends"])]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(str(b["timing"].get(k)) for b in res["backends"]) + " |")
    return "\n".join(lines) + "\n"


def backend_timing(backend: str, out_dir: Path, batch: int) -> dict:
    kernels_path = out_dir / f"replay-kernels-{backend}.json"
    kernels = json.loads(kernels_path.read_text()) if kernels_path.exists() else []
    step = replay_gaps.served_step_us(out_dir / f"server-profile-{backend}.log", batch)
    return {"backend": backend, "timing": summary(read_replays(out_dir / f"replays-{backend}"), kernels, step)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="qwen3-1.7b")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--context-length", type=int, default=40960)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=1500, help="long enough for unprofiled replays after the profile")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--schedule-suffix", default="0.86")
    ap.add_argument("--backends", default="flashinfer,sparrow")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--from-dir", default=None, help="rebuild the report from a run's folder")
    args = ap.parse_args()
    out_dir = Path(args.from_dir or args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join(sys.argv), "size": args.size, "context": args.context, "batch": args.batch,
           "context_length": args.context_length, "backends": []}
    if not args.from_dir:
        import decode_profile
        from sparrow_server.sparsity.registry import ScheduleRegistry
        args.server_args = args.server_args.split()
        schedule = ScheduleRegistry().get(f"{args.size}-{args.schedule_suffix}")
        work_dir = Path(tempfile.mkdtemp(prefix="sparrow-replay-"))
        for backend in args.backends.split(","):
            env = {"SPARROW_REPLAY_TIMING_DIR": str(out_dir / f"replays-{backend}"),
                   "PYTHONPATH": os.pathsep.join(p for p in (str(HOOK_DIR), os.environ.get("PYTHONPATH")) if p)}
            try:
                decode_profile.profile_backend(backend, args.size, args, schedule, work_dir, out_dir, env)
            except Exception as e:  # keep the other backend's figures
                print(f"[{backend}] failed: {e!r}", flush=True)
    res["backends"] = [backend_timing(b, out_dir, args.batch) for b in args.backends.split(",")]
    (out_dir / "replay_timing.json").write_text(json.dumps(res, indent=1))
    (out_dir / "replay_timing.md").write_text(markdown(res))
    print(markdown(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
