"""The live-tail check's analysis and report (``live_tail.py``, ``host.sh 7``): the live per-bin p5 from the
server's ``/metrics`` against the float32 oracle's on the same tokens, the verdict, the Markdown table and the
per-token arrays. Standard library at import (numpy and prometheus_client where used).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

CHECK, FLOOR = "check", "floor"
MAX_MISSING_SHARE = 0.01  # kept positions without a value (re-prefilled, row store full) the check tolerates


def live_series(metrics_text: str) -> dict[str, dict[int, dict[str, float]]]:
    """{schedule: {bin: {"p5", "low", "high"}}} from the server's /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {"sparrow_acceptance_p5": "p5", "sparrow_acceptance_p5_low": "low", "sparrow_acceptance_p5_high": "high"}
    out: dict[str, dict[int, dict[str, float]]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in names:
                cell = out.setdefault(sample.labels["schedule"], {}).setdefault(int(sample.labels["length_bin"]), {})
                cell[names[sample.name]] = float(sample.value)
    return out


def kept_of(record: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(kept positions [K], server values [K] or None, missing kept positions) of one verified rollout. Without a
    subsample in ``meta`` (an engine verifying every position) the kept positions are all positions."""
    import numpy as np

    sub = (record.get("meta") or {}).get("exact_subsample")
    n = len(record["completion_ids"])
    if sub is None:
        return np.arange(n), None, np.zeros(0, dtype=np.int64)
    return (np.asarray(sub["positions"], dtype=np.int64), np.asarray(sub["acceptance"], dtype=np.float64),
            np.asarray(sub.get("missing", []), dtype=np.int64))


def _quantile(values: Any) -> float | None:
    import numpy as np

    return float(np.quantile(values, 0.05)) if len(values) else None


def analyse(records: Sequence[dict[str, Any]], live: dict[str, dict[int, dict[str, float]]], bin_tokens: int,
            tolerance: float, min_tokens: int | None = None) -> dict[str, Any]:
    """Per arm, per bin: the live p5 (``live``, from /metrics) against the oracle (``record["oracle"]``: [N] exact
    acceptance of every generated position, absent when not scored). Pure; see the module docstring."""
    import numpy as np

    from sparrow_server.monitor.metrics import DEFAULT_MIN_TOKENS
    from sparrow_server.stats.rolling import DEFAULT_MAX_BINS
    from sparrow_server.stats.tail import length_bins

    min_tokens = DEFAULT_MIN_TOKENS if min_tokens is None else min_tokens
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(r["arm"] for r in records):
        recs = [r for r in records if r["arm"] == arm]
        schedule = recs[0]["schedule"]
        ok = [r for r in recs if "error" not in r and "acceptance_error" not in (r.get("meta") or {})]
        scored = [r for r in ok if r.get("oracle") is not None]
        scored_ids = {id(r) for r in scored}
        cols: dict[str, list] = {k: [] for k in ("bin", "kept_bin", "oracle", "oracle_kept", "server_kept")}
        missing = kept_total = 0
        live_all: dict[int, list] = {}
        for r in ok:
            kept, values, miss = kept_of(r)
            missing, kept_total = missing + miss.size, kept_total + kept.size + miss.size
            basis = len(r["prompt_ids"]) + np.arange(len(r["completion_ids"]))
            if values is not None:
                for b, v in zip(length_bins(basis[kept], bin_tokens, DEFAULT_MAX_BINS), values):
                    live_all.setdefault(int(b), []).append(float(v))
            if id(r) in scored_ids:
                oracle = np.asarray(r["oracle"], dtype=np.float64)
                cols["bin"].append(length_bins(basis, bin_tokens, DEFAULT_MAX_BINS))
                cols["oracle"].append(oracle)
                cols["kept_bin"].append(length_bins(basis[kept], bin_tokens, DEFAULT_MAX_BINS))
                cols["oracle_kept"].append(oracle[kept])
                cols["server_kept"].append(values if values is not None else np.full(kept.size, np.nan))
        cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
        per_token = None
        if cat["server_kept"].size and not np.isnan(cat["server_kept"]).all():
            d = np.abs(cat["server_kept"] - cat["oracle_kept"])
            per_token = {"n": int(d.size), "median_abs": float(np.median(d)), "p99_abs": float(np.quantile(d, 0.99)),
                         "max_abs": float(d.max()), "mean_signed": float(np.mean(cat["server_kept"] - cat["oracle_kept"])),
                         "share_above_0.01": float((d > 0.01).mean())}
        series = live.get(schedule, {})
        bins = sorted(set(np.unique(cat["bin"]).astype(int).tolist()) | set(series))
        rows = []
        for b in bins:
            in_bin, kept_in = cat["bin"] == b, cat["kept_bin"] == b
            cell = series.get(b, {})
            row = {"bin": b, "from": b * bin_tokens, "tokens": int(in_bin.sum()), "kept_tokens": int(kept_in.sum()),
                   "live_p5": cell.get("p5"), "live_low": cell.get("low"), "live_high": cell.get("high"),
                   "live_p5_from_meta": _quantile(live_all.get(b, [])),
                   "oracle_p5": _quantile(cat["oracle"][in_bin]), "oracle_p5_kept": _quantile(cat["oracle_kept"][kept_in])}
            server_kept = cat["server_kept"][kept_in]
            row["server_p5_kept_scored"] = None if np.isnan(server_kept).all() else _quantile(server_kept)
            if row["live_p5"] is not None and row["live_p5_from_meta"] is not None:  # the window = these rollouts' values
                row["live_matches_meta"] = abs(row["live_p5"] - row["live_p5_from_meta"]) < 1e-6
            judged = row["kept_tokens"] >= min_tokens
            row["judged"] = judged
            if row["live_p5"] is not None and row["oracle_p5"] is not None:
                row["diff"] = row["live_p5"] - row["oracle_p5"]
                row["within"] = abs(row["diff"]) <= tolerance
                row["rounding"] = row["live_p5"] - row["oracle_p5_kept"]
                row["sampling"] = row["oracle_p5_kept"] - row["oracle_p5"]
                if row["live_low"] is not None and row["live_high"] is not None:
                    row["interval_covers"] = row["live_low"] <= row["oracle_p5"] <= row["live_high"]
            rows.append(row)
        reasons = []
        if len(ok) < len(recs):
            reasons.append(f"{len(recs) - len(ok)} of {len(recs)} rollouts not verified")
        if len(scored) < len(ok):
            reasons.append(f"{len(ok) - len(scored)} of {len(ok)} verified rollouts not scored by the oracle")
        notes = []
        if missing > MAX_MISSING_SHARE * max(kept_total, 1):
            reasons.append(f"{missing} of {kept_total} kept positions without a value")
        elif missing:  # left out of the live window and of the oracle at the kept positions alike
            notes.append(f"{missing} of {kept_total} kept positions without a value (left out on both sides)")
        mismatched = [r["bin"] for r in rows if r.get("live_matches_meta") is False]
        if mismatched:
            notes.append(f"bins {mismatched}: the live p5 is not the p5 of the responses' kept values (other "
                         "verified rollouts in the window?)")
        unpublished = [r["bin"] for r in rows if r["judged"] and r["live_p5"] is None]
        if unpublished:
            reasons.append(f"bins {unpublished} have enough kept tokens but no live p5")
        judged = [r for r in rows if r["judged"] and "within" in r]
        if not judged:
            reasons.append("no bin judged")
        failing = [r["bin"] for r in judged if not r["within"]]
        verdict = "insufficient" if reasons else ("fail" if failing else "pass")
        arms[arm] = {"schedule": schedule, "rollouts": len(recs), "verified": len(ok), "scored": len(scored),
                     "missing_kept": int(missing), "per_token": per_token, "bins": rows, "verdict": verdict,
                     "reasons": reasons, "notes": notes, "failing_bins": failing,
                     "max_abs_diff": max((abs(r["diff"]) for r in judged), default=None),
                     "max_abs_rounding": max((abs(r["rounding"]) for r in judged), default=None),
                     "max_abs_sampling": max((abs(r["sampling"]) for r in judged), default=None),
                     "interval_coverage": (float(np.mean([r["interval_covers"] for r in judged if "interval_covers" in r]))
                                           if any("interval_covers" in r for r in judged) else None)}
    return arms


def fmt(x: Any, spec: str = ".3f") -> str:
    """A table cell: — for None, yes/no for a bool, else ``format(x, spec)``."""
    return "—" if x is None else (("yes" if x else "no") if isinstance(x, bool) else format(x, spec))


def markdown(summary: dict[str, Any]) -> str:
    c = summary["config"]
    lines = [f"# Live tail check: verdict **{summary['verdict']}**", "",
             f"{summary['device']}; engine {c['engine']}; {c['rollouts']} + {c['floor_rollouts']} rollouts of "
             f"{c['total_tokens']} tokens; stride {c['stride']}; {c['bin_tokens']}-token bins; band ±{c['tolerance']}.", ""]
    for arm, a in summary["arms"].items():
        lines += [f"## {arm}: `{a['schedule']}`: {a['verdict']}" + (f" ({'; '.join(a['reasons'])})" if a["reasons"] else ""),
                  "", f"verified {a['verified']} / {a['rollouts']}, oracle-scored {a['scored']}; max |diff| "
                  f"{fmt(a['max_abs_diff'])} = rounding up to {fmt(a['max_abs_rounding'])} + sampling up to "
                  f"{fmt(a['max_abs_sampling'])}; interval coverage {fmt(a['interval_coverage'], '.2f')}.", ""]
        lines += [f"Note: {n}." for n in a["notes"]] + ([""] if a["notes"] else [])
        if a["per_token"]:
            t = a["per_token"]
            lines += [f"Per kept token, server vs oracle: median |Δ| {t['median_abs']:.4f}, p99 {t['p99_abs']:.4f}, "
                      f"max {t['max_abs']:.4f}, mean signed {t['mean_signed']:+.4f}, share > 0.01: {t['share_above_0.01']:.3f} "
                      f"({t['n']} tokens).", ""]
        lines += ["| bin from | tokens | kept | live p5 [interval] | oracle p5 (all) | diff | within | live − oracle kept "
                  "(rounding) | oracle kept − all (sampling) | covered |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in a["bins"]:
            mark = "" if r["judged"] else " (not judged)"
            lines.append(f"| {r['from']}{mark} | {r['tokens']} | {r['kept_tokens']} | {fmt(r['live_p5'])} "
                         f"[{fmt(r['live_low'])}, {fmt(r['live_high'])}] | {fmt(r['oracle_p5'])} | {fmt(r.get('diff'), '+.3f')} | "
                         f"{fmt(r.get('within'))} | {fmt(r.get('rounding'), '+.3f')} | {fmt(r.get('sampling'), '+.3f')} | "
                         f"{fmt(r.get('interval_covers'))} |")
        lines.append("")
    lines += [f"Timings: {json.dumps(summary['timings'])}", ""]
    return "\n".join(lines)


def save_tokens(path: Path, records: list[dict[str, Any]]) -> None:
    """Per token: arm, rollout, generated position, basis length, oracle value (NaN: not scored), kept, server value."""
    import numpy as np

    cols: dict[str, list] = {k: [] for k in ("arm", "rollout", "position", "basis", "oracle", "kept", "server")}
    for i, r in enumerate(records):
        if "error" in r:
            continue
        n = len(r["completion_ids"])
        kept, values, _ = kept_of(r)
        server = np.full(n, np.nan)
        if values is not None:
            server[kept] = values
        flag = np.zeros(n, dtype=bool)
        flag[kept] = True
        cols["arm"].append(np.full(n, 0 if r["arm"] == CHECK else 1, dtype=np.int8))
        cols["rollout"].append(np.full(n, i, dtype=np.int32))
        cols["position"].append(np.arange(n, dtype=np.int32))
        cols["basis"].append(len(r["prompt_ids"]) + np.arange(n, dtype=np.int32))
        cols["oracle"].append(np.asarray(r["oracle"], dtype=np.float32) if r.get("oracle") is not None
                              else np.full(n, np.nan, dtype=np.float32))
        cols["kept"].append(flag)
        cols["server"].append(server.astype(np.float32))
    np.savez_compressed(path, **{k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()})
