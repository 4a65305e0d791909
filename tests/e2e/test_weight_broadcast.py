"""``sparrow_server.client.weight_broadcast`` (the trainer's side of SGLang's weight-update group) over gloo
against two live reference servers (subprocesses): this test process is rank 0, the servers ranks 1 and 2.

Checks: after an update in several buckets (with pause/continue around it) both servers serve the new
weights (dense logprobs of a rollout equal a local forward of the new model within 1e-4 and differ from the
old one's) under the update's weight version; a bad tensor name fails with an error naming every server
(the failed ones with their reply naming the field, the others as not answered yet), the broadcaster refuses further updates, and the servers keep their weights; the config and
bucket plan name bad values.
"""
from __future__ import annotations

import threading

import pytest
import torch

from helpers.server_util import ServerProcess, free_port
from helpers.tiny_models import load_plain, save_tiny_model, teacher_forced_logprobs
from sparrow_server.client import FleetError, SparrowClient, weight_broadcast
from sparrow_server.client.weight_broadcast import BroadcastConfig, WeightBroadcaster, plan_buckets, update_body

PROMPT = [3, 9, 17, 33, 2, 70, 11, 5]
GROUP_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("broadcast")
    return {"root": root, "a": save_tiny_model(root / "a", seed=0, lm_head_std=0.5),
            "b": save_tiny_model(root / "b", seed=1, lm_head_std=0.5)}


@pytest.fixture(scope="module")
def servers(models):
    started = []
    try:
        for i in range(2):
            started.append(ServerProcess(models["a"], models["root"] / f"state-{i}",
                                         "--weight-group-timeout-s", str(GROUP_TIMEOUT_S)))
        yield started
    finally:
        for s in started:
            s.stop()


def served(url: str):
    with SparrowClient(url) as client:
        return client.rollout(input_ids=PROMPT, schedule="dense", sampling_params={"max_new_tokens": 8, "seed": 3})


def local_logprobs(model_dir, tokens) -> list[float]:
    with torch.no_grad():
        return teacher_forced_logprobs(load_plain(model_dir), PROMPT, tokens)


@pytest.mark.slow
def test_update_reaches_every_server_then_a_bad_name_is_named(servers, models):
    urls = [s.url for s in servers]
    policy = load_plain(models["b"])
    params = dict(policy.named_parameters())
    config = BroadcastConfig(master_port=free_port(), backend="gloo", bucket_bytes=64 * 1024,
                             group_timeout_s=GROUP_TIMEOUT_S)
    sync = WeightBroadcaster(urls, config)
    opened = sync.open()
    assert sync.world_size == 3 and all(r["success"] for r in opened.values()), opened
    try:
        replies = sync.update(params, weight_version="step-1", pause_mode="in_place")
        assert len(replies) > 1, "64 KiB buckets should split the tiny model"
        for url in urls:
            got = served(url)
            assert got.meta.weight_version == "step-1"
            new, old = local_logprobs(models["b"], got.token_ids), local_logprobs(models["a"], got.token_ids)
            assert max(abs(x - y) for x, y in zip(got.logprobs, new)) < 1e-4
            assert max(abs(x - y) for x, y in zip(got.logprobs, old)) > 1e-3

        before = [served(u).token_ids for u in urls]
        bad = {("model.layers.0.self_attn.nope.weight" if i == 2 else n): t for i, (n, t) in enumerate(params.items())}
        with pytest.raises(FleetError) as caught:
            sync.update(bad, weight_version="never")
        error, message = caught.value, str(caught.value)
        # The wait ends at the first 400; a server whose 400 had not come yet is named as pending.
        assert error.failures and set(error.failures) | set(error.pending) == set(urls) and not error.results, message
        assert all(u in message for u in urls) and f"of {len(urls)} servers" in message, message
        assert all("names[2]" in str(e) and "nope" in str(e) for e in error.failures.values()), message
        with pytest.raises(RuntimeError, match="cannot update"):
            sync.update(params, weight_version="never")
        assert [served(u).token_ids for u in urls] == before
        assert all(served(u).meta.weight_version == "step-1" for u in urls)
    finally:
        closed = sync.close()
    assert set(closed) == set(urls)


def test_config_names_the_bad_field():
    with pytest.raises(ValueError, match="backend = 'mpi'"):
        BroadcastConfig(master_port=29600, backend="mpi")
    with pytest.raises(ValueError, match="master_port = 0"):
        BroadcastConfig(master_port=0)
    with pytest.raises(ValueError, match="bucket_bytes = 0"):
        BroadcastConfig(master_port=29600, bucket_bytes=0)
    with pytest.raises(ValueError, match="device = 'cuda:0'"):
        BroadcastConfig(master_port=29600, backend="gloo", device="cuda:0")


def test_buckets_and_body():
    assert plan_buckets([("a", 4), ("b", 4), ("c", 10), ("d", 1)], 8) == [["a", "b"], ["c"], ["d"]]
    body = update_body("g", {"x": torch.zeros(2, 3, dtype=torch.bfloat16)}, weight_version="7", flush_cache=False)
    assert body == {"names": ["x"], "dtypes": ["bfloat16"], "shapes": [[2, 3]], "group_name": "g",
                    "flush_cache": False, "abort_all_requests": False, "weight_version": "7"}


def test_first_failure_names_every_server(monkeypatch):
    """The wait ends at the first server's failure; servers that have not answered are named as pending
    (CI once saw ``failed on 1 of 1 servers`` naming only whichever 400 came first)."""
    hold = threading.Event()

    def post(self, url, path, body):
        if url.endswith(":1"):
            raise RuntimeError("HTTP 400: names[2] = 'nope'")
        hold.wait(30)  # a server still waiting in the collective
        return {"success": True}

    monkeypatch.setattr(weight_broadcast.WeightBroadcaster, "_post", post)
    sync = WeightBroadcaster(["http://a:1", "http://b:2"], BroadcastConfig(master_port=29600, backend="gloo"))
    try:
        with pytest.raises(FleetError) as caught:
            sync._together("update_weights_from_distributed", "/x", {u: {} for u in sync.urls}, lambda: hold.wait(30))
    finally:
        hold.set()
    error = caught.value
    assert list(error.failures) == ["http://a:1"] and error.pending == ["http://b:2"] and error.results == {}
    assert str(error).startswith("update_weights_from_distributed failed on 1 of 2 servers: http://a:1: HTTP 400")
    assert str(error).endswith("no answer yet from http://b:2") and sync.broken
    with pytest.raises(RuntimeError, match="cannot update"):
        sync.update({"w": torch.zeros(1)}, weight_version="never")


def test_the_trainers_own_failure_is_named_apart(monkeypatch):
    monkeypatch.setattr(weight_broadcast.WeightBroadcaster, "_post", lambda self, url, path, body: {"success": True})
    sync = WeightBroadcaster(["http://a:1", "http://b:2"], BroadcastConfig(master_port=29600, backend="gloo"))

    def collective():
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(FleetError) as caught:
        sync._together("update_weights_from_distributed", "/x", {u: {} for u in sync.urls}, collective)
    error = caught.value
    assert error.failures == {} and set(error.results) == set(sync.urls) and "Connection closed" in str(error.trainer_error)
    assert str(error) == ("update_weights_from_distributed failed on 0 of 2 servers: "
                          "the trainer's side (rank 0): Connection closed by peer")
    assert "trainer's side" in sync.broken
