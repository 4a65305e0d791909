"""Weight updates on a live reference server (uvicorn on a loopback port, in process so a test can
hold its engine's loop in a known decode step), driven over HTTP and by the fleet client helpers: an update while rollouts stream lets them finish on the old weights (their meta
says so); the first rollout after it equals, token for token under greedy decoding (and page for
page under a sparse schedule), a fresh server started on the new weights; bad paths and other
architectures answer 400 and the old weights keep serving; pause/continue over HTTP."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from helpers.engine_brake import DecodeBrake
from helpers.live_server import LiveServer, wait_until
from helpers.pause_util import DRAIN_HOLD_S, update_while_streaming
from helpers.server_util import refused_url
from helpers.tiny_models import load_plain, save_tiny_model
from helpers.weight_rollouts import TOL, InProcessServer, StreamInThread, rollout, version
from sparrow_server.client.weights import FleetError, pause, resume, update_weights
from sparrow_server.engine.base import DEFAULT_WEIGHT_VERSION
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.security import SecurityConfig

SPARSE = {"budgets_tokens": [48], "dense_layers": [0], "sink_pages": 1, "recent_pages": 1, "description": "issue 8"}
IN_FLIGHT_TOKENS = 120


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights-server")
    return {"a": save_tiny_model(root / "a", seed=0), "b": save_tiny_model(root / "b", seed=1),
            "wider": save_tiny_model(root / "wider", seed=0, intermediate_size=96), "root": root}


@pytest.fixture(scope="module")
def servers(ckpt):
    """A live server on the old weights (updated by the tests) and a fresh one on the new weights."""
    fresh = InProcessServer(ckpt["b"])  # first: it sets one torch thread, which the live server shares
    engine = ReferenceEngine(load_plain(ckpt["a"], "sdpa"), None, ckpt["a"].name, kv_pool_tokens=8192)
    updated = LiveServer(create_app(engine)).start()
    updated.engine = engine
    try:
        httpx.put(f"{updated.url}/schedules/w8-sparse", json=SPARSE, timeout=30).raise_for_status()
        fresh.http.put("/schedules/w8-sparse", json=SPARSE).raise_for_status()
        yield updated, fresh
    finally:
        updated.stop()
        fresh.stop()


def test_update_while_streaming_then_first_rollout_equals_a_fresh_server(servers, ckpt):
    updated, fresh = servers
    before = rollout(updated)
    engine = updated.engine
    in_flight, replies = update_while_streaming(
        engine, updated.url, lambda: [StreamInThread(updated.url, max_new_tokens=IN_FLIGHT_TOKENS) for _ in range(2)],
        lambda: update_weights([updated.url], str(ckpt["b"]), weight_version="step-1"))
    reply = replies[updated.url]
    assert reply["success"] and reply["weight_version"] == "step-1"
    assert reply["previous_weight_version"] == DEFAULT_WEIGHT_VERSION and reply["num_aborted_requests"] == 0
    assert reply["drain_s"] >= DRAIN_HOLD_S, "the update should have waited for the streaming rollouts"
    for stream in in_flight:  # finished on the old weights, and say so
        tokens, meta = stream.result()
        assert meta.weight_version == DEFAULT_WEIGHT_VERSION and meta.finish_reason["type"] == "length"
        assert len(tokens) == IN_FLIGHT_TOKENS and tokens[:len(before.token_ids)] == before.token_ids
    assert version(updated.url) == "step-1"
    assert httpx.get(f"{updated.url}/server_info", timeout=10).json()["weight_version"] == "step-1"
    for schedule in ("w8-sparse", "dense"):  # sparse first: it reuses the flushed pages
        got, want = rollout(updated, schedule), rollout(fresh, schedule)
        assert got.meta.weight_version == "step-1" and want.meta.weight_version == DEFAULT_WEIGHT_VERSION
        assert got.token_ids == want.token_ids
        assert got.selected_pages == want.selected_pages
        assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < TOL
    assert got.token_ids != before.token_ids, "the two checkpoints should disagree"


def test_bad_path_and_other_architecture_answer_400_and_old_weights_keep_serving(servers, ckpt):
    updated, _ = servers
    served, reference = version(updated.url), rollout(updated)
    cases = [({"model_path": str(ckpt["root"] / "missing")}, "no such file"),
             ({"model_path": str(ckpt["wider"])}, "intermediate_size"),
             ({"model_path": str(ckpt["b"]), "load_format": "npcache"}, "load_format")]
    for body, words in cases:
        response = httpx.post(f"{updated.url}/update_weights_from_disk", json=body, timeout=60)
        assert response.status_code == 400, response.text
        reply = response.json()
        assert reply["success"] is False and words in reply["message"]
        assert reply["error"]["type"] == "weight_load_failed"
    with pytest.raises(FleetError) as info:
        update_weights([updated.url], str(ckpt["wider"]))
    assert updated.url in info.value.failures and "400" in str(info.value)
    assert version(updated.url) == served
    after = rollout(updated)
    assert after.token_ids == reference.token_ids and after.meta.weight_version == served


def streamed_tokens(stream: StreamInThread) -> int:
    return sum(len(event.token_ids) for event in list(stream.events))


def test_pause_in_place_and_continue_over_http(servers):
    updated, _ = servers
    reference = rollout(updated)
    engine = updated.engine
    brake = DecodeBrake(engine, at=3)
    stream = StreamInThread(updated.url)
    try:
        wait_until(brake.reached.is_set, 60, "the stream's third decode step")
        with ThreadPoolExecutor(1) as pool:
            pausing = pool.submit(pause, [updated.url], "in_place")
            wait_until(lambda: engine.weight_sync.mode == "in_place" or pausing.done(), 60, "the pause's gate")
            brake.release()
            reply = pausing.result()[updated.url]
    finally:
        brake.release()
    assert reply["status"] == "ok" and reply["paused"] == "in_place"
    state = httpx.get(f"{updated.url}/generation_state", timeout=10).json()
    assert state["paused"] == "in_place" and state["running_requests"] == 1
    # the prefill's token and three decodes': the braked step finished and no other ran
    wait_until(lambda: streamed_tokens(stream) >= 4, 60, "the braked step's token")
    stream.thread.join(timeout=0.5)  # time to move, were the pause broken (frozen, no amount of it moves anything)
    assert streamed_tokens(stream) == 4 and stream.thread.is_alive()
    assert resume([updated.url])[updated.url]["paused"] is None
    tokens, meta = stream.result()
    assert tokens == reference.token_ids and meta.finish_reason["type"] == "length"
    with refused_url() as dead:
        with pytest.raises(FleetError) as info:  # every server is tried; the failures are named
            resume([updated.url, dead], timeout=5)
    assert list(info.value.results) == [updated.url] and list(info.value.failures) == [dead]


def test_weight_routes_validate_and_require_admin(ckpt):
    engine = ReferenceEngine(load_plain(ckpt["a"], "sdpa"), None, "tiny", kv_pool_tokens=1024)
    app = create_app(engine, security=SecurityConfig(api_key="secret"))
    with TestClient(app) as http:
        assert http.post("/pause_generation", json={"mode": "abort"}).status_code == 401
        assert http.post("/update_weights_from_disk", json={"model_path": str(ckpt["b"])}).status_code == 401
        admin = {"authorization": "Bearer secret"}
        bad_mode = http.post("/pause_generation", json={"mode": "sleep"}, headers=admin)
        assert bad_mode.status_code == 422 and "mode" in bad_mode.json()["detail"]
        unknown = http.post("/update_weights_from_disk", json={"model_path": "x", "colour": 1}, headers=admin)
        assert unknown.status_code == 422
        not_async = http.post("/update_weights_from_disk", json={"model_path": str(ckpt["b"]), "is_async": True},
                              headers=admin)
        assert not_async.status_code == 422 and not_async.json()["error"]["field"] == "is_async"
        assert http.post("/pause_generation", headers=admin).json()["paused"] == "abort"  # SGLang's default mode
        assert http.post("/continue_generation", headers=admin).json()["paused"] is None
        reply = http.post("/update_weights_from_disk", json={"model_path": str(ckpt["b"])}, headers=admin).json()
        assert reply["success"] and reply["weight_version"] == "1"
        assert http.get("/get_weight_version").json()["weight_version"] == "1"
        held = http.post("/update_weights_from_disk", json={"model_path": str(ckpt["a"]), "weight_version": "2",
                                                            "keep_pause": True}, headers=admin).json()
        assert held["weight_version"] == "2" and http.get("/generation_state").json()["paused"] == "in_place"
        assert http.post("/continue_generation", json={}, headers=admin).json()["paused"] is None


def test_weights_command_fans_out_and_exits_1_on_failure(servers, ckpt, capsys):
    from sparrow_server.cli import main

    updated, _ = servers
    served = version(updated.url)
    assert main(["weights", "pause", "--mode", "retract", "--url", updated.url]) == 0
    assert json.loads(capsys.readouterr().out)[updated.url]["paused"] == "retract"
    assert main(["weights", "resume", "--url", updated.url]) == 0
    assert json.loads(capsys.readouterr().out)[updated.url]["paused"] is None
    assert main(["weights", "update", str(ckpt["wider"]), "--url", updated.url]) == 1
    assert "intermediate_size" in capsys.readouterr().err and version(updated.url) == served
