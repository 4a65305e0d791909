"""A decode graph's replays over a long decode beside the card's clocks and power: how much of the step's growth
is the context's and how much the clock's.

Reads what one ``replay_timing.py`` run saved (``replays-BACKEND/*.tsv``: each replay by CUDA events) and an
``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,... --format=csv -lms 250`` log
taken during it; prints per window of replays of the batch's graph the median replay, the context (the prompt plus
the replays before: every replay of that graph is one decode step of every request), the replay per 1,000 tokens
of context (flat where only the bytes grow), and the card's SM clock, power and temperature over the window; then
the card's samples around the profiled replays.

    python benchmarks/replay_clocks.py RUN_DIR SMI_CSV --backend flashinfer --context 32768 [--window 250]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay_timing  # noqa: E402


def read_smi(path: Path) -> list[dict]:
    """nvidia-smi's CSV: one dict a sample, ``t`` in epoch seconds (its local timestamps; the hosts run UTC)."""
    rows = list(csv.reader(path.open()))
    head = [h.strip().split(" [")[0] for h in rows[0]]
    out = []
    for r in rows[1:]:
        if len(r) != len(head):
            continue
        rec = dict(zip(head, (v.strip() for v in r)))
        rec["t"] = datetime.datetime.strptime(rec["timestamp"], "%Y/%m/%d %H:%M:%S.%f").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        out.append(rec)
    return out


def _number(text: str) -> float:
    return float(text.split()[0])


def windows(replays: list[dict], smi: list[dict], context: int, size: int) -> list[dict]:
    graph = replay_timing.batch_graph(replays)
    mine = [r for r in replays if r["graph"] == graph]
    out = []
    for start in range(0, len(mine) - size + 1, size):
        w = mine[start:start + size]
        samples = [s for s in smi if w[0]["wall"] <= s["t"] <= w[-1]["wall"]]
        replay_us = statistics.median(r["gpu_us"] for r in w)
        tokens = context + start + size // 2
        row = {"replays": f"{start}-{start + size - 1}", "replay_us": round(replay_us, 1), "context": tokens,
               "us_per_1k_tokens": round(replay_us / tokens * 1e3, 2), "samples": len(samples)}
        for key, name in (("clocks.current.sm", "sm_mhz"), ("power.draw", "power_w"),
                          ("temperature.gpu", "gpu_c"), ("temperature.memory", "memory_c")):
            vals = [_number(s[key]) for s in samples if key in s]
            row[name] = round(statistics.median(vals), 1) if vals else None
        out.append(row)
    return out


def around_profile(replays: list[dict], smi: list[dict], margin_s: float = 1.0) -> list[str]:
    """The card's samples from ``margin_s`` before the first profiled replay to ``margin_s`` after the last one."""
    on = [r["wall"] for r in replays if r["profiled"]]
    if not on:
        return []
    return [f"{s['t'] - on[0]:+.2f} s: {s['clocks.current.sm']}, {s['power.draw']}" for s in smi
            if on[0] - margin_s <= s["t"] <= on[-1] + margin_s]


def markdown(rows: list[dict]) -> str:
    keys = list(rows[0]) if rows else []
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
                     + ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("smi_csv", type=Path)
    ap.add_argument("--backend", default="flashinfer")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--window", type=int, default=250)
    args = ap.parse_args(argv)
    replays = replay_timing.read_replays(args.run_dir / f"replays-{args.backend}")
    smi = read_smi(args.smi_csv)
    print(markdown(windows(replays, smi, args.context, args.window)), end="")
    print("\nThe card around the profiled replays (seconds from the first one; SM clock, power):\n")
    print("".join(f"- {line}\n" for line in around_profile(replays, smi)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
