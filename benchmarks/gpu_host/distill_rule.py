"""The DistillSparse decision rule (``benchmarks/distill/decision_rule.json``, committed before any GPU
training): read and checked here, then applied to a run's per-bin results.

The verdict is one of ``pass`` / ``fail`` / ``insufficient`` (too few bins qualified to judge, e.g. a run
cut by its deadline), with the reason for every bin, so a reader can see which condition decided it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

RULE = Path(__file__).resolve().parents[1] / "distill" / "decision_rule.json"
PASS, FAIL, INSUFFICIENT = "pass", "fail", "insufficient"


class RuleError(ValueError):
    """A bad decision-rule file; the message names the file and the field."""


@dataclass(frozen=True)
class DecisionRule:
    name: str
    quantile: float
    bin_tokens: int
    min_bin_start_tokens: int
    min_bin_tokens: int
    min_bins: int
    min_gain: float
    ci_low_above: float
    confidence: float
    n_boot: int
    max_mean_drop: float
    written_for: Mapping[str, Any]


@dataclass(frozen=True)
class BinResult:
    """One length bin: the gain (adapter minus no adapter) in p5 with its interval."""

    bin_index: int
    start: int
    n_tokens: int
    gain: float
    gain_low: float
    gain_high: float


_INTS = ("bin_tokens", "min_bin_start_tokens", "min_bin_tokens", "min_bins", "n_boot")
_FLOATS = ("quantile", "min_gain", "ci_low_above", "confidence", "max_mean_drop")


def load_rule(path: str | Path = RULE) -> DecisionRule:
    """Read and check a rule file; ``RuleError`` names the field and its value."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RuleError(f"decision rule {str(path)!r}: {exc}") from None
    if not isinstance(data, dict):
        raise RuleError(f"decision rule {str(path)!r}: must be a JSON object")
    missing = [k for k in ("name", *_INTS, *_FLOATS) if k not in data]
    if missing:
        raise RuleError(f"decision rule {str(path)!r}: missing field(s) {missing}")
    for key in _INTS:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "min_bin_start_tokens" else 1):
            raise RuleError(f"decision rule {str(path)!r}: {key} = {value!r}: must be an integer >= "
                            f"{0 if key == 'min_bin_start_tokens' else 1}")
    for key in _FLOATS:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RuleError(f"decision rule {str(path)!r}: {key} = {value!r}: must be a finite number")
    for key in ("quantile", "confidence"):
        if not 0 < data[key] < 1:
            raise RuleError(f"decision rule {str(path)!r}: {key} = {data[key]!r}: must be in (0, 1)")
    if data["max_mean_drop"] < 0:
        raise RuleError(f"decision rule {str(path)!r}: max_mean_drop = {data['max_mean_drop']!r}: must be >= 0")
    return DecisionRule(name=str(data["name"]), written_for=dict(data.get("written_for", {})),
                        **{k: data[k] for k in (*_INTS, *_FLOATS)})


def qualifies(rule: DecisionRule, start: int, n_tokens: int) -> bool:
    return start >= rule.min_bin_start_tokens and n_tokens >= rule.min_bin_tokens


def bin_reason(rule: DecisionRule, b: BinResult) -> str | None:
    """Why a qualifying bin fails the rule, or None when it passes."""
    if not b.gain >= rule.min_gain:  # NaN fails too
        return f"gain {b.gain:.4f} < min_gain {rule.min_gain}"
    if not b.gain_low > rule.ci_low_above:
        return f"interval low {b.gain_low:.4f} <= {rule.ci_low_above}"
    return None


def verdict(rule: DecisionRule, bins: Sequence[BinResult], mean_with: float, mean_without: float) -> dict[str, Any]:
    """Apply the rule: ``{"verdict", "bins": [{..., "qualifies", "reason"}], "mean_drop", "reasons"}``."""
    rows, reasons = [], []
    for b in bins:
        ok = qualifies(rule, b.start, b.n_tokens)
        reason = bin_reason(rule, b) if ok else None
        rows.append({**b.__dict__, "qualifies": ok, "passes": ok and reason is None, "reason": reason})
        if reason:
            reasons.append(f"bin {b.start}-{b.start + rule.bin_tokens - 1}: {reason}")
    mean_drop = mean_without - mean_with
    if not mean_drop <= rule.max_mean_drop:
        reasons.append(f"mean drop {mean_drop:.4f} > max_mean_drop {rule.max_mean_drop}")
    n_qualifying = sum(r["qualifies"] for r in rows)
    if n_qualifying < rule.min_bins:
        outcome = INSUFFICIENT
        reasons.insert(0, f"{n_qualifying} qualifying bin(s) < min_bins {rule.min_bins}")
    else:
        outcome = FAIL if reasons else PASS
    return {"rule": rule.name, "verdict": outcome, "n_qualifying_bins": n_qualifying, "mean_drop": mean_drop,
            "reasons": reasons, "bins": rows}


__all__ = ["RULE", "PASS", "FAIL", "INSUFFICIENT", "RuleError", "DecisionRule", "BinResult", "load_rule", "verdict"]
