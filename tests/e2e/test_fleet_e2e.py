"""A CPU fleet end to end: three reference-engine servers behind the real ``sglang-router``; a
client drives schedule-carrying ``/generate`` rollouts through the router while one server is
SIGKILLed and restarted. Every request completes exactly once from the client's view, the
schedule survives the router (``extra_key``), and the restarted server gets traffic again.

Exactly-once, as tested here: the client sends each request with a ``rid`` and resends the same
body after a connection error, 408/409/429 or 5xx (``sparrow_server.client``); it returns one
result per call, whose ``meta_info.id`` is that ``rid``. A server refuses a ``rid`` that is live on
it with 409 (the router passes 409 through without trying another worker), so a retry never runs
beside its own earlier attempt on one server. Across servers nothing de-duplicates: a request cut
off by a dying server runs again elsewhere (its first run is lost with the server).

The servers are forked from one process that imported the server once
(``helpers.forked_servers``): each is its own ``sparrow-server serve`` process and dies for real
under SIGKILL. The fast tests at the top check the schedule precedence, ``/model_info`` and the
client's ``/generate`` body in-process.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from helpers.forked_servers import ForkedServer, Zygote, wait_for, wait_healthy
from helpers.pause_util import continue_generation, pause_in_place

SPARSE_SCHEDULE = {"budgets_tokens": [64], "dense_layers": [0], "description": "fleet test: 4 pages of KV"}
SCHEDULE_NAME = "fleet-sparse"
PROMPT_LEN = 48
NEW_TOKENS = 48  # prompt + generation = 96 tokens > the 64-token budget, so the schedule is visibly sparse


# ---------------------------------------------------------------------------------------------
# Fast, in-process: schedule precedence on /generate, /model_info, the client's /generate body.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api():
    from fastapi.testclient import TestClient

    from helpers.fake_engine import FakeEngine
    from sparrow_server.server.app import create_app
    from sparrow_server.sparsity.registry import ScheduleRegistry
    from sparrow_server.sparsity.schedule import schedule_from_dict

    schedules = ScheduleRegistry()
    schedules.register(schedule_from_dict({"name": SCHEDULE_NAME, **SPARSE_SCHEDULE}))
    with TestClient(create_app(FakeEngine(), schedules, default_schedule="dense")) as client:
        yield client


def _schedule_of(api, **body) -> tuple[int, dict]:
    body = {"input_ids": [1, 2, 3], **body}
    body["sampling_params"] = {"max_new_tokens": 2, **body.get("sampling_params", {})}
    response = api.post("/generate", json=body)
    return response.status_code, response.json()


@pytest.mark.parametrize("body, expected", [
    ({}, "dense"),  # the server's default
    ({"extra_key": f"sparrow_schedule={SCHEDULE_NAME}"}, SCHEDULE_NAME),
    ({"extra_key": "some-cache-salt"}, "dense"),  # any other extra_key is only a cache salt
    ({"sampling_params": {"custom_params": {"sparrow_schedule": SCHEDULE_NAME}}}, SCHEDULE_NAME),
    ({"sampling_params": {"custom_params": {"sparrow_schedule": "dense"}},
      "extra_key": f"sparrow_schedule={SCHEDULE_NAME}"}, "dense"),  # custom_params first
])
def test_generate_schedule_precedence(api, body, expected):
    status, answer = _schedule_of(api, **body)
    assert status == 200, answer
    assert answer["meta_info"]["sparrow"]["schedule"] == expected
    assert answer["meta_info"]["sparrow"]["schedule_id"].startswith(f"{expected}@")


def test_generate_schedule_errors_are_4xx(api):
    status, answer = _schedule_of(api, extra_key="sparrow_schedule=no-such-schedule")
    assert (status, answer["error"]["type"], answer["error"]["name"]) == (404, "unknown_schedule", "no-such-schedule")
    status, answer = _schedule_of(api, extra_key="sparrow_schedule=")
    assert (status, answer["error"]["field"]) == (422, "extra_key")


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info_has_sglangs_fields(api, path):
    info = api.get(path).json()
    assert set(info) >= {"model_path", "tokenizer_path", "is_generation", "weight_version"}
    assert info["is_generation"] is True and info["tokenizer_path"] is None  # the fake engine has no tokenizer


def test_client_generate_body_carries_the_schedule_both_ways():
    from sparrow_server.client import generate_payload

    body = generate_payload({"input_ids": [1], "sampling_params": {"n": 2}}, schedule=SCHEDULE_NAME)
    assert body["sampling_params"] == {"n": 2, "custom_params": {"sparrow_schedule": SCHEDULE_NAME}}
    assert body["extra_key"] == f"sparrow_schedule={SCHEDULE_NAME}" and body["rid"] and body["stream"] is False
    named = {"rid": "r1", "sampling_params": {"custom_params": {"sparrow_schedule": "dense"}}}
    assert generate_payload(named)["extra_key"] == "sparrow_schedule=dense"  # mirrored from custom_params
    assert generate_payload(named)["rid"] == "r1"
    assert "extra_key" not in generate_payload({"input_ids": [1]})
    with pytest.raises(ValueError, match="extra_key"):
        generate_payload({"extra_key": "salt"}, schedule=SCHEDULE_NAME)
    with pytest.raises(ValueError, match="custom_params"):
        generate_payload(named, schedule=SCHEDULE_NAME)
    batch = generate_payload({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {}]}, schedule=SCHEDULE_NAME)
    assert [p["custom_params"] for p in batch["sampling_params"]] == [{"sparrow_schedule": SCHEDULE_NAME}] * 2
    assert batch["sampling_params"][0]["n"] == 2 and batch["extra_key"] == f"sparrow_schedule={SCHEDULE_NAME}"
    with pytest.raises(ValueError, match="several schedules"):
        generate_payload({"sampling_params": [named["sampling_params"], {"custom_params": {"sparrow_schedule": "x"}}]})


def test_client_resends_the_same_rid_after_the_routers_500():
    """What the router answers when a worker dies under a request and its retries are spent
    (observed with sglang-router 0.3.2): the client re-sends the same body and returns one result."""
    from sparrow_server.client import RetryPolicy, SparrowClient

    bodies: list[dict] = []
    cut = {"error": {"type": "Internal Server Error", "code": "call_upstream_request_error",
                     "message": "error sending request for url (http://127.0.0.1:1/generate)"}}

    def router(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            return httpx.Response(500, json=cut)
        return httpx.Response(200, json={"output_ids": [5], "meta_info": {"id": bodies[-1]["rid"]}})

    http = httpx.Client(transport=httpx.MockTransport(router), base_url="http://router")
    with SparrowClient(http=http, retry=RetryPolicy(retries=2, backoff_s=0.0)) as client:
        answer = client.generate({"input_ids": [1, 2]}, schedule=SCHEDULE_NAME)
    assert len(bodies) == 2 and bodies[0] == bodies[1] and answer["meta_info"]["id"] == bodies[0]["rid"]


# ---------------------------------------------------------------------------------------------
# The fleet: 3 forked servers + the real router; kill one mid-rollout, restart it, check it rejoins.
# ---------------------------------------------------------------------------------------------

N_SERVERS = 3
N_ROLLOUTS = 24
CONCURRENCY = 6  # requests in flight at once, so the victim is busy when it dies
CLIENT_RETRY = dict(retries=6, backoff_s=0.2)
# round_robin: every server gets its share, deterministically. A generous health-check timeout keeps
# a busy server from being dropped on a loaded machine; a killed one still drops at once (refused).
# The circuit breaker is off, as in deploy/ (RouterSettings' default): with it on, the edge checks' 4xx
# answers and the requests cut by the kill opened it on the victim on CI, and the restarted server
# served nothing after rejoining.
ROUTER = dict(policy="round_robin", health_check_timeout_s=5)
SERVER_ARGS = ("--device", "cpu", "--threads", "1", "--kv-pool-tokens", "8192", "--max-batch-size", "8",
               "--log-level", "warning")


@dataclass
class Fleet:
    zygote: Zygote
    model: Path
    state_root: Path
    servers: list[ForkedServer]

    def start(self, index: int, port: int) -> ForkedServer:
        state = self.state_root / f"state-{index}"  # kept across a restart: registered schedules persist
        return self.zygote.serve(port, "--model", str(self.model), "--state-dir", str(state), *SERVER_ARGS)

    def restart(self, index: int) -> ForkedServer:
        self.servers[index] = self.start(index, self.servers[index].port)
        wait_healthy(self.servers[index])
        return self.servers[index]


@contextlib.contextmanager
def _fleet(tmp_path: Path) -> Iterator[Fleet]:
    from helpers.fleet_util import free_port
    from helpers.tiny_models import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    zygote = Zygote(tmp_path)
    fleet = Fleet(zygote, model, tmp_path, [])
    try:
        fleet.servers = [fleet.start(i, free_port()) for i in range(N_SERVERS)]
        for server in fleet.servers:
            wait_healthy(server)
        yield fleet
    finally:
        for server in fleet.servers:
            server.kill()
        zygote.close()


def _prompt(i: int) -> list[int]:
    return [(7 * i + j) % 100 + 1 for j in range(PROMPT_LEN)]


def _payload(i: int, rid: str) -> dict:
    return {"input_ids": _prompt(i), "rid": rid, "return_logprob": True,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "sampling_seed": i}}


def _served_generate(server: ForkedServer) -> float:
    """Finished ``/generate`` requests of ``server`` (its ``sparrow_requests_total``)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "sparrow_requests_total" and sample.labels.get("endpoint") == "generate")


async def _drive(router_url: str, rids: list[str], on_attempt) -> dict[str, list[dict]]:
    """Send every rid once through the router with the client's retries; results grouped by rid."""
    from sparrow_server.client import AsyncSparrowClient, RetryPolicy

    async def hook(request: httpx.Request) -> None:
        on_attempt([json.loads(request.content)["rid"]])

    http = httpx.AsyncClient(base_url=router_url, timeout=60, event_hooks={"request": [hook]})
    results: dict[str, list[dict]] = collections.defaultdict(list)
    semaphore = asyncio.Semaphore(CONCURRENCY)
    async with AsyncSparrowClient(http=http, retry=RetryPolicy(**CLIENT_RETRY)) as client:
        async def one(i: int, rid: str) -> None:
            async with semaphore:
                answer = await client.generate(_payload(i, rid), schedule=SCHEDULE_NAME)
            results[rid].append(answer)

        await asyncio.gather(*(one(i, rid) for i, rid in enumerate(rids)))
    return results


def _health(server: ForkedServer) -> dict:
    """``/health``'s body (503 while generation is paused, with the same fields)."""
    return httpx.get(f"{server.url}/health", timeout=10).json()


def _kill_when_busy_then_restart(fleet: Fleet, router, victim: int, log: list[str]) -> int:
    """Freeze the victim in place while it holds routed requests, SIGKILL it, wait until the router
    drops it, restart it on its port; returns how many requests it held when killed.

    While paused in place nothing on the victim finishes (no step runs; routed requests arriving
    meanwhile queue), so the requests counted under the pause are all live at the SIGKILL, however
    slowly the kill follows. Its requests may all end before a pause lands (48 tokens each): then it
    goes on and the next ones are caught."""
    server = fleet.servers[victim]
    while True:
        wait_for(lambda: _health(server)["live_requests"] > 0, 30, "the victim to have requests in flight",
                 interval_s=0.02)
        pause_in_place(server.url)
        held = _health(server)["live_requests"]
        if held:
            break
        continue_generation(server.url)
    server.kill()
    log.append("killed")
    router.wait_unhealthy(server.url, timeout_s=15)
    log.append("dropped")
    fleet.restart(victim)
    router.wait_healthy([server.url], timeout_s=30)
    log.append("rejoined")
    return held


def _router_retries(router) -> float:
    """``smg_worker_retries_total``: requests the router re-sent to another worker."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(router.metrics_text())
               for sample in family.samples if sample.name == "smg_worker_retries_total")


def _check_routing_edges(router, fleet: Fleet) -> None:
    """What the router does with the schedule fields and with errors (not retried elsewhere)."""
    body = {"input_ids": _prompt(0), "sampling_params": {"max_new_tokens": 2, "custom_params": {"sparrow_schedule": SCHEDULE_NAME}}}
    answer = router.client.post(f"{router.url}/generate", json=body).json()
    assert answer["meta_info"]["sparrow"]["schedule"] == "dense"  # custom_params dropped by the router
    unknown = router.client.post(f"{router.url}/generate", json={**body, "extra_key": "sparrow_schedule=nope"})
    assert (unknown.status_code, unknown.json()["error"]["name"]) == (404, "nope")
    invalid = router.client.post(f"{router.url}/generate", json={"input_ids": [1], "sampling_params": {"temperature": -1}})
    assert invalid.status_code == 422 and invalid.json()["error"]["field"] == "sampling_params.temperature"


def _check_live_rid_refused(router, fleet: Fleet) -> None:
    """A rid live on a server is refused there with 409, which the router passes through unretried;
    on the other servers the same rid runs (no de-duplication across servers).

    The host is paused in place before the long request reaches it: the request queues there, live
    (its rid held) but never stepped, so nothing but the abort below can end it, however slow the
    checks. A paused server answers ``/health`` with 503, and two misses in a row (1 s apart) drop it
    from the router: a round in which the router dropped the host does not judge the router's answers
    (it routed to two workers) and is run again once the host is back."""
    for _ in range(3):
        codes, host_kept = _live_rid_round(router, fleet.servers[0])
        if host_kept:
            break
        router.wait_healthy([fleet.servers[0].url], timeout_s=30)
    assert host_kept, "the router dropped the paused host in every round"
    assert codes == [200, 200, 409]  # round_robin: one attempt per server, the 409 came back as is


def _live_rid_round(router, host: ForkedServer) -> tuple[list[int], bool]:
    """One round of ``_check_live_rid_refused``: the router's answers and whether the router kept the
    host all along (a paused server cannot come back into the router, so kept at the end = kept throughout)."""
    import threading

    long_body = {"input_ids": [1, 2, 3], "rid": "live-rid", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    finished: list[dict] = []
    pause_in_place(host.url)
    runner = threading.Thread(target=lambda: finished.append(httpx.post(f"{host.url}/generate", json=long_body, timeout=120).json()))
    runner.start()
    ended_while_paused = False
    try:
        wait_for(lambda: _health(host)["live_requests"] == 1, 20, "the long request to queue on the paused host")
        state = httpx.get(f"{host.url}/generation_state", timeout=10).json()
        assert (state["paused"], state["waiting_requests"], state["running_requests"]) == ("in_place", 1, 0), state
        assert httpx.post(f"{host.url}/generate", json=long_body, timeout=10).status_code == 409
        short = {**long_body, "sampling_params": {"max_new_tokens": 1}}
        codes = sorted(router.client.post(f"{router.url}/generate", json=short).status_code for _ in range(N_SERVERS))
        host_kept = host.url in router.healthy_worker_urls()
    finally:
        abort = httpx.post(f"{host.url}/abort_request", json={"rid": "live-rid"}, timeout=10).json()
        runner.join(60)  # still paused: the abort ends the queued request without a step
        ended_while_paused = not runner.is_alive()
        continue_generation(host.url)
        runner.join(60)
    assert ended_while_paused and finished and finished[0]["meta_info"]["finish_reason"]["type"] == "abort", (abort, finished)
    return codes, host_kept


@pytest.mark.slow
def test_fleet_rollouts_exactly_once_through_a_server_restart(tmp_path):
    from helpers.fleet_util import RouterSettings, router_available, running_router

    if not router_available():
        pytest.skip("sglang-router is not installed (pip install sglang-router)")
    started = time.monotonic()
    phases: dict[str, float] = {}
    with _fleet(tmp_path) as fleet:
        phases["servers up"] = time.monotonic() - started
        for server in fleet.servers:  # control plane: straight to each server, not through the router
            assert httpx.put(f"{server.url}/schedules/{SCHEDULE_NAME}", json=SPARSE_SCHEDULE, timeout=10).status_code == 200
        urls = [s.url for s in fleet.servers]
        with running_router(urls, tmp_path, RouterSettings(**ROUTER)) as router:
            phases["router up"] = time.monotonic() - started
            _check_routing_edges(router, fleet)
            _check_live_rid_refused(router, fleet)
            phases["edges checked"] = time.monotonic() - started
            router_retries = _router_retries(router)

            victim, events = 1, []
            attempts: collections.Counter = collections.Counter()
            rids = [f"rollout-{i}" for i in range(N_ROLLOUTS)]

            async def rollouts_during_restart():
                chaos = asyncio.get_running_loop().run_in_executor(
                    None, _kill_when_busy_then_restart, fleet, router, victim, events)
                results = await _drive(router.url, rids, attempts.update)
                return results, await chaos

            results, held_at_kill = asyncio.run(rollouts_during_restart())
            router_retries = _router_retries(router) - router_retries
            phases["rollouts through the restart"] = time.monotonic() - started
            before = _served_generate(fleet.servers[victim])
            after_rids = [f"after-{i}" for i in range(2 * N_SERVERS)]
            after = asyncio.run(_drive(router.url, after_rids, attempts.update))
            rejoined_served = _served_generate(fleet.servers[victim]) - before
            router_workers = router.workers()  # shown if the restarted server got no traffic
    elapsed = time.monotonic() - started

    assert events == ["killed", "dropped", "rejoined"]
    for rid in rids + after_rids:  # exactly one result per request, and it is that request's
        answers = results.get(rid) or after.get(rid)
        assert answers is not None and len(answers) == 1, (rid, answers)
        meta = answers[0]["meta_info"]
        assert meta["id"] == rid and meta["finish_reason"]["type"] == "length"
        assert len(answers[0]["output_ids"]) == NEW_TOKENS == len(meta["output_token_logprobs"])
        assert meta["sparrow"]["schedule"] == SCHEDULE_NAME  # carried by extra_key through the router
        assert meta["sparrow"]["kv_budget_tokens_mean"] <= SPARSE_SCHEDULE["budgets_tokens"][0]
    client_resends = sum(attempts[r] - 1 for r in rids)
    # the kill cut the requests the victim held (live under its pause): the router re-sent each to
    # another worker, or (when its own retries were spent) answered 5xx and the client re-sent it with
    # the same rid
    assert held_at_kill >= 1 and router_retries + client_resends >= held_at_kill
    assert rejoined_served >= 1, router_workers  # the restarted server takes traffic again
    print(f"fleet test: {elapsed:.1f} s ({', '.join(f'{k} at {v:.1f} s' for k, v in phases.items())}); "
          f"held at the kill {held_at_kill}, router retries {router_retries:.0f}, client re-sends {client_resends}")

