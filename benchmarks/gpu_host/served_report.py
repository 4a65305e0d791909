"""The served-adapter check's report (``served_adapter.py``, ``host.sh 8``): per length bin and arm, the p5 of the
exact acceptance at the kept positions with a 95% prompt-bootstrap interval and the tokens attended per step; and,
per target, what the autopilot's own rule decides from each arm's measured tail.

The autopilot part runs the product's controller (``sparrow_server.autopilot.BudgetController``), not a copy of
its rule: for every (bin, arm) one controller over a single-bin schedule at the arm's budget is fed every kept
token the arm measured in the bin as one window, then stepped once. Its answer is ``raise`` (the budget does not
hold the target), ``lower`` (it holds with room to spare), ``hold``, or no decision (fewer kept tokens than the
autopilot's ``min_tokens``). Why one controller per bin: the live controller couples bins (budgets stay
non-decreasing with length), which would mix one bin's verdict into another's. Why one window of everything:
the live window keeps the newest ``max_window_tokens``; here there is no "newest", and every measured token is
evidence. What the autopilot would pick in a bin, per policy (no adapter / with the adapter): the smallest
measured budget of that policy it does not raise. The live controller walks budgets a page at a time; this says
only which of the measured budgets it would settle at or below, not the exact budget.

Pure (numpy and the product's stats and autopilot); input: the records ``served_adapter.py`` collects.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

HOLD, NO_EVIDENCE = "hold", "no decision"
HOLDING = ("hold", "lower")  # the controller keeps (or lowers) the budget: it holds the target


def kept_tokens(record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(generated positions [K], exact acceptance [K]) of one answered rollout (``kept_positions`` /
    ``kept_values``, filled by the collector from the response's ``meta`` or the server's evidence)."""
    return (np.asarray(record.get("kept_positions") or [], dtype=np.int64),
            np.asarray(record.get("kept_values") or [], dtype=np.float64))


def arm_bins(records: Sequence[Mapping[str, Any]], bin_tokens: int) -> dict[int, dict[str, np.ndarray]]:
    """Per bin of the total length (prompt + position): kept values, their prompt (cluster), and the tokens every
    generated step of the bin attended (``kv_budget_tokens``, from the responses; None for the prefill's token)."""
    cols: dict[int, dict[str, list]] = {}

    def cell(b: int) -> dict[str, list]:
        return cols.setdefault(int(b), {"values": [], "cluster": [], "attended": []})

    for r in records:
        if r.get("error"):
            continue
        pos, values = kept_tokens(r)
        kept_bin = (r["prompt_len"] + pos) // bin_tokens
        for b in np.unique(kept_bin):
            cell(b)["values"].append(values[kept_bin == b])
            cell(b)["cluster"].append(np.full(int((kept_bin == b).sum()), r["prompt"]))
        attended = np.asarray([np.nan if t is None else t for t in r.get("kv_budget_tokens") or []], dtype=np.float64)
        step_bin = (r["prompt_len"] + np.arange(attended.size)) // bin_tokens
        for b in np.unique(step_bin):
            mine = attended[step_bin == b]
            cell(b)["attended"].append(mine[~np.isnan(mine)])
    return {b: {k: np.concatenate(v) if v else np.zeros(0) for k, v in c.items()} for b, c in sorted(cols.items())}


def tail_cell(values: np.ndarray, clusters: np.ndarray, attended: np.ndarray, quantile: float, confidence: float,
              n_boot: int, seed: int) -> dict[str, Any]:
    """One arm in one bin: p5 with its prompt-bootstrap interval, mean, counts, tokens attended per step.
    Every arm of a bin gets the same ``seed``: with the same prompts they draw the same resamples."""
    from sparrow_server.stats.cluster_bootstrap import paired_cluster_quantiles

    cell: dict[str, Any] = {"kept_tokens": int(values.size), "prompts": int(np.unique(clusters).size),
                            "attended_tokens_per_step": float(attended.mean()) if attended.size else None,
                            "steps": int(attended.size), "p5": None, "low": None, "high": None, "mean": None}
    if values.size:
        q = paired_cluster_quantiles({"arm": values}, clusters, q=quantile, n_boot=n_boot, confidence=confidence,
                                     seed=seed).arms["arm"]
        cell.update(p5=q.estimate, low=q.low, high=q.high, mean=float(values.mean()))
    return cell


def autopilot_decision(values: np.ndarray, budget: int, target: float, min_tokens: int, page_size: int,
                       reserved_pages: int) -> dict[str, Any]:
    """What the product's controller decides for one bin at ``budget`` from ``values`` (module docstring)."""
    from sparrow_server.autopilot.controller import EXACT_ACCEPTANCE, AutopilotConfig, BudgetController

    config = AutopilotConfig(target=target, min_tokens=min_tokens, max_window_tokens=max(min_tokens, int(values.size)),
                             acceptance=EXACT_ACCEPTANCE)
    ctl = BudgetController(config, [budget], page_size, reserved_pages)
    ctl.observe([budget], values, np.zeros(values.size, dtype=np.int64))
    evidence = ctl.evidence(0)
    changes = ctl.step()
    decided = evidence is not None and evidence.n_tokens >= min_tokens
    return {"decision": changes[0].reason if changes else (HOLD if decided else NO_EVIDENCE),
            "next_budget": ctl.budgets[0], "evidence": evidence.to_dict() if evidence else None}


def policy_pick(decisions: Sequence[tuple[int, str]]) -> tuple[int | None, str]:
    """(budget, status) from one policy's (budget, decision) pairs: the smallest budget not raised (``holds``);
    ``undecided`` when a smaller one had no decision; ``above`` when every measured budget was raised."""
    for budget, decision in sorted(decisions):
        if decision == NO_EVIDENCE:
            return None, "undecided"
        if decision in HOLDING:
            return budget, "holds"
    return None, "above"


def compare(with_adapter: tuple[int | None, str], without: tuple[int | None, str]) -> bool | None:
    """Does the autopilot pick fewer attended tokens with the adapter? None: not decidable from these arms."""
    (w, w_status), (n, n_status) = with_adapter, without
    if "undecided" in (w_status, n_status):
        return None
    if w_status != "holds":
        return False
    return n_status == "above" or w < n


def autopilot_targets(arms: Mapping[str, Mapping[str, Any]], bins: Sequence[Mapping[str, Any]],
                      by_bin: Mapping[str, Mapping[int, Mapping[str, np.ndarray]]], targets: Sequence[tuple[float, str]],
                      min_tokens: int, page_size: int, reserved_pages: int) -> list[dict[str, Any]]:
    """Per target: per bin each arm's decision, each policy's pick, and whether the adapter's pick is tighter;
    over the qualifying bins, ``yes`` (tighter in every one), ``no`` (not in one at least) or ``undecided``."""
    out = []
    for target, source in targets:
        rows = []
        for row in bins:
            b = row["bin"]
            decisions = {arm: autopilot_decision(by_bin[arm].get(b, {}).get("values", np.zeros(0)), spec["budget"],
                                                 target, min_tokens, page_size, reserved_pages)
                         for arm, spec in arms.items()}
            picks = {}
            for policy, with_adapter in (("without_adapter", False), ("with_adapter", True)):
                pairs = [(spec["budget"], decisions[arm]["decision"]) for arm, spec in arms.items()
                         if (spec["adapter"] is not None) == with_adapter]
                budget, status = policy_pick(pairs)
                arm = next((a for a, s in arms.items() if s["budget"] == budget and (s["adapter"] is not None) == with_adapter), None)
                picks[policy] = {"budget": budget, "status": status,
                                 "attended_tokens_per_step": row["arms"][arm]["attended_tokens_per_step"] if arm else None}
            tighter = compare((picks["with_adapter"]["budget"], picks["with_adapter"]["status"]),
                              (picks["without_adapter"]["budget"], picks["without_adapter"]["status"]))
            rows.append({"bin": b, "from": row["from"], "qualifies": row["qualifies"], "decisions": decisions, **picks,
                         "tighter_with_adapter": tighter})
        judged = [r["tighter_with_adapter"] for r in rows if r["qualifies"]]
        answer = ("undecided" if not judged or (None in judged and False not in judged)
                  else "no" if False in judged else "yes")
        out.append({"target": target, "source": source, "bins": rows, "tighter_with_adapter": answer,
                    "qualifying_bins": len(judged), "bins_tighter": sum(j is True for j in judged)})
    return out


def auto_target(bins: Sequence[Mapping[str, Any]], looser: str, min_tokens: int) -> float | None:
    """The tail the looser budget holds without the adapter in every qualifying bin with enough kept tokens: its
    lowest p5 there, rounded down to 0.01 (as ``host.sh 3`` derives stage 4's target). None without such a bin."""
    p5s = [r["arms"][looser]["p5"] for r in bins
           if r["qualifies"] and r["arms"][looser]["kept_tokens"] >= min_tokens and r["arms"][looser]["p5"] is not None]
    return math.floor(min(p5s) * 100) / 100 if p5s else None


def analyse(records: Sequence[Mapping[str, Any]], arms: Mapping[str, Mapping[str, Any]], looser: str, *, bin_tokens: int,
            min_bin_start: int, quantile: float, confidence: float, n_boot: int, targets: Sequence[float],
            min_tokens: int, page_size: int, reserved_pages: int, seed: int = 0) -> dict[str, Any]:
    """``arms``: {arm: {"budget", "adapter"}}; ``looser``: the arm that sets the automatic target. Returns
    {"arms": per-arm counts, "bins": per-bin cells, "autopilot": per target}."""
    by_bin = {arm: arm_bins([r for r in records if r["arm"] == arm], bin_tokens) for arm in arms}
    empty = {"values": np.zeros(0), "cluster": np.zeros(0), "attended": np.zeros(0)}
    bins = []
    for b in sorted(set().union(*(set(v) for v in by_bin.values()))):
        cells = {arm: tail_cell(*(by_bin[arm].get(b, empty)[k] for k in ("values", "cluster", "attended")),
                                quantile, confidence, n_boot, seed + b) for arm in arms}
        p5 = {arm: c["p5"] for arm, c in cells.items()}
        row = {"bin": b, "from": b * bin_tokens, "qualifies": b * bin_tokens >= min_bin_start, "arms": cells}
        row["gain"] = {arm: (p5[arm] - p5[base] if None not in (p5[arm], p5[base]) else None)
                       for arm, base in _adapter_pairs(arms).items()}
        bins.append(row)
    auto = auto_target(bins, looser, min_tokens)
    chosen = ([(auto, f"auto: {looser}'s lowest p5 over qualifying bins, rounded down")] if auto is not None else [])
    chosen += [(float(t), "given") for t in targets if auto is None or abs(float(t) - auto) > 1e-9]
    per_arm = {}
    for arm, spec in arms.items():
        recs = [r for r in records if r["arm"] == arm]
        answered = [r for r in recs if not r.get("error")]
        per_arm[arm] = {**spec, "requested": len(recs), "answered": len(answered),
                        "with_values": sum(bool(r.get("kept_values")) for r in answered),
                        "kept_tokens": int(sum(len(r.get("kept_values") or []) for r in answered)),
                        "missing_kept": int(sum(r.get("missing_kept", 0) for r in answered)),  # rows the server lost
                        "sources": sorted({r.get("source") for r in answered if r.get("source")}),
                        "errors": sorted({r["error"] for r in recs if r.get("error")})[:5]}
    return {"arms": per_arm, "bins": bins,
            "autopilot": autopilot_targets(arms, bins, by_bin, chosen, min_tokens, page_size, reserved_pages)}


def _adapter_pairs(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """{adapter arm: the arm of the same budget without the adapter} (the gain's pairs)."""
    plain = {s["budget"]: a for a, s in arms.items() if s["adapter"] is None}
    return {a: plain[s["budget"]] for a, s in arms.items() if s["adapter"] is not None and s["budget"] in plain}


def _f(x: Any, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def markdown(summary: Mapping[str, Any]) -> str:
    c, report = summary["config"], summary["report"]
    arms = list(report["arms"])
    lines = [f"# Served DistillSparse adapter: {summary['headline']}", "",
             f"{summary['device']}; engine {c['engine']}; adapter `{summary['adapter']['path']}`; {c['total_tokens']} "
             f"tokens, {c['n_heldout_prompts']} held-out prompts x {c['heldout_samples']}; exact acceptance at the kept "
             f"positions (stride {c['stride']}); p{round(c['quantile'] * 100)} per {c['bin_tokens']}-token bin with "
             f"{round(c['confidence'] * 100)}% prompt-bootstrap intervals.", "",
             "| arm | budget | adapter | answered / requested | kept tokens | values from |", "|---|---|---|---|---|---|"]
    for arm, a in report["arms"].items():
        lines.append(f"| {arm} | {a['budget']} | {a['adapter'] or '—'} | {a['answered']} / {a['requested']} | "
                     f"{a['kept_tokens']} | {', '.join(a['sources']) or '—'} |")
    lines += ["", "| bin from | " + " | ".join(f"{a}: p5 [95%] (kept) | {a}: attended/step" for a in arms) + " |",
              "|---|" + "---|---|" * len(arms)]
    for r in report["bins"]:
        cells = [f"{_f(x['p5'])} [{_f(x['low'])}, {_f(x['high'])}] ({x['kept_tokens']}) | {_f(x['attended_tokens_per_step'], '.1f')}"
                 for x in (r["arms"][a] for a in arms)]
        lines.append(f"| {r['from']}{'' if r['qualifies'] else ' (not judged)'} | " + " | ".join(cells) + " |")
    for t in report["autopilot"]:
        lines += ["", f"## Autopilot at target {t['target']:.2f} ({t['source']}): tighter with the adapter: "
                  f"**{t['tighter_with_adapter']}** ({t['bins_tighter']} of {t['qualifying_bins']} qualifying bins)", "",
                  "| bin from | " + " | ".join(arms) + " | picks without adapter | picks with adapter | tighter |",
                  "|---|" + "---|" * len(arms) + "---|---|---|"]
        for r in t["bins"]:
            pick = lambda p: f"{p['budget']} ({_f(p['attended_tokens_per_step'], '.1f')}/step)" if p["budget"] else p["status"]  # noqa: E731
            tighter = {True: "yes", False: "no", None: "—"}[r["tighter_with_adapter"]]
            lines.append(f"| {r['from']}{'' if r['qualifies'] else ' (not judged)'} | "
                         + " | ".join(r["decisions"][a]["decision"] for a in arms)
                         + f" | {pick(r['without_adapter'])} | {pick(r['with_adapter'])} | {tighter} |")
    lines += ["", f"Timings: {summary['timings']}", ""]
    return "\n".join(lines)


__all__ = ["analyse", "autopilot_decision", "policy_pick", "compare", "auto_target", "markdown", "kept_tokens"]
