"""Every metric the Grafana dashboards and Prometheus alert rules query is exported by a running
server (scraped over HTTP after a verified sparse rollout, so labelled series exist), with the
type the metrics contract gives it; histograms export ``_bucket``, ``_sum`` and ``_count``."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.deploy_metrics import HISTOGRAM_SUFFIXES, contract_metrics, metric_names_used_by_deploy
from helpers.server_util import ServerProcess
from helpers.tiny_models import TINY_VOCAB, save_tiny_model

PROMPT = [(i * 3 + 1) % (TINY_VOCAB - 1) for i in range(40)]
SCHEDULE = {"budgets_tokens": [64], "dense_layers": [0], "threshold": 0.9}


@pytest.fixture(scope="module")
def scrape(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    model_dir = save_tiny_model(root / "model")
    (root / "state").mkdir()
    server = ServerProcess(model_dir, root / "state", timeout_s=400)
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            assert http.put("/schedules/dash-sparse", json=SCHEDULE).status_code == 200
            r = http.post("/rollout", json={"input_ids": PROMPT, "schedule": "dash-sparse", "verify": True,
                                            "sampling_params": {"max_new_tokens": 40, "seed": 0, "ignore_eos": True}})
            assert r.status_code == 200, r.text
            assert "acceptance_p5" in r.json()["meta"]
            text = http.get("/metrics").text
    finally:
        server.stop()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_metric_the_deploy_files_query_is_exported(scrape):
    used = metric_names_used_by_deploy()
    assert used, "no sparrow_ metric found in deploy/ (dashboards or rules)"
    contract = contract_metrics()
    assert used <= set(contract), f"not in docs/metrics.md: {sorted(used - set(contract))}"
    missing = sorted(n for n in used if n.removesuffix("_total") not in scrape and n not in scrape)
    assert not missing, f"queried by deploy/ but not exported: {missing}"


def test_contract_types_and_histogram_series(scrape):
    for name, kind in contract_metrics().items():
        if not name.startswith("sparrow_"):
            continue  # the router's (smg_) metrics come from the router, not from this server
        family = scrape.get(name.removesuffix("_total")) or scrape.get(name)
        assert family is not None, f"{name} is in the contract but not exported"
        assert family.type == kind, f"{name}: exported as {family.type}, contract says {kind}"
    for name in ("sparrow_acceptance", "sparrow_kv_budget_tokens"):
        series = {s.name for s in scrape[name].samples}
        assert {name + suffix for suffix in HISTOGRAM_SUFFIXES} <= series, f"{name}: {sorted(series)}"
    buckets = {s.labels["le"] for s in scrape["sparrow_acceptance"].samples if s.name.endswith("_bucket")}
    for edge in ("0.84", "0.86", "0.88", "0.9", "0.95", "0.99", "0.999", "1.0", "+Inf"):
        assert edge in buckets
