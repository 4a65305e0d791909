"""Prometheus metrics of the service (names and labels: ``docs/metrics.md``). Each app owns a
``CollectorRegistry`` so several apps in one process (tests) do not clash."""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sparrow_server.monitor.metrics import AcceptanceMetrics
from sparrow_server.engine.base import EngineHealth, GenerationChunk

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
KV_BUDGET_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("sparrow_requests_total", "Finished requests", ["endpoint", "schedule", "status"], registry=r)
        self.prompt_tokens = Counter("sparrow_prompt_tokens_total", "Prompt tokens admitted", ["schedule"], registry=r)
        self.generated_tokens = Counter("sparrow_generated_tokens_total", "Tokens generated", ["schedule", "adapter"], registry=r)
        self.latency = Histogram("sparrow_request_latency_seconds", "End-to-end request latency", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("sparrow_time_to_first_token_seconds", "Time to the first generated token", ["endpoint"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge("sparrow_running_requests", "Requests being decoded", registry=r)
        self.queued = Gauge("sparrow_queued_requests", "Admitted requests waiting for a slot", registry=r)
        self.kv_budget = Histogram("sparrow_kv_budget_tokens", "KV tokens attended per decode step per request (sparse layers)",
                                   ["schedule"], buckets=KV_BUDGET_BUCKETS, registry=r)
        self.adapter_inflight = Gauge("sparrow_adapter_inflight_requests", "In-flight requests per adapter version",
                                      ["adapter"], registry=r)
        self.acceptance = AcceptanceMetrics(r)  # tail mismatch (dense verification)
        self.weight_version = Gauge("sparrow_weight_version_info", "1 for the weights being served", ["weight_version"], registry=r)
        # More exposition text served on the same /metrics (SGLang's own metrics when mounted in its server).
        self.extra_sources: list[Callable[[], bytes]] = []

    def observe_chunk(self, schedule: str, chunk: GenerationChunk) -> None:
        self.generated_tokens.labels(schedule, chunk.adapter or "").inc(len(chunk.token_ids))
        for budget in chunk.kv_budget_tokens:
            if budget is not None:
                self.kv_budget.labels(schedule).observe(budget)

    def observe_finish(self, endpoint: str, schedule: str, status: str, latency_s: float) -> None:
        self.requests.labels(endpoint, schedule, status).inc()
        self.latency.labels(endpoint).observe(latency_s)

    def set_engine_state(self, health: EngineHealth, weight_version: str) -> None:
        self.queued.set(health.queued_requests)
        self.running.set(health.live_requests - health.queued_requests)
        self.weight_version.clear()
        self.weight_version.labels(weight_version).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry) + b"".join(source() for source in self.extra_sources)
