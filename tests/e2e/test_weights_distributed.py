"""Weights broadcast by a disaggregated trainer over gloo to a live reference server, as slime does it
with SGLang: a separate trainer process (``helpers/gloo_trainer.py``) POSTs ``/init_weights_update_group``
while it joins the group as rank 0 (on a master port it bound itself), then each step POSTs
``/update_weights_from_distributed`` while it broadcasts every tensor of the next checkpoint.

The steps run against a server in this process (uvicorn on a loopback socket, its engine joining the group
as rank 1), so the test can hold its engine's loop in a known decode step (``helpers/pause_util.py``)
while the trainer's broadcast arrives, whatever the machine's speed. The failures run against a server in
a subprocess (they leave gloo threads to end on their own timeouts: not in the test process).

Checks: rollouts streaming during a step finish on the old weights (their meta says so) and the swap
waits for them; after each step a greedy rollout equals, token for token (logprobs within 1e-4), one of a
server started on that step's checkpoint, and differs from the step before; ``weight_version`` is the
step's. Failures (wrong port, wrong world size, a trainer killed mid-broadcast, a bad name) answer 400
within the group timeout, and the server keeps serving its old weights (the rollout equals the one
before); after a failed broadcast the group is gone and a new trainer opens it again.
"""
from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from helpers.live_server import LiveServer
from helpers.pause_util import DRAIN_HOLD_S, update_while_streaming
from helpers.server_util import ServerProcess, refused_url
from helpers.tiny_models import load_plain, save_tiny_model
from helpers.trainer_process import TrainerProcess
from helpers.weight_rollouts import TOL, InProcessServer, StreamInThread, rollout, version
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app

pytestmark = pytest.mark.slow

GROUP_TIMEOUT_S = 10.0  # the server's weight-group timeout (serve --weight-group-timeout-s)
SLACK_S = 10.0  # on top of it: the answer of a failed group operation comes within GROUP_TIMEOUT_S + SLACK_S
STEPS = ("b", "c", "d")
IN_FLIGHT_TOKENS = 120  # the brake, not their length, keeps the streams in flight while the broadcast arrives
SPARSE = {"budgets_tokens": [48], "dense_layers": [0], "sink_pages": 1, "recent_pages": 1, "description": "issue 26"}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights-distributed")
    seeds = {"a": 0, "b": 1, "c": 2, "d": 3}
    return {"root": root, **{k: save_tiny_model(root / k, seed=s, lm_head_std=0.5) for k, s in seeds.items()}}


@pytest.fixture(scope="module")
def server(ckpt):
    process = ServerProcess(ckpt["a"], ckpt["root"] / "state", "--weight-group-timeout-s", str(GROUP_TIMEOUT_S))
    try:
        httpx.put(f"{process.url}/schedules/w8-sparse", json=SPARSE, timeout=30).raise_for_status()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def live(ckpt, one_torch_thread):
    """A server on checkpoint a in this process, its engine at hand (one torch thread, as ``--threads 1``)."""
    engine = ReferenceEngine(load_plain(ckpt["a"], "sdpa"), None, ckpt["a"].name, kv_pool_tokens=8192,
                             weight_group_timeout_s=GROUP_TIMEOUT_S)
    live = LiveServer(create_app(engine)).start()
    live.engine = engine
    try:
        httpx.put(f"{live.url}/schedules/w8-sparse", json=SPARSE, timeout=30).raise_for_status()
        yield live
    finally:
        live.stop()


@pytest.fixture
def trainer(ckpt, request):
    """A trainer subprocess per test, killed at its end whatever happened."""
    started: list[TrainerProcess] = []

    def start() -> TrainerProcess:
        started.append(TrainerProcess(ckpt["root"] / f"trainer-{request.node.name}-{len(started)}.log"))
        return started[-1]

    yield start
    for process in started:
        process.kill()


def init(trainer: TrainerProcess, server, group: str, **fields) -> dict:
    """The trainer binds a master port (port 0: no other process can take it first), then opens ``group``
    there as rank 0 while it POSTs the server's join."""
    return trainer.call("init", url=server.url, world_size=2, group_name=group, **fields)


def update(trainer: TrainerProcess, server, ckpt_dir, group: str, **fields) -> dict:
    return trainer.call("update", url=server.url, ckpt=str(ckpt_dir), group_name=group, **fields)


def post(server, path: str, body: dict) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = httpx.post(f"{server.url}{path}", json=body, timeout=GROUP_TIMEOUT_S * 3 + SLACK_S)
    return response, time.monotonic() - started


def assert_group_failure(response: httpx.Response, elapsed_s: float, *words: str) -> dict:
    body = response.json()
    assert response.status_code == 400 and body["success"] is False, body
    assert all(w in body["message"] for w in words), body["message"]
    assert elapsed_s < GROUP_TIMEOUT_S + SLACK_S, f"answered after {elapsed_s:.1f} s"
    return body


def test_trainer_broadcasts_every_step_while_rollouts_stream(live, ckpt, trainer):
    server, engine = live, live.engine  # in this process: its engine's loop can be braked
    t = trainer()
    previous = rollout(server)
    served = version(server.url)
    opened = init(t, server, "steps")
    assert opened["trainer"] == "ok" and opened["server"]["status"] == 200, opened
    assert opened["server"]["body"] == {"success": True, "message": "Succeeded to initialize custom process group."}
    for step, name in enumerate(STEPS, 1):
        in_flight, answer = update_while_streaming(
            engine, server.url, lambda: [StreamInThread(server.url, max_new_tokens=IN_FLIGHT_TOKENS) for _ in range(2)],
            # the swap closes the gate once the whole broadcast was received; the last step as SGLang's flattened_bucket
            lambda: update(t, server, ckpt[name], "steps", body={"weight_version": f"step-{step}"},
                           flattened=step == len(STEPS)))
        assert answer["trainer"] == "ok" and answer["server"]["status"] == 200, answer
        reply = answer["server"]["body"]
        assert reply["success"] and reply["weight_version"] == f"step-{step}"
        assert reply["previous_weight_version"] == served and reply["num_aborted_requests"] == 0
        assert reply["drain_s"] >= DRAIN_HOLD_S, "the swap should have waited for the streaming rollouts"
        for stream in in_flight:  # finished on the old weights, and say so
            tokens, meta = stream.result()
            assert meta.weight_version == served and meta.finish_reason["type"] == "length"
            assert len(tokens) == IN_FLIGHT_TOKENS and tokens[:len(previous.token_ids)] == previous.token_ids
        fresh = InProcessServer(ckpt[name])
        try:
            fresh.http.put("/schedules/w8-sparse", json=SPARSE).raise_for_status()
            for schedule in ("w8-sparse", "dense"):  # sparse first: it reuses the flushed pages
                got, want = rollout(server, schedule), rollout(fresh, schedule)
                assert got.meta.weight_version == f"step-{step}"
                assert got.token_ids == want.token_ids and got.selected_pages == want.selected_pages
                assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs)) < TOL
        finally:
            fresh.stop()
        assert got.token_ids != previous.token_ids, f"step {step} should change the greedy rollout"
        previous, served = got, f"step-{step}"
    assert version(server.url) == served
    closed = t.call("destroy", url=server.url, group_name="steps")
    assert closed["server"]["body"] == {"success": True, "message": "Succeeded to destroy custom process group."}
    again, _ = post(server, "/destroy_weights_update_group", {"group_name": "steps"})
    assert again.status_code == 400 and again.json()["message"] == "The group to be destroyed does not exist."


def test_wrong_port_and_wrong_world_size_fail_within_the_timeout(server, trainer):
    before, served = rollout(server), version(server.url)
    with refused_url() as dead:  # its port is bound and never listened on: connections to it are refused
        nobody = urlsplit(dead).port
        response, elapsed = post(server, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": nobody, "rank_offset": 1, "world_size": 2,
            "group_name": "wrong-port", "backend": "gloo"})
    assert_group_failure(response, elapsed, "Failed to initialize custom process group", str(nobody))
    t = trainer()
    answer = init(t, server, "wrong-world", server_body={"world_size": 3}, group_timeout_s=GROUP_TIMEOUT_S)
    assert answer["server"]["status"] == 400, answer
    assert "Failed to initialize custom process group" in answer["server"]["body"]["message"]
    assert answer["server"]["elapsed_s"] < GROUP_TIMEOUT_S + SLACK_S
    after = rollout(server)
    assert after.token_ids == before.token_ids and version(server.url) == served


def test_trainer_killed_mid_broadcast_keeps_old_weights_and_needs_a_new_group(server, ckpt, trainer):
    before, served = rollout(server), version(server.url)
    t = trainer()
    assert init(t, server, "killed")["server"]["status"] == 200
    names = _names(ckpt["a"])
    reply: dict = {}
    http = threading.Thread(target=lambda: reply.update(zip(("response", "elapsed"), post(
        server, "/update_weights_from_distributed", {**names, "group_name": "killed", "weight_version": "never"}))))
    http.start()
    t.send("update", url=server.url, ckpt=str(ckpt["a"]), group_name="killed", post=False, stop_after=len(names["names"]) // 2)
    assert t.next()["event"] == "stopped"
    t.kill()
    http.join(GROUP_TIMEOUT_S * 3 + SLACK_S)
    assert not http.is_alive()
    body = assert_group_failure(reply["response"], reply["elapsed"], "receiving", "old weights keep serving",
                                "init_weights_update_group again")
    assert body["error"]["group_destroyed"] is True
    after = rollout(server)
    assert after.token_ids == before.token_ids and after.meta.weight_version == served == version(server.url)
    gone, _ = post(server, "/update_weights_from_distributed", {**names, "group_name": "killed"})
    assert gone.status_code == 400 and gone.json()["error"]["type"] == "unknown_group"
    again = trainer()  # the same group name opens again, and takes weights
    assert init(again, server, "killed")["server"]["status"] == 200
    answer = update(again, server, ckpt["a"], "killed", body={"weight_version": "reopened"})
    assert answer["server"]["status"] == 200 and answer["trainer"] == "ok", answer
    assert rollout(server).meta.weight_version == "reopened"


def test_bad_name_is_named_the_group_closed_and_the_trainer_fails_fast(server, ckpt, trainer):
    before, served = rollout(server), version(server.url)
    t = trainer()
    assert init(t, server, "bad-name")["server"]["status"] == 200
    names = _names(ckpt["b"])["names"]
    bad = [*names[:3], "model.layers.0.self_attn.nope.weight", *names[4:]]
    started = time.monotonic()
    answer = update(t, server, ckpt["b"], "bad-name", body={"names": bad})
    assert time.monotonic() - started < SLACK_S, "the trainer's broadcast should fail as soon as the group closes"
    assert answer["trainer"] != "ok", answer
    body = answer["server"]["body"]
    assert answer["server"]["status"] == 400 and body["error"]["field"] == "names[3]"
    assert body["error"]["value"] == bad[3] and body["error"]["group_destroyed"] is True
    after = rollout(server)
    assert after.token_ids == before.token_ids and version(server.url) == served


def _names(ckpt_dir) -> dict:
    from safetensors import safe_open

    with safe_open(str(ckpt_dir / "model.safetensors"), "pt") as f:
        names = sorted(f.keys())
        tensors = [f.get_slice(n) for n in names]
        return {"names": names, "dtypes": ["float32"] * len(names), "shapes": [list(t.get_shape()) for t in tensors]}
