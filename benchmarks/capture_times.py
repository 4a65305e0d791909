"""Where a server's decode CUDA-graph capture spends its start-up: seconds per captured batch size, read from the
progress lines SGLang logs while it captures (``Capturing batches (bs=N ...) | k/K [mm:ss<...]``, one-second
resolution) and its ``Capture target decode CUDA graph end. elapsed=`` line. The sparse server compiles its Triton
kernels at the first capture that launches them, so its compile pauses show as the batch sizes that take seconds.

    python benchmarks/capture_times.py SERVER_LOG [SERVER_LOG ...] [--min-s 2]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

BEGIN = re.compile(r"Capture target decode CUDA graph begin\..*?bs=\[([\d, ]+)\]")
END = re.compile(r"Capture target decode CUDA graph end\. elapsed=([\d.]+) s")
PROGRESS = re.compile(r"Capturing batches \(bs=\d+[^)]*\):\s+\d+%\|[^|]*\|\s*(\d+)/(\d+) \[(\d+):(\d+)<")


def capture_steps(text: str) -> tuple[list[tuple[list[int], int]], float | None]:
    """([(batch sizes, whole seconds their capture took)] in capture order, the logged total) of a log's first
    capture. The progress bar skips counts when captures are fast, so a step may hold several batch sizes."""
    begin = BEGIN.search(text)
    if begin is None:
        return [], None
    order = sorted((int(b) for b in begin.group(1).split(",")), reverse=True)  # SGLang captures the largest first
    done_at = {0: 0}
    for m in PROGRESS.finditer(text.replace("\r", "\n"), begin.end()):
        done_at.setdefault(int(m.group(1)), int(m.group(3)) * 60 + int(m.group(4)))
    end = END.search(text, begin.end())
    counts = sorted(done_at)
    steps = [(order[a:b], done_at[b] - done_at[a]) for a, b in zip(counts, counts[1:])]
    return steps, float(end.group(1)) if end else None


def report(path: Path, min_s: int) -> list[str]:
    steps, total = capture_steps(path.read_text(errors="replace"))
    slow = [f"bs {'/'.join(map(str, sizes))}: {secs} s" for sizes, secs in steps if secs >= min_s]
    return [f"- `{path}`: {sum(len(sizes) for sizes, _ in steps)} batch sizes, {total} s in all; those of {min_s} s "
            "or more: " + (", ".join(slow) if slow else "none")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--min-s", type=int, default=2, help="list the batch sizes whose capture took this long or more")
    args = ap.parse_args(argv)
    print("\n".join(line for log in args.logs for line in report(log, args.min_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
