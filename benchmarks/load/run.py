"""Run the loopback load test and write its figures.

    python benchmarks/load/run.py --clients 64 --duration-s 60 --out benchmarks/results/load

writes ``load.json`` and ``load.md`` (``--out`` is the path without suffix). Exit status 1 when
any request failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import (  # noqa: E402
    DEFAULT_CLIENTS,
    DEFAULT_DURATION_S,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_WARMUP_S,
    LoadResult,
    load_test,
)


def markdown(result: LoadResult, command: str, server_command: str) -> str:
    r = result
    rows = [
        ("concurrent streaming clients", f"{r.clients}"),
        ("measured duration", f"{r.duration_s:.1f} s (after warm-up)"),
        ("requests completed", f"{r.requests}"),
        ("errors", f"{r.errors}"),
        ("requests/s", f"{r.requests_per_s:.2f}"),
        ("generated tokens/s", f"{r.tokens_per_s:.1f}"),
        ("latency p50 / p99", f"{r.latency_p50_s * 1000:.0f} ms / {r.latency_p99_s * 1000:.0f} ms"),
        ("time to first token p50 / p99", f"{r.ttft_p50_s * 1000:.0f} ms / {r.ttft_p99_s * 1000:.0f} ms"),
        ("server RSS start -> end (max)", f"{r.rss_start_mib:.1f} -> {r.rss_end_mib:.1f} MiB ({r.rss_max_mib:.1f})"),
        ("server RSS growth", f"{r.rss_growth_mib:+.1f} MiB"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    cpu = os.cpu_count()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    before, after = getattr(r, "host_load", ((float("nan"),) * 3,) * 2)
    return f"""# Loopback load test

{when}, {platform.machine()}, {cpu} CPU cores shared by the server, the load generator and
whatever else ran on the machine (1-minute load average {before[0]:.1f} before the run,
{after[0]:.1f} after: other work was running, so the rates are a floor, not this code's ceiling);
Python {platform.python_version()}, commit {commit()}.

Command:

    {command}

Server (started by the command; a tiny random Llama, 4 layers, hidden 64, vocab 128, reference engine):

    {server_command}

Each client loops: `POST /rollout` with `stream: true` (SSE), a random 16-64 token prompt,
`max_new_tokens` {DEFAULT_MAX_NEW_TOKENS if "--max-new-tokens" not in command else "as given"}, `ignore_eos`, temperature 1; reads every event to `done`.
An error is a non-200 answer, an `error` event, a stream without a final event or a transport error.

| figure | value |
| --- | --- |
{table}
"""


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()
        return out.stdout.strip() + (" with uncommitted changes in the tree" if dirty else "")
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=DEFAULT_CLIENTS)
    p.add_argument("--duration-s", type=float, default=DEFAULT_DURATION_S)
    p.add_argument("--warmup-s", type=float, default=DEFAULT_WARMUP_S)
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--model", type=Path, default=None, help="model directory (default: a tiny random Llama)")
    p.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    result, server_command = load_test(args.clients, args.duration_s, args.warmup_s, args.max_new_tokens, args.model)
    result.host_load = (load_before, os.getloadavg())
    command = "python " + " ".join(shlex.quote(a) for a in [str(Path(sys.argv[0])), *sys.argv[1:]]) if argv is None else ""
    print(json.dumps(result.to_dict(), indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(result, command, server_command))
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main())
