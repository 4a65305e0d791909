"""Metric names that the deploy files (Grafana dashboard, Prometheus alert rules) query, and the
metrics contract of ``docs/metrics.md`` they must come from.

``metric_names_used_by_deploy()`` is the hook for a live test: scrape a running server's
``/metrics`` and check that every ``sparrow_`` name it returns is exported there (names are the
contract's base names: a query on ``sparrow_acceptance_bucket`` counts as ``sparrow_acceptance``).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"
CONTRACT_PATH = REPO_ROOT / "docs" / "metrics.md"
DASHBOARD_PATHS = tuple(sorted((DEPLOY_DIR / "grafana" / "dashboards").glob("*.json")))
RULES_PATHS = tuple(p for p in sorted((DEPLOY_DIR / "prometheus" / "rules").glob("*.yml")) if not p.name.endswith(".test.yml"))

# Series Prometheus itself synthesises for every target; not exported by anyone.
PROMETHEUS_BUILTINS = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                                 "scrape_samples_post_metric_relabeling", "scrape_series_added"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
PROMQL_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                             "unless", "bool", "offset", "inf", "nan"})
_CONTRACT_ROW = re.compile(r"^\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(counter|gauge|histogram|summary)\s*\|")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@lru_cache(maxsize=None)
def contract_metrics(path: Path = CONTRACT_PATH) -> dict[str, str]:
    """``{name: type}`` of every metric row in the contract's tables."""
    rows = (_CONTRACT_ROW.match(line.strip()) for line in path.read_text().splitlines())
    return {m.group(1): m.group(2) for m in rows if m}


def metric_names_in_promql(expr: str) -> set[str]:
    """Series names an expression selects (label values, ranges, grouping labels and functions excluded)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # string literals (label values, regexes)
    text = re.sub(r"\{[^}]*\}", " ", text)                     # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                    # range and subquery windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\blabel_values\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,[^)]*\)", r" \1 ", text)
    text = re.sub(r"\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?", " ", text)  # Grafana variables
    names = set()
    for match in _IDENT.finditer(text):
        name, rest = match.group(0), text[match.end():]
        if rest.lstrip().startswith("(") or name.lower() in PROMQL_KEYWORDS:
            continue  # a function call or a keyword
        if text[max(0, match.start() - 1)].isdigit() or name in {"e"}:
            continue  # exponent of a number literal such as 1e3
        names.add(name)
    return names


def base_metric_name(series_name: str, contract: dict[str, str] | None = None) -> str:
    """Fold a histogram's ``_bucket``/``_sum``/``_count`` series onto the contract's metric name."""
    contract = contract_metrics() if contract is None else contract
    for suffix in HISTOGRAM_SUFFIXES:
        base = series_name.removesuffix(suffix)
        if base != series_name and contract.get(base) in ("histogram", "summary"):
            return base
    return series_name


def dashboard_exprs(path: Path) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets (rows' nested panels too) and variables."""
    dashboard = json.loads(path.read_text())
    exprs = []
    stack = list(dashboard.get("panels", []))
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        exprs.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if variable.get("type") == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def rules_exprs(path: Path) -> list[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def deploy_exprs() -> dict[str, list[str]]:
    """``{file relative to the repo: [expressions]}`` for every dashboard and rules file."""
    out = {str(p.relative_to(REPO_ROOT)): dashboard_exprs(p) for p in DASHBOARD_PATHS}
    out.update({str(p.relative_to(REPO_ROOT)): rules_exprs(p) for p in RULES_PATHS})
    return out


def metric_names_used_by_deploy(prefix: str = "sparrow_") -> set[str]:
    """Contract (base) names of every metric with ``prefix`` that the dashboards and alert rules query.

    ``prefix=""`` returns every name, the router's ``smg_`` ones included (Prometheus's own
    synthetic series such as ``up`` are always left out).
    """
    contract = contract_metrics()
    names = {base_metric_name(n, contract) for exprs in deploy_exprs().values() for e in exprs
             for n in metric_names_in_promql(e)}
    return {n for n in names - PROMETHEUS_BUILTINS if n.startswith(prefix)}
