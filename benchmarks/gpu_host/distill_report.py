"""The DistillSparse GPU run's held-out report: p5 acceptance per length bin of three arms with 95% intervals
from a paired bootstrap over held-out prompts, the adapter's gain, and the verdict of the decision rule.

Arms (all on the same held-out tokens, sampled by the tight schedule without adapter):
``tight`` (no adapter), ``tight+adapter``, ``looser`` (the looser budget, no adapter: what the adapter
is meant to stand in for). Writes ``distill_summary.json``, ``distill_summary.md`` and
``distill_tokens.npz`` (per-token arrays: one row per held-out token).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from distill_rule import BinResult, DecisionRule, verdict
from sparrow_server.stats.cluster_bootstrap import paired_cluster_quantiles

TIGHT, ADAPTED, LOOSER = "tight", "tight+adapter", "looser"
ARMS = (TIGHT, ADAPTED, LOOSER)
GAIN, REFERENCE_GAP = (ADAPTED, TIGHT), (LOOSER, TIGHT)


def pooled(acc: Mapping[str, Sequence[np.ndarray]], prompt_lens: Sequence[int], clusters: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-rollout arrays -> pooled [N] arrays: each arm, ``length`` (tokens attended by the step that made
    the token: prompt + i, the schedules' ``total`` basis) and ``cluster`` (the held-out prompt)."""
    sizes = [a.size for a in acc[TIGHT]]
    for arm in ARMS:
        if [a.size for a in acc[arm]] != sizes:
            raise ValueError(f"acc[{arm!r}]: per-rollout sizes differ from {TIGHT!r}'s")
    out = {arm: np.concatenate(acc[arm]).astype(np.float64) for arm in ARMS}
    out["length"] = np.concatenate([np.arange(n) + p for n, p in zip(sizes, prompt_lens)]).astype(np.int64)
    out["cluster"] = np.concatenate([np.full(n, c) for n, c in zip(sizes, clusters)]).astype(np.int64)
    return out


def per_bin(tokens: Mapping[str, np.ndarray], rule: DecisionRule, seed: int = 0) -> list[dict[str, Any]]:
    """One row per non-empty length bin (``rule.bin_tokens`` wide): each arm's p5, mean and interval, the
    gain and the looser reference's gap, with paired intervals (prompts resampled)."""
    bins = tokens["length"] // rule.bin_tokens
    rows = []
    for b in np.unique(bins):
        mask = bins == b
        paired = paired_cluster_quantiles({arm: tokens[arm][mask] for arm in ARMS}, tokens["cluster"][mask],
                                          pairs=[GAIN, REFERENCE_GAP], q=rule.quantile, n_boot=rule.n_boot,
                                          confidence=rule.confidence, seed=seed + int(b))
        gain, gap = paired.diffs[GAIN], paired.diffs[REFERENCE_GAP]
        rows.append({"bin_index": int(b), "start": int(b) * rule.bin_tokens, "n_tokens": paired.n_tokens,
                     "n_prompts": paired.n_clusters, **paired.to_dict(),
                     "gap_closed": gain.estimate / gap.estimate if gap.estimate > 0 else None,
                     "gain": gain.to_dict(), "reference_gap": gap.to_dict()})
    return rows


def judge(rows: Sequence[Mapping[str, Any]], tokens: Mapping[str, np.ndarray], rule: DecisionRule) -> dict[str, Any]:
    results = [BinResult(r["bin_index"], r["start"], r["n_tokens"], r["gain"]["estimate"], r["gain"]["low"],
                         r["gain"]["high"]) for r in rows]
    return verdict(rule, results, float(tokens[ADAPTED].mean()), float(tokens[TIGHT].mean()))


def write_report(out: Path, tokens: Mapping[str, np.ndarray], rule: DecisionRule, run: Mapping[str, Any]) -> dict[str, Any]:
    """Bins, verdict and the run's record -> ``distill_summary.{json,md}`` and ``distill_tokens.npz``."""
    rows = per_bin(tokens, rule)
    decision = judge(rows, tokens, rule)
    summary = {"rule": rule.__dict__ | {"written_for": dict(rule.written_for)}, "verdict": decision["verdict"],
               "decision": decision, "pooled": {arm: {"p5": float(np.quantile(tokens[arm], rule.quantile)),
                                                     "mean": float(tokens[arm].mean())} for arm in ARMS},
               "bins": rows, "run": dict(run)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "distill_summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (out / "distill_summary.md").write_text(markdown(summary))
    np.savez_compressed(out / "distill_tokens.npz", **{k.replace("+", "_"): v for k, v in tokens.items()})
    return summary


def _ci(d: Mapping[str, float]) -> str:
    return f"{d['estimate']:.4f} [{d['low']:.4f}, {d['high']:.4f}]"


def markdown(summary: Mapping[str, Any]) -> str:
    rule, decision = summary["rule"], summary["decision"]
    lines = [f"# DistillSparse held-out acceptance: verdict **{summary['verdict']}** (rule `{rule['name']}`)", "",
             f"p{round(rule['quantile'] * 100)} per {rule['bin_tokens']}-token bin (total length), "
             f"{round(rule['confidence'] * 100)}% paired bootstrap over held-out prompts ({rule['n_boot']} resamples).", "",
             "| bin | tokens | prompts | tight | tight+adapter | looser | gain | gap closed | qualifies | passes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    judged = {r["bin_index"]: r for r in decision["bins"]}
    for r in summary["bins"]:
        j = judged[r["bin_index"]]
        closed = f"{r['gap_closed']:.2f}" if r["gap_closed"] is not None else "-"
        lines.append(f"| {r['start']}-{r['start'] + rule['bin_tokens'] - 1} | {r['n_tokens']} | {r['n_prompts']} | "
                     f"{_ci(r['arms'][TIGHT])} | {_ci(r['arms'][ADAPTED])} | {_ci(r['arms'][LOOSER])} | {_ci(r['gain'])} | "
                     f"{closed} | {j['qualifies']} | {j['passes']} |")
    pooled_rows = ", ".join(f"{arm} p5 {v['p5']:.4f} mean {v['mean']:.4f}" for arm, v in summary["pooled"].items())
    lines += ["", f"Pooled: {pooled_rows}. Mean drop with the adapter: {decision['mean_drop']:.4f}.", ""]
    lines += [f"- {reason}" for reason in decision["reasons"]] or ["- every qualifying bin passes"]
    return "\n".join(lines) + "\n"


__all__ = ["ARMS", "TIGHT", "ADAPTED", "LOOSER", "pooled", "per_bin", "judge", "write_report", "markdown"]
