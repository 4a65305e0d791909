"""How the SGLang monitor's top-20 lower bound biases the autopilot: paired (exact, bound) acceptance.

``cpu``: sparse rollouts of the embedded SmolLM2-135M from the reference engine (fixed budgets, T = 1,
EOS ignored), each re-scored in float32 with the full sparse distribution (teacher-forced, decode's page
selections) and the full dense one. Per token it stores the exact acceptance, the top-k lower bound for
several k (the monitor's k = 20 among them), the top-20 upper bound (``topk_acceptance_upper_bound``) and
the dense top-20 mass. Writes ``tokens.npz`` and ``rollouts.jsonl`` into ``--out``.

``report``: per length bin, exact vs bound (p5, mean, gap), how the p5 gap shrinks with k, whether the
bound's p5 orders budgets as the exact p5 does (what a calibration map would need), and the controller's
decision (``BudgetController``'s rule: raise / hold / lower) at every (bin, budget) cell under either
evidence, for the CPU arrays and for the H200 study's (``cross_engine.tokens.npz``, gpu8k). Writes
``summary.json`` and ``tables.md``.

    python benchmarks/autopilot/topk_bias.py cpu --out /tmp/topk-bias --prompts 6 --new-tokens 192
    python benchmarks/autopilot/topk_bias.py report --cpu /tmp/topk-bias/tokens.npz \\
        --gpu /tmp/xe16/xe/cross_engine.tokens.npz --out benchmarks/results/autopilot/topk_bias
"""
from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROMPTS = HERE.parent / "fidelity" / "prompts.jsonl"
KS = (20, 50, 100, 200, 500, 1000, 2000)
MONITOR_K = 20
BOUND_TARGETS = (0.25, 0.28, 0.30, 0.32, 0.34, 0.38, 0.42)  # targets on the bound's scale (gpu sweep)
PAGE = 16
DENSE_LAYERS = (0, 1)


# ----- cpu: paired samples -----------------------------------------------------------------------
def topk_mask(logprobs, k: int):
    """[T, V] bool: the k most likely ids of each row."""
    import torch

    mask = torch.zeros_like(logprobs, dtype=torch.bool)
    return mask.scatter_(1, logprobs.topk(k, dim=1).indices, True)


def upper_from_masks(ps, pd, in_s, in_d):
    """``topk_acceptance_upper_bound`` of the top-k lists ``in_s``/``in_d`` ([T, V] masks) of the full
    distributions ``ps``/``pd`` ([T, V]): the same formula over masks, for k too large for [T, k, k] tensors."""
    import torch

    b = in_s & in_d
    lower = torch.where(b, torch.minimum(ps, pd), 0.0).sum(1)
    ps_min = torch.where(in_s, ps, 1.0).amin(1, keepdim=True)
    pd_min = torch.where(in_d, pd, 1.0).amin(1, keepdim=True)
    outside_b = torch.minimum(1 - (ps * b).sum(1), 1 - (pd * b).sum(1))
    one_list = (torch.minimum(ps, pd_min) * (in_s & ~in_d)).sum(1) + (torch.minimum(pd, ps_min) * (in_d & ~in_s)).sum(1)
    neither = torch.minimum(1 - (ps * in_s).sum(1), 1 - (pd * in_d).sum(1))
    return (lower + torch.minimum(outside_b, one_list + neither).clamp(min=0.0)).clamp(0.0, 1.0)


def paired_row_stats(sparse_logits, dense_logits) -> dict[str, np.ndarray]:
    """Per token: exact acceptance, the top-k lower bound for each k in ``KS`` (from masks over the full
    distributions), the monitor's top-20 lower and upper bounds from the stats functions, the dense top-20 mass."""
    import torch

    from sparrow_server.stats.acceptance import (
        exact_acceptance, logits_to_topk, topk_acceptance_lower_bound, topk_acceptance_upper_bound,
    )

    ls, ld = torch.log_softmax(sparse_logits.double(), -1), torch.log_softmax(dense_logits.double(), -1)
    both = torch.minimum(ls, ld).exp()
    out = {"exact": exact_acceptance(sparse_logits.double(), dense_logits.double()).numpy()}
    ps, pd = ls.exp(), ld.exp()
    for k in KS:
        in_s, in_d = topk_mask(ls, k), topk_mask(ld, k)
        out[f"lower_{k}"] = torch.where(in_s & in_d, both, 0.0).sum(1).numpy()
        out[f"upper_{k}"] = upper_from_masks(ps, pd, in_s, in_d).numpy()
    s_ids, s_lp = logits_to_topk(sparse_logits.double(), MONITOR_K)
    d_ids, d_lp = logits_to_topk(dense_logits.double(), MONITOR_K)
    out["monitor_lower"] = topk_acceptance_lower_bound(s_ids, s_lp, d_ids, d_lp).numpy()
    out["monitor_upper"] = topk_acceptance_upper_bound(s_ids, s_lp, d_ids, d_lp).numpy()
    out["dense_top20_mass"] = d_lp.exp().sum(1).numpy()
    return out


def run_cpu(args: argparse.Namespace) -> None:
    import asyncio

    import torch

    from sparrow_server.engine.base import GenerationRequest, SamplingParams
    from sparrow_server.engine.chat_template import chat_template_ids, user_turn
    from sparrow_server.engine.reference import ReferenceEngine
    from sparrow_server.models import load_model
    from sparrow_server.monitor.scoring import HFScorer
    from sparrow_server.sparsity.schedule import dense_schedule

    torch.set_num_threads(args.threads)
    loaded = load_model(None)
    tok = loaded.tokenizer
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()][:args.prompts]
    prompts = []
    for r in rows:
        prompts.append(tuple(chat_template_ids(tok, user_turn(r["prompt"]))))
    schedules = {b: fixed_schedule(b, args.bin_tokens) for b in args.budgets}
    schedules[0] = dense_schedule()
    engine = ReferenceEngine(loaded.model, tok, "smollm2", kv_pool_tokens=len(schedules) * len(prompts) * 400,
                             max_batch_size=len(schedules) * len(prompts))
    requests = [GenerationRequest(rid=f"{b}-{i}", input_ids=p, schedule=s,
                                  sampling=SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0,
                                                          seed=args.seed + i, ignore_eos=True))
                for b, s in schedules.items() for i, p in enumerate(prompts)]

    async def collect(request):
        tokens = []
        async for chunk in engine.submit(request):
            tokens += chunk.token_ids
        return tokens

    async def generate():
        await engine.start()
        return await asyncio.gather(*(collect(r) for r in requests))

    start = time.time()
    completions = asyncio.run(generate())
    print(f"generated {sum(map(len, completions))} tokens in {time.time() - start:.0f} s", flush=True)
    asyncio.run(engine.shutdown())
    scorer = HFScorer(loaded.model)
    arrays: dict[str, list[np.ndarray]] = {}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rollouts.jsonl", "w") as f:
        for request, completion in zip(requests, completions):
            t0 = time.time()
            budget = int(request.rid.split("-")[0])
            prompt = request.input_ids
            dense = scorer.dense_logits(prompt, completion)
            sparse = dense if budget == 0 else scorer.sparse_logits(prompt, completion, request.schedule)
            stats = paired_row_stats(sparse, dense)
            stats["length"] = np.arange(len(completion)) + len(prompt)  # the ``total`` basis
            stats["rollout"] = np.full(len(completion), int(request.rid.split("-")[1]))
            name = "dense" if budget == 0 else f"fixed-{budget}"
            for key, value in stats.items():
                arrays.setdefault(f"{name}/{key}", []).append(np.asarray(value))
            f.write(json.dumps({"rid": request.rid, "schedule": name, "prompt_ids": list(prompt),
                                "completion_ids": list(completion)}) + "\n")
            print(f"scored {request.rid} in {time.time() - t0:.1f} s", flush=True)
    np.savez_compressed(args.out / "tokens.npz", **{k: np.concatenate(v) for k, v in arrays.items()})
    print(f"total {time.time() - start:.0f} s", flush=True)


# ----- report: per bin, decisions, maps ----------------------------------------------------------
def load_sets(path: Path, bound_key: str) -> dict[str, dict[str, np.ndarray]]:
    """schedule -> {exact, bound, length, ...} (float64), the bound being ``bound_key``."""
    data = np.load(path)
    out: dict[str, dict[str, np.ndarray]] = {}
    for key in data.files:
        name, field = key.split("/", 1)
        out.setdefault(name, {})[field] = data[key].astype(np.float64) if field != "length" else data[key]
    for arrays in out.values():
        arrays["bound"] = arrays[bound_key]
    return out


def budget_of(name: str) -> float:
    return float(name.rsplit("-", 1)[1]) if name.startswith(("fixed-", "xe-fixed-")) else np.inf


def decide(values: np.ndarray, target: float, margin: float, confidence: float) -> tuple[str, float, float, float]:
    """The controller's rule on one window: raise / lower / hold, with (p5, low, high)."""
    from sparrow_server.autopilot.controller import quantile_interval

    p5, low, high = quantile_interval(values, 0.05, confidence)
    verdict = "raise" if high < target else "lower" if low > target + margin else "hold"
    return verdict, p5, low, high


def bin_table(sets: dict[str, dict[str, np.ndarray]], bin_tokens: int, target: float, margin: float,
              confidence: float, extra: tuple[str, ...] = ()) -> list[dict]:
    """One row per (schedule, bin): exact vs bound, and the controller's verdict under each."""
    rows = []
    for name in sorted(sets, key=budget_of):
        a = sets[name]
        bins = a["length"] // bin_tokens
        for b in np.unique(bins):
            m = bins == b
            ex, lb = a["exact"][m], a["bound"][m]
            v_ex, p_ex, lo_ex, hi_ex = decide(ex, target, margin, confidence)
            v_lb, p_lb, lo_lb, hi_lb = decide(lb, target, margin, confidence)
            row = {"schedule": name, "budget": budget_of(name), "bin": int(b), "from": int(b) * bin_tokens,
                   "tokens": int(m.sum()), "exact_p5": p_ex, "exact_p5_interval": [lo_ex, hi_ex],
                   "bound_p5": p_lb, "bound_p5_interval": [lo_lb, hi_lb], "exact_mean": float(ex.mean()),
                   "bound_mean": float(lb.mean()), "p5_gap": p_ex - p_lb,
                   "bound_above_exact_share": float(np.mean(lb > ex + 1e-3)),
                   "verdict_exact": v_ex, "verdict_bound": v_lb}
            for key in extra:
                row[f"{key}_p5"] = float(np.quantile(a[key][m], 0.05))
            if "monitor_upper" in a:
                row["verdict_sandwich"] = sandwich_verdict(lb, a["monitor_upper"][m], target, margin, confidence)
            rows.append(row)
    return rows


def sandwich_verdict(lower: np.ndarray, upper: np.ndarray, target: float, margin: float, confidence: float) -> str:
    """Raise only when the upper bound's p5 interval lies below the target, lower only when the lower
    bound's lies above target + margin (the exact p5 lies between the two p5s)."""
    if decide(upper, target, margin, confidence)[0] == "raise":
        return "raise"
    return "lower" if decide(lower, target, margin, confidence)[0] == "lower" else "hold"


def settled(rows: list[dict], verdict_key: str) -> dict[int, float]:
    """Per bin, the smallest budget of the grid the controller does not raise from (inf: none, the ceiling),
    carried up to the bin before it (budgets are non-decreasing with length)."""
    out: dict[int, float] = {}
    for b in sorted({r["bin"] for r in rows}):
        ok = [r["budget"] for r in rows if r["bin"] == b and r[verdict_key] != "raise"]
        out[b] = max(min(ok) if ok else np.inf, out.get(b - 1, 0.0))
    return out


def bound_target_sweep(sets, bin_tokens: int, targets, margin: float, confidence: float) -> list[dict]:
    """A target stated on the bound's scale: where the controller settles, the exact p5 it then holds in its
    worst bin (dense bins count 1), and the attended tokens."""
    lengths = sets["dense"]["length"]
    out = []
    for target in targets:
        rows = bin_table(sets, bin_tokens, target, margin, confidence)
        budgets = settled(rows, "verdict_bound")
        exact = [next((r["exact_p5"] for r in rows if r["bin"] == b and r["budget"] == v), 1.0) for b, v in budgets.items()]
        out.append({"bound_target": target, "budgets": [None if np.isinf(v) else v for v in budgets.values()],
                    "worst_bin_exact_p5": float(min(exact)), "attended_per_token": attended(budgets, lengths, bin_tokens)})
    return out


def attended(budgets: dict[int, float], lengths: np.ndarray, bin_tokens: int) -> float:
    """Mean KV tokens a sparse layer attends per generated token: ``kv_budget_tokens`` (the engines' one
    definition) under a fixed schedule at its bin's settled budget; the whole length where none (dense)."""
    from sparrow_server.sparsity.schedule import kv_budget_tokens

    def one(length: int) -> int:
        budget = budgets.get(length // bin_tokens, np.inf)
        return length if np.isinf(budget) else kv_budget_tokens(fixed_schedule(int(budget), bin_tokens), length)

    return float(np.mean([one(int(n)) for n in lengths]))


@functools.lru_cache(maxsize=None)
def fixed_schedule(budget: int, bin_tokens: int):
    """The fixed-budget schedule of this study's grid (page 16, default sink/recent, layers 0-1 dense)."""
    from sparrow_server.sparsity.schedule import Schedule

    return Schedule(name=f"fixed-{budget}", budgets_tokens=(budget,), page_size=PAGE, dense_layers=DENSE_LAYERS,
                    bin_tokens=bin_tokens)


def map_robustness(rows: list[dict]) -> dict:
    """Could a map from the bound's p5 to the exact p5 be fitted? Over the sparse (schedule, bin) cells:
    Spearman rank correlation, and leave-one-budget-out errors of an offset and of a linear map."""
    cells = [r for r in rows if np.isfinite(r["budget"]) and r["exact_p5"] < 0.999]
    x = np.array([r["bound_p5"] for r in cells])
    y = np.array([r["exact_p5"] for r in cells])
    budgets = np.array([r["budget"] for r in cells])
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    spearman = float(np.corrcoef(rank(x), rank(y))[0, 1]) if len(cells) > 2 else float("nan")
    errors: dict[str, list[float]] = {"offset": [], "linear": []}
    for held in np.unique(budgets):
        train, test = budgets != held, budgets == held
        offset = float(np.mean(y[train] - x[train]))
        errors["offset"] += list(np.abs(x[test] + offset - y[test]))
        slope, icept = np.polyfit(x[train], y[train], 1)
        errors["linear"] += list(np.abs(slope * x[test] + icept - y[test]))
    overshoots: list[float] = []  # per-bin offset's prediction minus the exact p5 (> 0: reads safer than it is)
    for held in np.unique(budgets):  # per bin: the offset fitted on the bin's other budgets
        for b in {r["bin"] for r in cells}:
            test = [r for r in cells if r["bin"] == b and r["budget"] == held]
            train = [r for r in cells if r["bin"] == b and r["budget"] != held]
            if test and train:
                offset = np.mean([r["exact_p5"] - r["bound_p5"] for r in train])
                over = test[0]["bound_p5"] + offset - test[0]["exact_p5"]
                errors.setdefault("per_bin_offset", []).append(abs(over))
                overshoots.append(over)
    return {"cells": len(cells), "spearman": spearman, "per_bin_offset_predictions": len(overshoots),
            "per_bin_offset_over_by_0.02": int(np.sum(np.array(overshoots) > 0.02)),
            "bound_p5_range": [float(x.min()), float(x.max())], "exact_p5_range": [float(y.min()), float(y.max())],
            **{f"lobo_{k}_abs_error": {"median": float(np.median(v)), "max": float(np.max(v))} for k, v in errors.items()}}


def pair_resolution(rows: list[dict]) -> dict:
    """Within each bin, over pairs of budgets whose exact p5 intervals are disjoint (the exact evidence tells
    them apart): how many the bound's p5 intervals tell apart in the same order, and how many in reverse."""
    out = {"pairs_exact_resolves": 0, "bound_same_order": 0, "bound_reversed": 0}
    for b in {r["bin"] for r in rows}:
        cells = sorted((r for r in rows if r["bin"] == b), key=lambda r: r["budget"])
        for i, lo in enumerate(cells):
            for hi in cells[i + 1:]:
                if lo["exact_p5_interval"][1] >= hi["exact_p5_interval"][0]:
                    continue
                out["pairs_exact_resolves"] += 1
                out["bound_same_order"] += lo["bound_p5_interval"][1] < hi["bound_p5_interval"][0]
                out["bound_reversed"] += lo["bound_p5_interval"][0] > hi["bound_p5_interval"][1]
    return out


def analyse(sets, bin_tokens: int, target: float, margin: float, confidence: float, extra=()) -> dict:
    rows = bin_table(sets, bin_tokens, target, margin, confidence, extra)
    dense_lengths = next(a["length"] for n, a in sets.items() if n == "dense")
    keys = ["verdict_exact", "verdict_bound"] + (["verdict_sandwich"] if "verdict_sandwich" in rows[0] else [])
    result = {"bin_tokens": bin_tokens, "target": target, "margin": margin, "confidence": confidence, "rows": rows,
              "map": map_robustness(rows), "pairs": pair_resolution(rows), "settled": {}}
    for key in keys:
        budgets = settled(rows, key)
        result["settled"][key.removeprefix("verdict_")] = {
            "budgets": {str(b): (None if np.isinf(v) else v) for b, v in budgets.items()},
            "attended_per_token": attended(budgets, dense_lengths, bin_tokens)}
    return result


def k_sweep(sets) -> list[dict]:
    """Pooled over the sparse schedules' sparse-region tokens: p5 and mean gap of the top-k lower bound per k."""
    region = {n: a["length"] > budget_of(n) for n, a in sets.items() if np.isfinite(budget_of(n))}
    ex = np.concatenate([sets[n]["exact"][m] for n, m in region.items()])
    out = []
    for k in KS:
        lb = np.concatenate([sets[n][f"lower_{k}"][m] for n, m in region.items()])
        out.append({"k": k, "p5_exact": float(np.quantile(ex, 0.05)), "p5_bound": float(np.quantile(lb, 0.05)),
                    "mean_gap": float(np.mean(ex - lb)), "p95_gap": float(np.quantile(ex - lb, 0.95))})
    return out


def run_report(args: argparse.Namespace) -> None:
    cpu = load_sets(args.cpu, "monitor_lower")
    gpu = load_sets(args.gpu, "lower_bound")
    summary = {
        "cpu": analyse(cpu, args.cpu_bin_tokens, args.cpu_target, args.margin, args.confidence,
                       extra=("monitor_upper", "dense_top20_mass") + tuple(f"lower_{k}" for k in KS)),
        "gpu": analyse(gpu, args.gpu_bin_tokens, args.gpu_target, args.margin, args.confidence),
        "cpu_k_sweep": k_sweep(cpu),
        "gpu_bound_target_sweep": bound_target_sweep(gpu, args.gpu_bin_tokens, BOUND_TARGETS, args.margin, args.confidence),
        "cpu_check_lower20_equals_monitor": float(max(np.abs(a["lower_20"] - a["monitor_lower"]).max() for a in cpu.values())),
        "cpu_check_upper20_equals_monitor": float(max(np.abs(a["upper_20"] - a["monitor_upper"]).max() for a in cpu.values())),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = tables(summary)
    (args.out / "tables.md").write_text(text)
    print(text)


def _f(v) -> str:
    return "ceiling" if v is None else f"{v:.0f}" if isinstance(v, float) and v > 2 else f"{v:.3f}"


def tables(s: dict) -> str:
    lines = []
    for which in ("cpu", "gpu"):
        r = s[which]
        sandwich = "verdict_sandwich" in r["rows"][0]
        lines += [f"## {which}: bins of {r['bin_tokens']} tokens, target {r['target']}, margin {r['margin']}, "
                  f"confidence {r['confidence']}", "",
                  "| schedule | bin from | tokens | exact p5 [interval] | bound p5 [interval] | p5 gap | exact mean | "
                  "bound mean | bound > exact | verdict exact | verdict bound |" + (" upper p5 | verdict sandwich |" if sandwich else ""),
                  "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if sandwich else "")]
        for x in r["rows"]:
            lines.append(f"| {x['schedule']} | {x['from']} | {x['tokens']} | {x['exact_p5']:.3f} "
                         f"[{x['exact_p5_interval'][0]:.3f}, {x['exact_p5_interval'][1]:.3f}] | {x['bound_p5']:.3f} "
                         f"[{x['bound_p5_interval'][0]:.3f}, {x['bound_p5_interval'][1]:.3f}] | {x['p5_gap']:.3f} | "
                         f"{x['exact_mean']:.3f} | {x['bound_mean']:.3f} | {100 * x['bound_above_exact_share']:.1f}% | "
                         f"{x['verdict_exact']} | {x['verdict_bound']} |"
                         + (f" {x['monitor_upper_p5']:.3f} | {x['verdict_sandwich']} |" if sandwich else ""))
        m = r["map"]
        lines += ["", f"Map bound p5 -> exact p5 over {m['cells']} sparse cells: Spearman {m['spearman']:.2f}; bound p5 "
                  f"{m['bound_p5_range'][0]:.3f}-{m['bound_p5_range'][1]:.3f}, exact p5 {m['exact_p5_range'][0]:.3f}-"
                  f"{m['exact_p5_range'][1]:.3f}; leave-one-budget-out |error| offset median "
                  f"{m['lobo_offset_abs_error']['median']:.3f} max {m['lobo_offset_abs_error']['max']:.3f}, linear median "
                  f"{m['lobo_linear_abs_error']['median']:.3f} max {m['lobo_linear_abs_error']['max']:.3f}, per-bin offset median {m['lobo_per_bin_offset_abs_error']['median']:.3f} "
                  f"max {m['lobo_per_bin_offset_abs_error']['max']:.3f} ({m['per_bin_offset_over_by_0.02']} of "
                  f"{m['per_bin_offset_predictions']} predictions above the exact p5 by more than 0.02)", "",
                  f"Budget pairs of one bin that the exact p5 intervals tell apart: {r['pairs']['pairs_exact_resolves']}; "
                  f"the bound's intervals in the same order: {r['pairs']['bound_same_order']}, reversed: "
                  f"{r['pairs']['bound_reversed']}", "",
                  "| evidence | settled budget per bin (smallest not raised; ceiling: none on the grid) | attended / token |",
                  "|---|---|---|"]
        for key, v in r["settled"].items():
            lines.append(f"| {key} | {', '.join(f'{b}: {_f(x)}' for b, x in v['budgets'].items())} | "
                         f"{v['attended_per_token']:.1f} |")
        lines.append("")
    lines += ["## gpu: a target stated on the bound's scale", "",
              "| bound target | settled budgets per bin | worst bin's exact p5 | attended / token |", "|---|---|---|---|"]
    for x in s["gpu_bound_target_sweep"]:
        lines.append(f"| {x['bound_target']} | {', '.join(_f(v) for v in x['budgets'])} | {x['worst_bin_exact_p5']:.3f} | "
                     f"{x['attended_per_token']:.0f} |")
    lines += ["", "## cpu: top-k lower bound against k (sparse-region tokens of the fixed budgets, pooled)", "",
              "| k | exact p5 | bound p5 | mean gap | p95 gap |", "|---|---|---|---|---|"]
    for x in s["cpu_k_sweep"]:
        lines.append(f"| {x['k']} | {x['p5_exact']:.3f} | {x['p5_bound']:.3f} | {x['mean_gap']:.3f} | {x['p95_gap']:.3f} |")
    lines += ["", f"max |lower_20 (masks) - topk_acceptance_lower_bound| = {s['cpu_check_lower20_equals_monitor']:.2e}", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cpu = sub.add_parser("cpu")
    cpu.add_argument("--out", type=Path, required=True)
    cpu.add_argument("--prompts", type=int, default=6)
    cpu.add_argument("--new-tokens", type=int, default=192)
    cpu.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128, 192])
    cpu.add_argument("--bin-tokens", type=int, default=64)
    cpu.add_argument("--seed", type=int, default=0)
    cpu.add_argument("--threads", type=int, default=2)
    rep = sub.add_parser("report")
    rep.add_argument("--cpu", type=Path, required=True, help="tokens.npz of the cpu command")
    rep.add_argument("--gpu", type=Path, required=True, help="cross_engine.tokens.npz of the H200 study")
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--cpu-bin-tokens", type=int, default=64)
    rep.add_argument("--gpu-bin-tokens", type=int, default=1024)
    rep.add_argument("--cpu-target", type=float, default=0.89, help="the CPU autopilot demonstration's target")
    rep.add_argument("--gpu-target", type=float, default=0.80, help="the 8K study's planned target (1,024's p5)")
    rep.add_argument("--margin", type=float, default=0.03)
    rep.add_argument("--confidence", type=float, default=0.9)
    args = parser.parse_args()
    run_cpu(args) if args.cmd == "cpu" else run_report(args)


if __name__ == "__main__":
    main()
