"""Issue 25 item 1: how far the live p5 of the exact subsample lands from the p5 of every position, per bin.

On SGLang the verifier computes exact acceptance at one generated position per block of ``s``
(``stats.exact_subsample``); the live monitor reports, per length bin, the p5 of those values
(``sparrow_acceptance_p5``). The issue's check compares it with the p5 of the float32 oracle's exact
acceptance at *every* position of the same rollouts. With the oracle's values fixed, the only randomness
is which positions are kept. This script measures that sampling error from committed per-token data:
the float32 oracle's exact acceptance of every token of the H200 8K cross-engine run
(``benchmarks/results/gpu_call16/cross_engine_data.tar.xz``, ``xe/cross_engine.tokens.npz``: SmolLM2-135M
served by ``serve --engine sglang``, 4 prompts x fixed budgets 256 / 512 / 1024, 8,160 tokens each).

For each budget, bin width, design, stride ``s`` and number ``N`` of verified rollouts per bin, ``--reps``
replicates draw ``N`` rollouts with replacement from the budget's 4 (bootstrap over rollouts) and, for
each copy, its kept positions from the product's code: ``choose_kept_positions(s)`` (jittered, one
position per block of ``s``) or ``KeptPositions(offset, s)`` with a uniform offset (the fixed pattern the
server used before). Per bin: ``d`` = p5 of the kept values - p5 of all values of the same copies (numpy
``linear``, as ``RollingQuantile``), and whether the 95% interval the monitor now publishes beside p5
(``stats.tail.quantile_interval`` of the kept values) covers the all-positions p5. A copy drawn twice
keeps its own positions: for a fixed level the CDF error per copy has the same variance as for a
distinct rollout, so the duplicates do not shrink the error.

Writes ``summary.json``, ``tables.md``, ``error_vs_rollouts.png``, ``error_vs_kept_tokens.png`` and
``loops.json`` (per rollout and 512-token bin: the share of tokens equal to the token two back, and the p5 of
the even and of the odd positions) into --out (``--from-summary`` rewrites all but the summary).

    PYTHONPATH=. python benchmarks/fidelity/live_tail_sampling.py --out benchmarks/results/fidelity/live_tail
"""
from __future__ import annotations

import argparse
import io
import json
import random
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sparrow_server.stats.exact_subsample import KeptPositions, choose_kept_positions
from sparrow_server.stats.tail import quantile_order_interval

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "results" / "gpu_call16" / "cross_engine_data.tar.xz"
SCHEDULES = ("xe-fixed-256", "xe-fixed-512", "xe-fixed-1024")
DESIGNS = ("jittered", "fixed")
Q = 0.05
TOL = 0.02  # the band
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Rollout:
    values: np.ndarray  # [n] float64: the oracle's exact acceptance of generated position g
    basis: np.ndarray  # [n] int64: prompt + g (the schedules' "total" length basis, as the monitor bins)
    tokens: np.ndarray  # [n] int64: the completion's token ids


def load(path: Path) -> dict[str, list[Rollout]]:
    """Per schedule, its rollouts (in the order ``cross_engine.score`` numbered them)."""
    with tarfile.open(path) as tar:
        arrays = np.load(io.BytesIO(tar.extractfile("xe/cross_engine.tokens.npz").read()))
        rows = [json.loads(line) for line in tar.extractfile("xe/rollouts-graphs.jsonl").read().decode().splitlines()
                if line.strip()]
    out = {}
    for name in SCHEDULES:
        exact, basis, rollout = (arrays[f"{name}/{k}"] for k in ("exact", "length", "rollout"))
        rows_here = [r for r in rows if r["schedule"]["name"] == name]
        out[name] = []
        for r, row in enumerate(rows_here):
            m = rollout == r
            tokens = np.asarray(row["completion_ids"], dtype=np.int64)
            if tokens.size != m.sum() or basis[m][0] != len(row["prompt_ids"]):
                raise ValueError(f"{name} rollout {r}: the token arrays and the rollouts file do not line up")
            out[name].append(Rollout(exact[m].astype(np.float64), basis[m].astype(np.int64), tokens))
    return out


class Bin:
    """One length bin's tokens over all rollouts of a schedule, sorted by value once."""

    def __init__(self, rollouts: list[Rollout], index: int, width: int):
        parts = [(r, np.flatnonzero(ro.basis // width == index)) for r, ro in enumerate(rollouts)]
        values = np.concatenate([rollouts[r].values[g] for r, g in parts])
        owner = np.concatenate([np.full(g.size, r) for r, g in parts])
        position = np.concatenate([g for _, g in parts])
        order = np.argsort(values, kind="stable")
        self.index, self.width = index, width
        self.values, self.owner = values[order], owner[order]
        starts = np.cumsum([0] + [r.values.size for r in rollouts[:-1]])
        self.flat = starts[self.owner] + position[order]  # index into the rollouts' tokens laid end to end
        self.per_rollout = [int(g.size) for _, g in parts]

    def p5(self, weights: np.ndarray) -> float:
        return weighted_quantile(self.values, weights, Q)


def weighted_quantile(sorted_values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """``np.quantile(np.repeat(sorted_values, weights), q)`` (``linear``) without the repeat. NaN if empty."""
    cum = np.cumsum(weights)
    n = int(cum[-1]) if cum.size else 0
    if n == 0:
        return float("nan")
    h = (n - 1) * q
    lo = int(np.floor(h))
    a = sorted_values[np.searchsorted(cum, lo, side="right")]
    b = sorted_values[np.searchsorted(cum, min(lo + 1, n - 1), side="right")]
    return float(a + (h - lo) * (b - a))


def order_stat(sorted_values: np.ndarray, weights: np.ndarray, k: int, below: float, above: float) -> float:
    """The ``k``-th (0-based) of the repeated values; ``below`` for k < 0, ``above`` for k >= n."""
    cum = np.cumsum(weights)
    if k < 0:
        return below
    if k >= cum[-1]:
        return above
    return float(sorted_values[np.searchsorted(cum, k, side="right")])


def kept_designs(design: str, stride: int, n: int, rng: random.Random) -> np.ndarray:
    if design == "jittered":
        return choose_kept_positions(stride, rng).positions(n)
    return KeptPositions(rng.randrange(stride), stride).positions(n)


def simulate(rollouts: list[Rollout], widths: list[int], design: str, stride: int, n_rollouts: int, reps: int,
             seed: int) -> dict[int, dict]:
    """Per bin width: per bin the error distribution of the live p5 and the interval's coverage."""
    rng, nprng = random.Random(seed), np.random.default_rng(seed)
    bins = {w: [Bin(rollouts, b, w) for b in range(int(max(r.basis.max() for r in rollouts)) // w + 1)] for w in widths}
    d = {w: np.empty((reps, len(bins[w]))) for w in widths}
    cover = {w: np.empty((reps, len(bins[w])), dtype=bool) for w in widths}
    width_ci = {w: np.empty((reps, len(bins[w]))) for w in widths}
    for rep in range(reps):
        copies = nprng.multinomial(n_rollouts, [1 / len(rollouts)] * len(rollouts))
        kept = [np.zeros(r.values.size, dtype=np.int64) for r in rollouts]
        for r, c in enumerate(copies):
            for _ in range(c):
                kept[r][kept_designs(design, stride, rollouts[r].values.size, rng)] += 1
        flat = np.concatenate(kept)
        for w in widths:
            for j, b in enumerate(bins[w]):
                every, here = copies[b.owner], flat[b.flat]
                truth, live = b.p5(every), b.p5(here)
                if rep == 0:  # the weighted quantile is numpy's on the repeated values
                    assert abs(live - np.quantile(np.repeat(b.values, here), Q)) < 1e-12
                    assert abs(truth - np.quantile(np.repeat(b.values, every), Q)) < 1e-12
                lo, hi = quantile_order_interval(int(here.sum()), Q, CONFIDENCE)
                low, high = order_stat(b.values, here, lo, 0.0, 1.0), order_stat(b.values, here, hi, 0.0, 1.0)
                d[w][rep, j], cover[w][rep, j], width_ci[w][rep, j] = live - truth, low <= truth <= high, high - low
    out = {}
    for w in widths:
        err = np.abs(d[w])
        per_bin = [{"bin": b.index, "from": b.index * w, "tokens_per_rollout": b.per_rollout,
                    "p5_all_rollouts": b.p5(np.ones(b.values.size, dtype=np.int64)),
                    "q95_abs_error": float(np.quantile(err[:, j], 0.95)), "mean_error": float(d[w][:, j].mean()),
                    "p_within": float((err[:, j] <= TOL).mean()), "ci_coverage": float(cover[w][:, j].mean()),
                    "ci_width_mean": float(width_ci[w][:, j].mean())} for j, b in enumerate(bins[w])]
        out[w] = {"bins": per_bin, "worst_q95_abs_error": max(b["q95_abs_error"] for b in per_bin),
                  "min_p_within": min(b["p_within"] for b in per_bin),
                  "p_all_within": float((err.max(axis=1) <= TOL).mean()),
                  "min_ci_coverage": min(b["ci_coverage"] for b in per_bin),
                  "ci_width_mean": float(width_ci[w].mean())}
    return out


def loops(data: dict[str, list[Rollout]], width: int) -> dict:
    """Per rollout and bin: the share of tokens equal to the token two back (a two-token loop), and the p5 of the
    bin's even and of its odd generated positions. A fixed pattern with an even stride sees one parity only, so
    where the two differ its p5 is off by about the gap, however many rollouts are pooled."""
    out = {}
    for name, rollouts in data.items():
        out[name] = []
        for ro in rollouts:
            g = np.arange(ro.values.size)
            rows = []
            for b in range(int(ro.basis.max()) // width + 1):
                m = ro.basis // width == b
                idx = np.flatnonzero(m)
                idx2 = idx[idx >= 2]
                repeat2 = float((ro.tokens[idx2] == ro.tokens[idx2 - 2]).mean()) if idx2.size else float("nan")
                even, odd = ro.values[m & (g % 2 == 0)], ro.values[m & (g % 2 == 1)]
                rows.append({"bin": b, "tokens": int(m.sum()), "repeat_lag2": round(repeat2, 3),
                             "p5": round(float(np.quantile(ro.values[m], Q)), 4),
                             "p5_even": round(float(np.quantile(even, Q)), 4) if even.size else None,
                             "p5_odd": round(float(np.quantile(odd, Q)), 4) if odd.size else None})
            out[name].append(rows)
    return out


def needed(summary: dict, width: int, design: str, stride: int, key: str, level: float) -> int | None:
    """The smallest N of the grid at which every budget meets ``key >= level``."""
    grid = sorted({int(n) for n in summary["grid"]["rollouts"]})
    for n in grid:
        cells = [summary["results"][s][str(width)][design][str(stride)][str(n)] for s in SCHEDULES]
        if all(c[key] >= level for c in cells):
            return n
    return None


def rounded(x: Any, digits: int = 5) -> Any:
    """Floats to ``digits`` decimals, recursively (the summary's size)."""
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    return x


def write_tables(summary: dict, out: Path, per_bin_stride: int = 16) -> None:
    g = summary["grid"]
    lines = ["# Live p5 of the exact subsample vs the p5 of every position (same rollouts)", "",
             f"Data: {summary['data']}; {g['reps']} replicates per cell; band ±{TOL}.", ""]
    for width in g["bin_tokens"]:
        lines += [f"## {width}-token bins", "",
                  "Smallest N (verified 8K rollouts per bin, grid " + ", ".join(map(str, g["rollouts"])) + ") at which all "
                  "three budgets meet the level (— : none in the grid):", "",
                  "| design | s | every bin P(within) ≥ 0.95 | all bins at once P ≥ 0.95 | interval coverage ≥ 0.95 in every bin (at that N) |",
                  "|---|---|---|---|---|"]
        for design in DESIGNS:
            for s in g["strides"]:
                n1 = needed(summary, width, design, s, "min_p_within", 0.95)
                n2 = needed(summary, width, design, s, "p_all_within", 0.95)
                cov = "—" if n1 is None else min(summary["results"][sc][str(width)][design][str(s)][str(n1)]["min_ci_coverage"]
                                                 for sc in SCHEDULES)
                lines.append(f"| {design} | {s} | {n1 or '—'} | {n2 or '—'} | {cov if cov == '—' else f'{cov:.2f}'} |")
        lines += ["", "Worst bin's 95th percentile of |live p5 − all-positions p5| (max over the three budgets), and "
                  "P(all bins within ±0.02) (min over budgets):", "",
                  "| design | s | " + " | ".join(f"N={n}" for n in g["rollouts"]) + " |",
                  "|---|---|" + "---|" * len(g["rollouts"])]
        for design in DESIGNS:
            for s in g["strides"]:
                cells = []
                for n in g["rollouts"]:
                    c = [summary["results"][sc][str(width)][design][str(s)][str(n)] for sc in SCHEDULES]
                    cells.append(f"{max(x['worst_q95_abs_error'] for x in c):.3f} / {min(x['p_all_within'] for x in c):.2f}")
                lines.append(f"| {design} | {s} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## By kept tokens per bin", "",
              "Every (budget, bin width, stride, N, bin) cell, grouped by the kept tokens the bin's live p5 rests on "
              "(N × tokens per rollout in the bin / s): the largest 95th percentile of |error| and the least "
              "P(within ±0.02) and interval coverage in the group.", "",
              "| kept tokens per bin | cells | jittered: max q95 \\|err\\| | min P(within) | min coverage | fixed: max q95 \\|err\\| | min P(within) | min coverage |",
              "|---|---|---|---|---|---|---|---|"]
    for lo, hi, label, cells in kept_groups(summary):
        j, f = cells["jittered"], cells["fixed"]
        lines.append(f"| {label} | {len(j)} | {max(c['q95_abs_error'] for c in j):.3f} | {min(c['p_within'] for c in j):.2f} | "
                     f"{min(c['ci_coverage'] for c in j):.2f} | {max(c['q95_abs_error'] for c in f):.3f} | "
                     f"{min(c['p_within'] for c in f):.2f} | {min(c['ci_coverage'] for c in f):.2f} |")
    stride = per_bin_stride if per_bin_stride in g["strides"] else g["strides"][-1]
    n_show = 64 if 64 in g["rollouts"] else g["rollouts"][-1]
    width = 512 if 512 in g["bin_tokens"] else g["bin_tokens"][0]
    lines += ["", f"## Per bin at s = {stride}, {width}-token bins, N = {n_show}", "",
              "| budget | bin from | p5 (all 4 rollouts) | jittered: q95 \\|err\\| | P(within) | interval coverage | fixed: q95 \\|err\\| | P(within) | coverage |",
              "|---|---|---|---|---|---|---|---|---|"]
    for sc in SCHEDULES:
        jit = summary["results"][sc][str(width)]["jittered"][str(stride)][str(n_show)]["bins"]
        fix = summary["results"][sc][str(width)]["fixed"][str(stride)][str(n_show)]["bins"]
        for a, b in zip(jit, fix):
            lines.append(f"| {sc.rsplit('-', 1)[1]} | {a['from']} | {a['p5_all_rollouts']:.3f} | {a['q95_abs_error']:.3f} | "
                         f"{a['p_within']:.2f} | {a['ci_coverage']:.2f} | {b['q95_abs_error']:.3f} | {b['p_within']:.2f} | "
                         f"{b['ci_coverage']:.2f} |")
    (out / "tables.md").write_text("\n".join(lines) + "\n")


KEPT_GROUPS = ((0, 500), (500, 1000), (1000, 2000), (2000, 4000), (4000, 8000), (8000, 16000), (16000, 1 << 30))


def kept_cells(summary: dict):
    """(design, kept tokens, bin cell) for every bin of every cell whose bin holds at least 100 tokens per rollout
    (the partial last 2,000-token bin holds 160)."""
    g = summary["grid"]
    for sc in SCHEDULES:
        for w in g["bin_tokens"]:
            for design in DESIGNS:
                for s in g["strides"]:
                    for n in g["rollouts"]:
                        for b in summary["results"][sc][str(w)][design][str(s)][str(n)]["bins"]:
                            per = float(np.mean(b["tokens_per_rollout"]))
                            if per >= 100 and b["p5_all_rollouts"] < 0.999:  # a bin where pages are dropped
                                yield design, n * per / s, b


def kept_groups(summary: dict):
    cells = list(kept_cells(summary))
    for lo, hi in KEPT_GROUPS:
        group = {d: [b for design, k, b in cells if design == d and lo <= k < hi] for d in DESIGNS}
        if group["jittered"] and group["fixed"]:
            yield lo, hi, (f"{lo:,}–{hi:,}" if hi < 1 << 30 else f"≥ {lo:,}"), group


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = summary["grid"]
    fig, axes = plt.subplots(1, len(SCHEDULES), figsize=(5 * len(SCHEDULES), 4), sharey=True)
    for ax, sc in zip(axes, SCHEDULES):
        for design, style in (("jittered", "-"), ("fixed", ":")):
            for s in g["strides"]:
                ys = [summary["results"][sc]["512"][design][str(s)][str(n)]["worst_q95_abs_error"] for n in g["rollouts"]]
                ax.plot(g["rollouts"], ys, style, marker="o", ms=3, label=f"{design} s={s}")
        ax.axhline(TOL, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"budget {sc.rsplit('-', 1)[1]}, 512-token bins")
        ax.set_xlabel("verified 8K rollouts per bin (N)")
    axes[0].set_ylabel("worst bin: 95th pct of |live p5 - p5 of all positions|")
    axes[-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "error_vs_rollouts.png", dpi=110)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for design, color in (("fixed", "tab:red"), ("jittered", "tab:blue")):
        pts = [(k, b["q95_abs_error"]) for d, k, b in kept_cells(summary) if d == design]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4, alpha=0.35, color=color, label=f"{design} (every bin)")
    ax.axhline(TOL, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("kept tokens in the bin (N x tokens per rollout / s)")
    ax.set_ylabel("95th pct of |live p5 - p5 of all positions|")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "error_vs_kept_tokens.png", dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strides", default="4,8,16,32")
    ap.add_argument("--rollouts", default="4,8,16,32,64,128,256")
    ap.add_argument("--bin-tokens", default="512,1024,2000")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--per-bin-stride", type=int, default=16, help="the stride of the per-bin table")
    ap.add_argument("--from-summary", type=Path, default=None,
                    help="skip the simulation: rewrite tables, plots and loops.json from this summary.json")
    args = ap.parse_args()
    if args.from_summary is not None:
        summary = rounded(json.loads(args.from_summary.read_text()))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
        (args.out / "loops.json").write_text(json.dumps(loops(load(args.data), 512), indent=1) + "\n")
        write_tables(summary, args.out, args.per_bin_stride)
        if not args.no_plot:
            plot(summary, args.out)
        return 0
    strides = [int(x) for x in args.strides.split(",")]
    grid_n = [int(x) for x in args.rollouts.split(",")]
    widths = [int(x) for x in args.bin_tokens.split(",")]
    t0 = time.time()
    data = load(args.data)
    results: dict = {}
    for k, sc in enumerate(SCHEDULES):
        for design in DESIGNS:
            for s in strides:
                for n in grid_n:
                    cell = simulate(data[sc], widths, design, s, n, args.reps, args.seed + 7919 * k + 131 * s + n)
                    for w, res in cell.items():
                        results.setdefault(sc, {}).setdefault(str(w), {}).setdefault(design, {}).setdefault(str(s), {})[str(n)] = res
                    print(f"[{time.time() - t0:.0f}s] {sc} {design} s={s} N={n}: " + ", ".join(
                        f"{w}: worst q95 {cell[w]['worst_q95_abs_error']:.3f} P(all) {cell[w]['p_all_within']:.2f} "
                        f"cov {cell[w]['min_ci_coverage']:.2f}" for w in widths), flush=True)
    summary = {"data": str(args.data.relative_to(ROOT)) if args.data.is_relative_to(ROOT) else str(args.data),
               "grid": {"strides": strides, "rollouts": grid_n, "bin_tokens": widths, "reps": args.reps, "seed": args.seed,
                        "designs": list(DESIGNS), "band": TOL, "confidence": CONFIDENCE},
               "rollouts_per_budget": {sc: len(data[sc]) for sc in SCHEDULES}, "results": results,
               "needed": {str(w): {d: {str(s): {"every_bin": needed({"grid": {"rollouts": grid_n}, "results": results}, w, d, s,
                                                                      "min_p_within", 0.95),
                                                 "all_bins": needed({"grid": {"rollouts": grid_n}, "results": results}, w, d, s,
                                                                    "p_all_within", 0.95)}
                                         for s in strides} for d in DESIGNS} for w in widths},
               "elapsed_s": round(time.time() - t0, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    summary = rounded(summary)
    (args.out / "summary.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    (args.out / "loops.json").write_text(json.dumps(loops(data, 512), indent=1) + "\n")
    write_tables(summary, args.out, args.per_bin_stride)
    if not args.no_plot:
        plot(summary, args.out)
    print(json.dumps(summary["needed"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
