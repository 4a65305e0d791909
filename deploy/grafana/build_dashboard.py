"""Writes ``deploy/grafana/dashboards/sparrow.json``, the Sparrow fleet dashboard.

The JSON is generated so that every query is written once, here; ``tests/e2e/test_deploy.py`` checks
that the committed file equals this script's output and that every metric it queries is in
``docs/metrics.md``. Regenerate after editing:  python deploy/grafana/build_dashboard.py
"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "sparrow.json"
DASHBOARD_UID = "sparrow-fleet"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Every sparrow query is restricted to the selected servers and schedules.
SEL = 'instance=~"$instance", schedule=~"$schedule"'
SEL_INSTANCE = 'instance=~"$instance"'
THRESHOLD_COLOR = "red"


def target(expr: str, legend: str = "", ref: str = "A", **extra) -> dict:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref, **extra}


def panel(kind: str, title: str, grid: tuple[int, int, int, int], targets: list[dict], description: str = "",
          unit: str = "short", **extra) -> dict:
    x, y, w, h = grid
    fields = extra.pop("fieldConfig", {"defaults": {"unit": unit}, "overrides": []})
    return {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": w, "h": h}, "targets": targets, "fieldConfig": fields, **extra}


def row(title: str, y: int) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def threshold_line_override(name_regex: str) -> dict:
    """Draw the series whose name matches as a dashed red line (the schedule's threshold)."""
    return {"matcher": {"id": "byRegexp", "options": name_regex},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": THRESHOLD_COLOR}},
                           {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "custom.lineWidth", "value": 2}]}


def acceptance_row(y: int) -> list[dict]:
    p5 = target(f"min by (schedule, length_bin) (sparrow_acceptance_p5{{{SEL}}})", "{{schedule}} bin {{length_bin}}")
    threshold = target(f"max by (schedule) (sparrow_acceptance_threshold{{{SEL}}})", "threshold {{schedule}}", "B")
    p5_fields = {"defaults": {"unit": "percentunit", "min": 0.5, "max": 1, "decimals": 3},
                 "overrides": [threshold_line_override("threshold .*")]}
    now_fields = {"defaults": {"unit": "percentunit", "min": 0.5, "max": 1, "decimals": 3,
                               "thresholds": {"mode": "absolute", "steps": [
                                   {"color": "red", "value": None}, {"color": "green", "value": 0.86}]}},
                  "overrides": []}
    heatmap = target(f"sum by (le) (increase(sparrow_acceptance_bucket{{{SEL}}}[$__rate_interval]))",
                     "{{le}}", format="heatmap")
    return [
        row("Tail mismatch (dense verification)", y),
        panel("timeseries", "p5 acceptance per length bin vs threshold", (0, y + 1, 16, 9), [p5, threshold],
              "Rolling exact 5th percentile of per-token acceptance per 2,000-token length bin (worst server "
              "of the selection), against the schedule's calibrated threshold (dashed red). Training is safe "
              "while every bin stays above its line.", fieldConfig=p5_fields,
              options={"legend": {"displayMode": "table", "placement": "right", "calcs": ["min", "lastNotNull"]},
                       "tooltip": {"mode": "multi", "sort": "asc"}}),
        panel("bargauge", "p5 now, by length bin", (16, y + 1, 8, 9),
              [target(f"min by (length_bin) (sparrow_acceptance_p5{{{SEL}}})", "bin {{length_bin}}", instant=True)],
              "Current worst p5 per length bin; red below 0.86 (edit the threshold step for other schedules).",
              fieldConfig=now_fields, options={"orientation": "horizontal", "displayMode": "gradient"}),
        panel("heatmap", "Per-token acceptance (histogram)", (0, y + 10, 12, 9), [heatmap],
              "Distribution of per-token acceptance over time from sparrow_acceptance buckets. Most tokens sit "
              "at 0.99-1; the tail below the threshold is what the p5 tracks.",
              options={"calculate": False, "yAxis": {"unit": "percentunit"}, "cellGap": 1,
                       "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5},
                       "rowsFrame": {"layout": "le"}, "tooltip": {"show": True, "yHistogram": True}}),
        panel("timeseries", "Tail violations", (12, y + 10, 6, 9),
              [target(f"sum by (schedule, length_bin) (increase(sparrow_tail_violations_total{{{SEL}}}[$__rate_interval]))",
                      "{{schedule}} bin {{length_bin}}")],
              "Times the rolling p5 fell below the schedule's threshold.", options={"legend": {"displayMode": "list"}},
              fieldConfig={"defaults": {"unit": "short", "custom": {"drawStyle": "bars"}}, "overrides": []}),
        panel("timeseries", "Verified tokens/s", (18, y + 10, 6, 9),
              [target(f"sum by (schedule) (rate(sparrow_verified_tokens_total{{{SEL}}}[$__rate_interval]))", "{{schedule}}"),
               target(f"sum(rate(sparrow_verified_requests_total{{{SEL}}}[$__rate_interval])) / "
                      f"sum(rate(sparrow_requests_total{{{SEL}}}[$__rate_interval]))", "verified share of requests", "B")],
              "Tokens re-scored densely per second; the share should sit near the verify fraction (default 5%).",
              fieldConfig={"defaults": {"unit": "short"},
                           "overrides": [{"matcher": {"id": "byName", "options": "verified share of requests"},
                                          "properties": [{"id": "unit", "value": "percentunit"},
                                                         {"id": "custom.axisPlacement", "value": "right"}]}]}),
    ]


def autopilot_row(y: int) -> list[dict]:
    budget = target(f"max by (schedule, length_bin) (sparrow_schedule_budget_tokens{{{SEL}}})",
                    "{{schedule}} bin {{length_bin}}")
    ceiling = target(f"max by (schedule) (sparrow_autopilot_ceiling_tokens{{{SEL}}})", "ceiling {{schedule}}", "B")
    p5 = target(f"min by (schedule, length_bin) (sparrow_autopilot_p5{{{SEL}}})", "{{schedule}} bin {{length_bin}}")
    goal = target(f"max by (schedule) (sparrow_autopilot_target{{{SEL}}})", "target {{schedule}}", "B")
    return [
        row("Schedule autopilot", y),
        panel("timeseries", "Live KV budget per length bin (autopilot)", (0, y + 1, 9, 8), [budget, ceiling],
              "The budget each length bin of the served schedule version has; the autopilot raises a bin fast "
              "when its p5 falls below the target and lowers it one page at a time while p5 clears target + "
              "margin. The dashed red line is the autopilot's ceiling.",
              fieldConfig={"defaults": {"unit": "short", "custom": {"drawStyle": "line", "lineInterpolation": "stepAfter"}},
                           "overrides": [threshold_line_override("ceiling .*")]}),
        panel("timeseries", "Autopilot p5 per bin vs target", (9, y + 1, 9, 8), [p5, goal],
              "p5 of each bin's evidence window (verified tokens at the bin's current budget, current weights) "
              "against the autopilot's target (dashed red).",
              fieldConfig={"defaults": {"unit": "percentunit", "min": 0.5, "max": 1, "decimals": 3},
                           "overrides": [threshold_line_override("target .*")]}),
        panel("timeseries", "Schedule version and autopilot changes", (18, y + 1, 6, 8),
              [target(f"max by (schedule) (sparrow_schedule_version{{{SEL}}})", "version {{schedule}}"),
               target(f"sum by (schedule, reason) (increase(sparrow_autopilot_changes_total{{{SEL}}}[$__rate_interval]))",
                      "{{reason}} {{schedule}}", "B")],
              "The version new requests resolve (one per server: a fleet autopilot keeps them equal) and the "
              "budget changes per interval by reason (raise, lower, follow).", unit="short"),
    ]


def throughput_row(y: int) -> list[dict]:
    kv = [target(f"histogram_quantile({q}, sum by (schedule, le) (rate(sparrow_kv_budget_tokens_bucket{{{SEL}}}[$__rate_interval])))",
                 f"p{int(q * 100)} {{{{schedule}}}}", ref)
          for q, ref in ((0.5, "A"), (0.95, "B"))]
    kv.append(target(f"sum by (schedule) (rate(sparrow_kv_budget_tokens_sum{{{SEL}}}[$__rate_interval])) / "
                     f"sum by (schedule) (rate(sparrow_kv_budget_tokens_count{{{SEL}}}[$__rate_interval]))",
                     "mean {{schedule}}", "C"))
    return [
        row("Throughput and sparsity", y),
        panel("timeseries", "Generated tokens/s by schedule", (0, y + 1, 8, 8),
              [target(f"sum by (schedule) (rate(sparrow_generated_tokens_total{{{SEL}}}[$__rate_interval]))", "{{schedule}}"),
               target(f"sum(rate(sparrow_prompt_tokens_total{{{SEL}}}[$__rate_interval]))", "prompt tokens/s (all)", "B")],
              "Decode throughput of the selected servers, split by schedule.",
              fieldConfig={"defaults": {"unit": "short", "custom": {"stacking": {"mode": "normal"}}},
                           "overrides": [{"matcher": {"id": "byName", "options": "prompt tokens/s (all)"},
                                          "properties": [{"id": "custom.stacking", "value": {"mode": "none"}},
                                                         {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [4, 4]}}]}]}),
        panel("timeseries", "KV budget per decode step", (8, y + 1, 8, 8), kv,
              "KV tokens each request attends to per decode step on sparse layers (the schedule's budget for its "
              "current length bin, capped by the context).", unit="short"),
        panel("timeseries", "Requests/s by status", (16, y + 1, 8, 8),
              [target(f"sum by (endpoint, status) (rate(sparrow_requests_total{{{SEL}}}[$__rate_interval]))",
                      "{{endpoint}} {{status}}")],
              "Finished requests per second by endpoint and status (ok, aborted, error)."),
    ]


def latency_row(y: int) -> list[dict]:
    def quantiles(metric: str) -> list[dict]:
        return [target(f"histogram_quantile({q}, sum by (endpoint, le) (rate({metric}_bucket{{{SEL_INSTANCE}}}[$__rate_interval])))",
                       f"p{int(q * 100)} {{{{endpoint}}}}", ref)
                for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))]

    return [
        row("Latency and load", y),
        panel("timeseries", "Request latency", (0, y + 1, 8, 8), quantiles("sparrow_request_latency_seconds"),
              "End-to-end latency quantiles per endpoint.", unit="s"),
        panel("timeseries", "Time to first token", (8, y + 1, 8, 8), quantiles("sparrow_time_to_first_token_seconds"),
              "Time to the first generated token per endpoint.", unit="s"),
        panel("timeseries", "Running and queued requests", (16, y + 1, 8, 8),
              [target(f"sum by (instance) (sparrow_running_requests{{{SEL_INSTANCE}}})", "running {{instance}}"),
               target(f"sum by (instance) (sparrow_queued_requests{{{SEL_INSTANCE}}})", "queued {{instance}}", "B")],
              "Requests being decoded and admitted requests waiting for a slot, per server."),
    ]


def adapters_row(y: int) -> list[dict]:
    return [
        row("Adapters and weights", y),
        panel("timeseries", "Adapter in use (in-flight requests)", (0, y + 1, 12, 8),
              [target(f"sum by (adapter) (sparrow_adapter_inflight_requests{{{SEL_INSTANCE}}})", "{{adapter}}")],
              "In-flight requests per adapter version across the selected servers; a rollout to a new version "
              "shows as one series taking over from the previous one.",
              fieldConfig={"defaults": {"unit": "short", "custom": {"stacking": {"mode": "normal"}, "fillOpacity": 30}},
                           "overrides": []}),
        panel("table", "Weights served", (12, y + 1, 12, 8),
              [target(f"sparrow_weight_version_info{{{SEL_INSTANCE}}} == 1", "", format="table", instant=True)],
              "Base weight version per server (after /update_weights_from_disk every server should agree).",
              transformations=[{"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True, "__name__": True},
                  "indexByName": {"instance": 0, "weight_version": 1}}}]),
    ]


def router_row(y: int) -> list[dict]:
    return [
        row("Router (sglang-router)", y),
        panel("stat", "Healthy workers", (0, y + 1, 6, 6),
              [target("sum(smg_worker_health)", "healthy"), target("count(smg_worker_health)", "registered", "B")],
              "Workers the router considers healthy, of those registered."),
        panel("timeseries", "Router requests/s", (6, y + 1, 9, 6),
              [target("sum by (endpoint) (rate(smg_router_requests_total[$__rate_interval]))", "{{endpoint}}")],
              "Requests the router accepted, by endpoint."),
        panel("timeseries", "Router retries/s", (15, y + 1, 9, 6),
              [target("sum by (endpoint) (rate(smg_worker_retries_total[$__rate_interval]))", "{{endpoint}}")],
              "Requests the router re-sent to another worker (connection errors, 5xx, 429)."),
    ]


def variables() -> list[dict]:
    def query_var(name: str, label: str, query: str) -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
                "query": {"query": query, "refId": f"var-{name}"}, "definition": query,
                "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "sort": 1,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        query_var("instance", "Server", "label_values(sparrow_requests_total, instance)"),
        query_var("schedule", "Schedule", 'label_values(sparrow_requests_total{instance=~"$instance"}, schedule)'),
    ]


def dashboard() -> dict:
    panels = [*acceptance_row(0), *autopilot_row(20), *throughput_row(29), *latency_row(38), *adapters_row(47),
              *router_row(56)]
    for panel_id, item in enumerate(panels, start=1):
        item["id"] = panel_id
    return {
        "uid": DASHBOARD_UID, "title": "Sparrow: sparse rollouts", "tags": ["sparrow", "sglang", "rl"],
        "description": "Tail mismatch (p5 acceptance per length bin vs the schedule's threshold), the schedule "
                       "autopilot, sparsity, "
                       "throughput, latency, adapters and the router of a Sparrow fleet. Metrics: docs/metrics.md.",
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"}, "timezone": "utc",
        "templating": {"list": variables()},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
