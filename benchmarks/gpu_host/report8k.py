"""The 8K GPU study's tables and plots, on a CPU, from what calls 3 and 4 brought back.

Inputs: call 3's per-token arrays (``cross_engine.tokens.npz``: per schedule (fixed budgets 256/512/1024
and dense) the |server - float32 reference| logprob of the sampled token, the exact acceptance, the
server's top-20 lower bound and the tokens attended, per token), and, optional (call 4), ``heldout.json``
and ``throughput.json``. Writes ``summary.json``, ``tables.md`` (also printed) and PNGs into ``--out``. The tables:
the cross-engine ones (|logprob difference| per schedule against the dense bf16 floor; the live
monitor's lower bound against the exact acceptance per length bin), then those of the fidelity study:
(a) skew: mean vs p5 (all tokens, and the sparse region where the length exceeds the budget);
(b) p5 per length bin at each fixed budget, and Pearson r between acceptance and length (sparse
region, per token) and between bin p5 and bin start; (c) held-out p5 per bin of the calibrated
schedule vs the same-cost fixed budget, against target +- 0.02; (d) Beta fit of the tail (KS).

    python benchmarks/gpu_host/report8k.py --tokens X/cross_engine.tokens.npz [--heldout X/heldout.json \\
        --throughput X/throughput.json] --bin-tokens 1024 --out benchmarks/results/fidelity/gpu8k
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from sparrow_server.stats.beta import fit_beta_tail
from sparrow_server.stats.tail import binned_quantiles

FIXED = re.compile(r"fixed-(\d+)$")
HIGH = 0.99


def fixed_budgets(tokens: dict[str, np.ndarray]) -> dict[int, str]:
    """budget -> schedule name, for the fixed-budget schedules in the arrays."""
    names = {k.split("/")[0] for k in tokens}
    return dict(sorted((int(m.group(1)), n) for n in names if (m := FIXED.search(n))))


def logprob_diff(tokens: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per schedule: median / p99 / max |logprob difference|, and median and p99 as multiples of the dense floor's."""
    names = sorted({k.split("/")[0] for k in tokens if k.endswith("/abs_logprob_diff")}, key=_schedule_order)
    stats = {n: {"tokens": int(tokens[f"{n}/abs_logprob_diff"].size),
                 **{q: float(f(tokens[f"{n}/abs_logprob_diff"].astype(np.float64))) for q, f in
                    (("median", np.median), ("p99", lambda x: np.quantile(x, 0.99)), ("max", np.max))}} for n in names}
    floor = stats.get("dense")
    for st in stats.values():
        st["median_x_dense"] = st["median"] / floor["median"] if floor else None
        st["p99_x_dense"] = st["p99"] / floor["p99"] if floor else None
    return stats


def monitor_gap(tokens: dict[str, np.ndarray], bin_tokens: int) -> dict[str, list[dict]]:
    """Per schedule and length bin: how far the server's top-20 lower bound sits below the exact acceptance.
    ``p5_gap`` is exact p5 minus lower-bound p5 (what a monitor reading the bound's p5 under-reports);
    ``above_share`` the share of tokens whose bound exceeds the exact value by more than 1e-3."""
    out = {}
    for name in sorted({k.split("/")[0] for k in tokens if k.endswith("/lower_bound")}, key=_schedule_order):
        ex, lb = tokens[f"{name}/exact"].astype(np.float64), tokens[f"{name}/lower_bound"].astype(np.float64)
        which = tokens[f"{name}/length"] // bin_tokens
        out[name] = [{"from": int(b) * bin_tokens, "tokens": int(m.sum()), "exact_mean": float(ex[m].mean()),
                      "lower_mean": float(lb[m].mean()), "mean_gap": float((ex[m] - lb[m]).mean()),
                      "exact_p5": float(np.quantile(ex[m], 0.05)), "lower_p5": float(np.quantile(lb[m], 0.05)),
                      "p5_gap": float(np.quantile(ex[m], 0.05) - np.quantile(lb[m], 0.05)),
                      "above_share": float(np.mean(lb[m] > ex[m] + 1e-3))}
                     for b in np.unique(which) if (m := which == b).any()]
    return out


def _schedule_order(name: str) -> tuple[int, int]:
    m = FIXED.search(name)
    return (0, int(m.group(1))) if m else (1, 0)


def cross_engine_markdown(diff: dict[str, dict], gap: dict[str, list[dict]]) -> str:
    lines = ["| schedule | tokens | median | p99 | max | median / dense | p99 / dense |", "|---|---|---|---|---|---|---|"]
    for name, st in diff.items():
        lines.append(f"| {name} | {st['tokens']} | {st['median']:.4f} | {st['p99']:.4f} | {st['max']:.3f} | "
                     f"{_f(st['median_x_dense'])} | {_f(st['p99_x_dense'])} |")
    lines += ["", "| schedule | bin from | tokens | exact mean | bound mean | mean gap | exact p5 | bound p5 | p5 gap | "
                  "bound > exact |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, bins in gap.items():
        for b in bins:
            lines.append(f"| {name} | {b['from']} | {b['tokens']} | {b['exact_mean']:.3f} | {b['lower_mean']:.3f} | "
                         f"{b['mean_gap']:.3f} | {b['exact_p5']:.3f} | {b['lower_p5']:.3f} | {b['p5_gap']:.3f} | "
                         f"{100 * b['above_share']:.1f}% |")
    return "\n".join(lines)


def skew(acc: np.ndarray) -> dict:
    return {"tokens": int(acc.size), "share_ge_0.99": float(np.mean(acc >= HIGH)), "mean": float(acc.mean()),
            "p5": float(np.quantile(acc, 0.05)), "p1": float(np.quantile(acc, 0.01))}


def study(tokens: dict[str, np.ndarray], bin_tokens: int) -> dict:
    out = {}
    for budget, name in fixed_budgets(tokens).items():
        acc, length = tokens[f"{name}/exact"].astype(np.float64), tokens[f"{name}/length"]
        sparse = length > budget
        bins = [b for b in binned_quantiles(acc, length, bin_tokens, q=0.05) if b.n_tokens]
        starts = np.array([b.bin_index * bin_tokens for b in bins], dtype=np.float64)
        p5 = np.array([b.quantile for b in bins])
        late = starts >= budget  # bins where the budget bites
        fit = fit_beta_tail(acc)
        out[budget] = {
            "all": skew(acc), "sparse_region": skew(acc[sparse]) if sparse.any() else None,
            "p5_by_bin": [{"from": int(s), "tokens": b.n_tokens, "p5": b.quantile, "ci": [b.ci_low, b.ci_high],
                           "mean": b.mean} for s, b in zip(starts, bins)],
            "r_token_length_sparse": float(np.corrcoef(acc[sparse], length[sparse])[0, 1]) if sparse.sum() > 2 else None,
            "r_bin_p5_length": float(np.corrcoef(p5[late], starts[late])[0, 1]) if late.sum() > 2 else None,
            "beta_tail": {"alpha": fit.alpha, "beta": fit.beta, "tail_share": fit.n_tail / fit.n_total, "ks": fit.ks,
                          "n_tail": fit.n_tail},
        }
    return out


def markdown(result: dict, heldout: dict | None, throughput: dict | None) -> str:
    lines = ["| budget | mean | p5 | sparse region: mean | p5 | a >= 0.99 | r (token, sparse) | r (bin p5) | Beta a | b | KS |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for budget, r in result.items():
        s = r["sparse_region"] or {}
        lines.append(f"| {budget} | {r['all']['mean']:.3f} | {r['all']['p5']:.3f} | {s.get('mean', float('nan')):.3f} | "
                     f"{s.get('p5', float('nan')):.3f} | {100 * s.get('share_ge_0.99', float('nan')):.1f}% | "
                     f"{_f(r['r_token_length_sparse'])} | {_f(r['r_bin_p5_length'])} | {r['beta_tail']['alpha']:.2f} | "
                     f"{r['beta_tail']['beta']:.2f} | {r['beta_tail']['ks']:.3f} |")
    first = next(iter(result.values()))
    starts = [b["from"] for b in first["p5_by_bin"]]
    lines += ["", "| budget | " + " | ".join(f"{s}–" for s in starts) + " |", "|---" * (len(starts) + 1) + "|"]
    for budget, r in result.items():
        lines.append(f"| {budget} | " + " | ".join(f"{b['p5']:.3f}" for b in r["p5_by_bin"]) + " |")
    if heldout:
        lines += ["", f"Held-out (target {heldout['target']}, band ±{heldout['band']}; schedule mean cost "
                      f"{heldout['schedule_mean_cost_tokens']:.0f} tokens, fixed {heldout['matched_fixed_budget']}):", ""]
        for name, bins in heldout["p5_by_bin"].items():
            ok = all(b["at_or_above_target_minus_band"] for b in bins)
            lines.append(f"- {name}: " + ", ".join(f"{b['from']}: {b['p5']:.3f} [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}]"
                                                    for b in bins) + f" -> every bin >= target - band: {ok}")
    if throughput:
        lines += ["", "Throughput: " + ", ".join(f"{r['schedule']} {r['tok_s']} tok/s" for r in throughput["runs"])
                  + f" (speedup {throughput['speedup']}x, batch {throughput['batch']}, {throughput['total_tokens']} tokens)"]
    return "\n".join(lines)


def _f(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def monitor_plot(gap: dict[str, list[dict]], out: Path) -> None:
    """Exact p5 (solid) and the top-20 lower bound's p5 (dashed) per length bin, per schedule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, bins in gap.items():
        x = [b["from"] for b in bins]
        line, = ax.plot(x, [b["exact_p5"] for b in bins], marker="o", label=f"{name} exact")
        ax.plot(x, [b["lower_p5"] for b in bins], marker="x", ls="--", color=line.get_color(), label=f"{name} top-20 bound")
    ax.set(xlabel="total length (bin start, tokens)", ylabel="p5 acceptance", title="live monitor's bound vs exact")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "monitor_bound_vs_exact.png", dpi=110)
    plt.close(fig)


def plots(result: dict, heldout: dict | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for budget, r in result.items():
        bins = r["p5_by_bin"]
        ax.plot([b["from"] for b in bins], [b["p5"] for b in bins], marker="o", label=f"fixed {budget}")
    ax.set(xlabel="total length (bin start, tokens)", ylabel="p5 acceptance", title="SmolLM2, SGLang bf16, exact")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "p5_vs_length.png", dpi=110)
    plt.close(fig)
    if heldout:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, bins in heldout["p5_by_bin"].items():
            x = [b["from"] for b in bins]
            ax.errorbar(x, [b["p5"] for b in bins], yerr=[[b["p5"] - b["ci"][0] for b in bins],
                                                         [b["ci"][1] - b["p5"] for b in bins]], marker="o", label=name)
        t, band = heldout["target"], heldout["band"]
        ax.axhspan(t - band, t + band, color="grey", alpha=0.2, label=f"target {t} ± {band}")
        ax.set(xlabel="total length (bin start, tokens)", ylabel="held-out p5", title="calibrated vs same-cost fixed")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "heldout_schedule.png", dpi=110)
        plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=Path, required=True)
    ap.add_argument("--heldout", type=Path, default=None)
    ap.add_argument("--throughput", type=Path, default=None)
    ap.add_argument("--bin-tokens", type=int, default=1024)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    with np.load(args.tokens) as z:
        tokens = dict(z)
    result = study(tokens, args.bin_tokens)
    diff, gap = logprob_diff(tokens), monitor_gap(tokens, args.bin_tokens)
    heldout = json.loads(args.heldout.read_text()) if args.heldout else None
    throughput = json.loads(args.throughput.read_text()) if args.throughput else None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"bin_tokens": args.bin_tokens, "fixed": result,
                                                       "logprob_diff": diff, "monitor_gap": gap,
                                                       "throughput": throughput}, indent=1) + "\n")
    plots(result, heldout, args.out)
    monitor_plot(gap, args.out)
    tables = cross_engine_markdown(diff, gap) + "\n\n" + markdown(result, heldout, throughput) + "\n"
    (args.out / "tables.md").write_text(tables)
    print(tables, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
