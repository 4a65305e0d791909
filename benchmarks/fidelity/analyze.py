"""Fidelity study, step 3: calibrate on one split, check on the other, and report.

    # after ``score.py grid``: calibrate on the calibration split, pick the cost-matched fixed budget
    python benchmarks/fidelity/analyze.py calibrate --rollouts R --work W --budgets 64,128,192,256 --bin-tokens 128
    # after ``score.py schedule`` for W/schedule.json and W/matched.json on the held-out split
    python benchmarks/fidelity/analyze.py report --rollouts R --work W --budgets ... --bin-tokens 128 --out DIR

Target (``--target auto``): the pooled p5 that the second-largest budget reaches on the
calibration split, i.e. a level the model reaches with a mid budget. Cost of a configuration: the
mean number of KV tokens a sparse layer attends per generated token (``kv_budget_tokens``: dense
while the sequence fits the budget, else the budget's full pages with the current page at its real
tokens), over the held-out tokens; the matched fixed budget is the page multiple closest to the
schedule's. ``cost`` recounts both from ``rollouts.jsonl`` alone (no scores needed):

    python benchmarks/fidelity/analyze.py cost --rollouts R --work W --budgets ... [--schedule S.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sparrow_server.cost.search import search_schedule
from sparrow_server.sparsity.schedule import Schedule, dump_schedule, kv_budget_tokens, load_schedule
from sparrow_server.stats.beta import fit_beta_tail
from sparrow_server.stats.tail import binned_quantiles

PAGE_SIZE = 16
TOLERANCE = 0.02
HIGH = 0.99
N_BOOT = 500


def load(rollouts_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (rollouts_dir / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def pooled(work: Path, rollouts: list[dict], config: str) -> tuple[np.ndarray, np.ndarray]:
    """(acceptance [N], total length of the step that produced each token [N]) over ``rollouts``."""
    accs, lengths = [], []
    for r in rollouts:
        a = np.load(work / "acc" / f"{r['id']}__{config}.npy").astype(np.float64)
        accs.append(a)
        lengths.append(len(r["prompt_ids"]) + np.arange(a.size))
    return np.concatenate(accs), np.concatenate(lengths)


def mean_attended(schedule: Schedule, lengths: np.ndarray) -> float:
    """Mean KV tokens a sparse layer attends per token (dense while the sequence fits the budget)."""
    return float(np.mean([kv_budget_tokens(schedule, int(n)) for n in lengths]))


def step_lengths(rollouts: list[dict]) -> np.ndarray:
    """Total length of the step that produced each completion token [N] (as ``pooled``, without scores)."""
    return np.concatenate([len(r["prompt_ids"]) + np.arange(len(r["completion_ids"])) for r in rollouts])


def cost_match(schedule: Schedule, lengths: np.ndarray, max_budget: int) -> dict:
    """The schedule's mean attended tokens and the page-multiple fixed budget closest to it."""
    cost = mean_attended(schedule, lengths)
    costs = {b: mean_attended(Schedule(name="c", budgets_tokens=(b,), page_size=PAGE_SIZE), lengths)
             for b in range(4 * PAGE_SIZE, max_budget + PAGE_SIZE, PAGE_SIZE)}
    matched = min(costs, key=lambda b: abs(costs[b] - cost))
    return {"schedule_mean_attended": cost, "matched_budget": matched, "matched_mean_attended": costs[matched]}


def p5_table(work: Path, rollouts: list[dict], configs: list[str], bin_tokens: int, n_bins: int) -> dict:
    out = {}
    for c in configs:
        acc, lengths = pooled(work, rollouts, c)
        out[c] = binned_quantiles(acc, lengths, bin_tokens, n_bins=n_bins, n_boot=N_BOOT)
    return out


def usable_bins(rollouts: list[dict], bin_tokens: int) -> int:
    """Bins every rollout reaches; the last one is open-ended (it also holds the longest rollouts' tail)."""
    shortest = min(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rollouts)
    return max(1, -(-shortest // bin_tokens))


def cmd_calibrate(args) -> None:
    rollouts = load(args.rollouts)
    calib = [r for r in rollouts if r["split"] == "calibration"]
    held = [r for r in rollouts if r["split"] == "heldout"]
    budgets = [int(b) for b in args.budgets.split(",")]
    n_bins = usable_bins(rollouts, args.bin_tokens)
    table = p5_table(args.work, calib, [f"fixed-{b}" for b in budgets], args.bin_tokens, n_bins)
    if args.target == "auto":
        acc, _ = pooled(args.work, calib, f"fixed-{budgets[-2]}")
        target = round(float(np.quantile(acc, 0.05)), 3)
    else:
        target = float(args.target)
    result = search_schedule({b: [q.quantile for q in table[f"fixed-{b}"]] for b in budgets}, target,
                             "smollm2-calibrated", page_size=PAGE_SIZE, bin_tokens=args.bin_tokens)
    schedule = result.schedule
    (args.work / "schedule.json").write_text(dump_schedule(schedule))
    match = cost_match(schedule, step_lengths(held), max(budgets))
    (args.work / "matched.json").write_text(dump_schedule(Schedule(
        name=f"fixed-{match['matched_budget']}", budgets_tokens=(match["matched_budget"],), page_size=PAGE_SIZE,
        bin_tokens=args.bin_tokens)))
    info = {"target": target, "schedule": list(schedule.budgets_tokens), "bins": [b.__dict__ for b in result.bins],
            **match}
    (args.work / "calibration.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


def cmd_cost(args) -> None:
    held = [r for r in load(args.rollouts) if r["split"] == "heldout"]
    schedule = load_schedule(args.schedule or args.work / "schedule.json")
    budgets = [int(b) for b in args.budgets.split(",")]
    match = cost_match(schedule, step_lengths(held), max(budgets))
    print(json.dumps({"schedule": list(schedule.budgets_tokens), **match}))


def _bins_json(bins) -> list[dict]:
    return [{"bin": b.bin_index, "tokens": b.n_tokens, "p5": round(b.quantile, 4),
             "ci": [round(b.ci_low, 4), round(b.ci_high, 4)], "mean": round(b.mean, 4)} for b in bins]


def skew(acc: np.ndarray) -> dict:
    return {"tokens": int(acc.size), "share_ge_0.99": round(float(np.mean(acc >= HIGH)), 4),
            "mean": round(float(acc.mean()), 4), "p5": round(float(np.quantile(acc, 0.05)), 4),
            "p1": round(float(np.quantile(acc, 0.01)), 4)}


def cmd_report(args) -> None:
    rollouts = load(args.rollouts)
    held = [r for r in rollouts if r["split"] == "heldout"]
    budgets = [int(b) for b in args.budgets.split(",")]
    fixed = [f"fixed-{b}" for b in budgets]
    n_bins = usable_bins(rollouts, args.bin_tokens)
    cal = json.loads((args.work / "calibration.json").read_text())
    schedule = load_schedule(args.work / "schedule.json")
    matched = load_schedule(args.work / "matched.json")
    out: dict = {"rollouts": len(rollouts), "bin_tokens": args.bin_tokens, "n_bins": n_bins, "calibration": cal}
    # (a) skew and (d) Beta tail fit, all rollouts pooled, per fixed budget; also the sparse region only.
    out["budgets"] = {}
    for b, c in zip(budgets, fixed):
        acc, lengths = pooled(args.work, rollouts, c)
        sparse = acc[lengths > b]
        fit = fit_beta_tail(acc)
        corr = float(np.corrcoef(lengths, acc)[0, 1])
        out["budgets"][b] = {"all_tokens": skew(acc), "sparse_region": skew(sparse),
                             "beta_tail": {"alpha": round(fit.alpha, 4), "beta": round(fit.beta, 4),
                                           "ks": round(fit.ks, 4), "tail_fraction": round(fit.tail_fraction, 4)},
                             "pearson_length_vs_acceptance": round(corr, 4)}
    # (b) p5 per length bin at each fixed budget (all rollouts).
    table = p5_table(args.work, rollouts, fixed, args.bin_tokens, n_bins)
    out["p5_by_bin"] = {c: _bins_json(table[c]) for c in fixed}
    for b, c in zip(budgets, fixed):
        q = np.array([x.quantile for x in table[c]])
        mid = (np.arange(n_bins) + 0.5) * args.bin_tokens
        out["budgets"][b]["pearson_length_vs_bin_p5"] = round(float(np.corrcoef(mid, q)[0, 1]), 4) if n_bins > 2 else None
    # (c) held-out: calibrated schedule vs the cost-matched fixed budget.
    target = cal["target"]
    held_table = p5_table(args.work, held, [schedule.name, matched.name], args.bin_tokens, n_bins)
    out["heldout"] = {}
    for name in (schedule.name, matched.name):
        rows = _bins_json(held_table[name])
        out["heldout"][name] = {
            "bins": rows,
            "within_tolerance_every_bin": all(r["p5"] >= target - TOLERANCE for r in rows),
            "max_shortfall": round(max(target - r["p5"] for r in rows), 4),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity.json").write_text(json.dumps(out, indent=2) + "\n")
    plots(args, rollouts, budgets, table, held_table, schedule, matched, target, n_bins)
    print(json.dumps(out, indent=2))


def plots(args, rollouts, budgets, table, held_table, schedule, matched, target, n_bins) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bt = args.bin_tokens
    mid = (np.arange(n_bins) + 0.5) * bt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for b in budgets:
        bins = table[f"fixed-{b}"]
        (line,) = ax.plot(mid, [x.quantile for x in bins], marker="o", label=f"fixed {b}")
        ax.fill_between(mid, [x.ci_low for x in bins], [x.ci_high for x in bins], alpha=0.15, color=line.get_color())
    ax.axhline(target, color="k", linestyle="--", label=f"target {target}")
    ax.set_xlabel(f"total length (prompt + generated), bins of {bt} tokens")
    ax.set_ylabel("p5 of per-token acceptance")
    ax.set_title("SmolLM2-135M: p5 falls with length at a fixed budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "fidelity_p5_vs_length.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    edges = np.linspace(0, 1, 51)
    for b in budgets:
        acc, _ = pooled(args.work, rollouts, f"fixed-{b}")
        ax.hist(acc, bins=edges, histtype="step", density=True, label=f"fixed {b}")
    ax.set_yscale("log")
    ax.set_xlabel("per-token acceptance")
    ax.set_ylabel("density (log)")
    ax.set_title("per-token acceptance: mass at 1, long low tail")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "fidelity_acceptance_hist.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.axhspan(target - TOLERANCE, target + TOLERANCE, color="grey", alpha=0.2, label=f"target ±{TOLERANCE}")
    for name, label in ((schedule.name, f"calibrated schedule {list(schedule.budgets_tokens)}"),
                        (matched.name, f"fixed {matched.budgets_tokens[0]} (same mean cost)")):
        bins = held_table[name]
        (line,) = ax.plot(mid, [x.quantile for x in bins], marker="o", label=label)
        ax.fill_between(mid, [x.ci_low for x in bins], [x.ci_high for x in bins], alpha=0.15, color=line.get_color())
    ax.set_xlabel(f"total length, bins of {bt} tokens")
    ax.set_ylabel("held-out p5 acceptance")
    ax.set_title("held-out prompts: schedule vs cost-matched fixed budget")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "fidelity_heldout_schedule.png", dpi=110)
    plt.close(fig)

    from sparrow_server.stats.beta import beta_cdf

    b = budgets[len(budgets) // 2]
    acc, _ = pooled(args.work, rollouts, f"fixed-{b}")
    fit = fit_beta_tail(acc)
    tail = np.sort(acc[acc <= fit.scale] / fit.scale)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(tail * fit.scale, np.arange(1, tail.size + 1) / tail.size, label="empirical tail CDF")
    ax.plot(tail * fit.scale, beta_cdf(tail, fit.alpha, fit.beta), "--",
            label=f"Beta({fit.alpha:.2f}, {fit.beta:.2f}) scaled, KS {fit.ks:.3f}")
    ax.set_xlabel(f"acceptance (tokens with a <= {fit.scale}), fixed {b}")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "fidelity_beta_tail.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("calibrate", "report", "cost"))
    parser.add_argument("--rollouts", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--budgets", default="64,128,192,256")
    parser.add_argument("--bin-tokens", type=int, default=128)
    parser.add_argument("--target", default="auto")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--schedule", type=Path, default=None,
                        help="cost: the schedule file (default: WORK/schedule.json)")
    args = parser.parse_args()
    {"calibrate": cmd_calibrate, "report": cmd_report, "cost": cmd_cost}[args.stage](args)


if __name__ == "__main__":
    main()
