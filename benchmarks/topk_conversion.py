"""How long the frontend takes to turn one rollout's top-k lists into tensors (issue 25's verify cost).

Times, on this machine's CPU, ``monitor.verifier.topk_tensors`` (one array conversion, since ``c7b819f``)
against the element-at-a-time loop it replaced, on ``--tokens`` x ``--k`` random (logprob, id) entries, and
checks that both give the same tensors. Prints one JSON object.

    python benchmarks/topk_conversion.py [--tokens 4096] [--k 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def element_at_a_time(rows):
    """The conversion before ``c7b819f`` (``topk_from_chunks``), kept here as the baseline."""
    import torch

    k = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), k), -1, dtype=torch.long)
    lps = torch.full((len(rows), k), float("-inf"), dtype=torch.float64)
    for row, entries in enumerate(rows):
        for col, (lp, tid) in enumerate(entries):
            ids[row, col], lps[row, col] = int(tid), float(lp)
    return ids, lps


def best_of(fn, rows, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(rows)
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    import torch

    from sparrow_server.monitor.verifier import topk_tensors

    rng = random.Random(0)
    rows = [[(-rng.random() * 10, rng.randrange(a.vocab)) for _ in range(a.k)] for _ in range(a.tokens)]
    old_s, old = best_of(element_at_a_time, rows, a.repeats)
    new_s, new = best_of(topk_tensors, rows, a.repeats)
    same = all(torch.equal(x, y) for x, y in zip(old, new))
    print(json.dumps({"tokens": a.tokens, "k": a.k, "element_at_a_time_s": round(old_s, 4),
                      "array_conversion_s": round(new_s, 4), "same_tensors": same, "torch_threads": torch.get_num_threads()}))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
