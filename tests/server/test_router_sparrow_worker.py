"""The real sglang-router in front of one sparrow server (tiny model, in this process): the router
registers the served model from ``/server_info`` (not ``unknown``), and its circuit breaker counts
refused requests, which docs/fleet.md and the deploy/ configs (``--disable-circuit-breaker``) rely
on. A 422 is the client's fault, not the worker's; the test shows the router still counts it."""
from __future__ import annotations

import httpx
import pytest

from helpers.fleet_util import RouterSettings, router_available, running_router
from helpers.live_server import live_server
from helpers.tiny_models import load_plain, save_tiny_model
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not router_available(), reason="sglang-router is not installed (pip install sglang-router)"),
]

GOOD = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
BAD = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2, "top_p": 5.0}}  # 422 at the server
REFUSALS = 12  # more than the breaker's default --cb-failure-threshold (10)


@pytest.fixture(scope="module")
def worker(tmp_path_factory, one_torch_thread):
    model_dir = save_tiny_model(tmp_path_factory.mktemp("model"))
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=1024)
    with live_server(create_app(engine)) as live:
        yield live


def after_refusals(worker, tmp_path, circuit_breaker: bool) -> tuple[list[int], int]:
    """Status codes of REFUSALS bad requests through the router, then of one good request."""
    settings = RouterSettings(health_check_interval_s=60, circuit_breaker=circuit_breaker)
    with running_router([worker.url], tmp_path, settings) as router:
        assert httpx.post(f"{router.url}/generate", json=GOOD, timeout=30).status_code == 200
        codes = [httpx.post(f"{router.url}/generate", json=BAD, timeout=30).status_code for _ in range(REFUSALS)]
        return codes, httpx.post(f"{router.url}/generate", json=GOOD, timeout=30).status_code


def test_refused_requests_open_the_default_breaker(worker, tmp_path):
    codes, good = after_refusals(worker, tmp_path, circuit_breaker=True)
    assert codes == [422] * 10 + [503] * (REFUSALS - 10) and good == 503  # the worker is healthy all along


def test_disabled_breaker_keeps_serving(worker, tmp_path):
    codes, good = after_refusals(worker, tmp_path, circuit_breaker=False)
    assert codes == [422] * REFUSALS and good == 200


def test_router_registers_the_served_model(worker, tmp_path):
    with running_router([worker.url], tmp_path) as router:
        (registered,) = router.workers()
        assert registered["model_id"] == "tiny" and registered["metadata"]["model_path"] == "tiny"
        assert [m["id"] for m in httpx.get(f"{router.url}/v1/models", timeout=10).json()["data"]] == ["tiny"]
