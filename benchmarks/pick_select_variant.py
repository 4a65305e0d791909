"""Pick a selection variant from ``sparse_kernel_bench.py`` results: the one with the least total selection
time (score + top-k + index write, summed over the cases) in the first file, among the variants that ran
without error, wrote the default variant's pages, and are at most ``--slack`` slower than the default in
every case of the other files. Prints its name (the default if none beats it); the table goes to stderr.

Usage: python benchmarks/pick_select_variant.py kb_b64.json [kb_b16.json ...] [--slack 0.02]
  (a server then runs it with SPARROW_SELECT_VARIANT=$(python benchmarks/pick_select_variant.py ...))
"""
from __future__ import annotations

import argparse
import json
import sys


def selection_us(result: dict) -> dict[str, list[float | None]]:
    """Per variant, its selection time in each case (None where it failed or selected other pages)."""
    names = {v for case in result["cases"] for v in case["variants"]}
    def one(case, v):
        r = case["variants"].get(v, {})
        return r["selection_us"] if "error" not in r and r.get("same_indices") else None
    return {v: [one(case, v) for case in result["cases"]] for v in names}


def pick(results: list[dict], slack: float) -> tuple[str, dict[str, float]]:
    """The winning variant, and each candidate's total selection time in the first result."""
    default = results[0]["default_variant"]
    first = selection_us(results[0])
    totals = {v: sum(t) for v, t in first.items() if None not in t}
    for other in results[1:]:
        times = selection_us(other)
        base = times.get(default)
        for v in list(totals):
            mine = times.get(v)
            if v == default or base is None or mine is None:
                continue  # a variant the other file did not time is judged by the first alone
            if None in mine or any(m > b * (1 + slack) for m, b in zip(mine, base) if b is not None):
                totals.pop(v)
    best = min(totals, key=totals.get) if totals else default
    return (best if totals.get(best, float("inf")) < totals.get(default, float("inf")) else default), totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="sparse_kernel_bench.py JSON files, the deciding one first")
    ap.add_argument("--slack", type=float, default=0.02, help="how much slower than the default a variant may "
                                                               "be in any case of the other files")
    a = ap.parse_args()
    results = [json.load(open(p)) for p in a.results]
    best, totals = pick(results, a.slack)
    for v, t in sorted(totals.items(), key=lambda kv: kv[1]):
        print(f"{v:>12} {t:9.1f} us summed over {a.results[0]}'s cases", file=sys.stderr)
    print(best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
