"""Adapter lifecycle on the server: versioned loads, aliases, drain-then-unload, bad input, restart;
a hot swap while streaming rollouts run; the dense verification pass ignores the adapter."""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import httpx
import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from helpers.live_server import live_server, wait_until
from helpers.pause_util import continue_generation, pause_in_place, run_one_step_then_freeze
from helpers.tiny_models import tiny_model
from sparrow_server.adapter_meta.metadata import METADATA_FILE
from sparrow_server.adapter_meta.fingerprint import model_fingerprint
from sparrow_server.engine.adapter_versions import AdapterConflictError, AdapterManager, AdapterRequestError
from sparrow_server.engine.base import UnknownAdapterError
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.security import SecurityConfig
from sparrow_server.stats.acceptance import exact_acceptance


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_adapter(directory, seed: int, rank: int = 4, fingerprint: str | None = "auto"):
    """A random (non-zero) LoRA for the tiny model, with sparrow metadata naming its base."""
    torch.manual_seed(seed)
    peft_model = get_peft_model(tiny_model(), LoraConfig(r=rank, lora_alpha=16, target_modules="all-linear",
                                                         init_lora_weights=False))
    peft_model.save_pretrained(str(directory))
    if fingerprint is not None:
        fp = model_fingerprint(tiny_model()) if fingerprint == "auto" else fingerprint
        (directory / METADATA_FILE).write_text(json.dumps({"base_fingerprint": fp, "schedule_id": "dense@1"}))
    return directory


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    for i in (1, 2, 3):
        make_adapter(root / f"v{i}", seed=i)
    make_adapter(root / "wrong-base", seed=4, fingerprint="sparrow-fp1:" + "0" * 64)
    make_adapter(root / "big-rank", seed=5, rank=16)
    (root / "broken").mkdir()
    (root / "broken" / "adapter_config.json").write_text("{not json")
    return root


def _app(roots, state=None, max_rank: int = 8):
    from sparrow_server.engine.adapter_versions import default_adapter_manager

    engine = ReferenceEngine(tiny_model(), None, "tiny", kv_pool_tokens=8192)
    manager = default_adapter_manager(engine, persist_dir=state, max_rank=max_rank)
    app = create_app(engine, security=SecurityConfig(adapter_roots=(roots,)), adapters=manager)
    return app, engine, manager


# ----- the manager on its own ------------------------------------------------------------------

class _FakeEngine:
    def __init__(self):
        self.loaded, self.events = set(), []

    def load_adapter(self, name, path):
        self.loaded.add(name)

    def unload_adapter(self, name):
        self.loaded.remove(name)
        self.events.append(("unloaded", name))


def test_manager_versions_aliases_and_drain(roots):
    engine = _FakeEngine()
    m = AdapterManager(engine, max_rank=8, base_fingerprint=lambda: model_fingerprint(tiny_model()))
    m.load("v1", roots / "v1")
    with pytest.raises(AdapterConflictError, match="immutable"):
        m.load("v1", roots / "v2")
    m.set_alias("latest", "v1")
    assert m.acquire("latest") == "v1" and m.describe()[0]["in_flight"] == 1
    m.load("v2", roots / "v2")
    m.set_alias("latest", "v2")
    with pytest.raises(AdapterConflictError, match="name of an adapter version"):
        m.set_alias("v2", "v1")

    async def unload_v1():
        task = asyncio.create_task(m.unload("v1"))
        await asyncio.sleep(0.2)
        assert not task.done() and "v1" in engine.loaded  # draining: waits for the request in flight
        with pytest.raises(UnknownAdapterError):
            m.acquire("v1")  # no new request on a draining version
        m.release("v1")
        await asyncio.wait_for(task, 5)

    asyncio.run(unload_v1())
    assert engine.events == [("unloaded", "v1")] and m.names() == ("v2",)
    with pytest.raises(AdapterConflictError, match="latest"):
        asyncio.run(m.unload("v2"))  # an alias still points at it
    with pytest.raises(UnknownAdapterError):
        asyncio.run(m.unload("nope"))


@pytest.mark.parametrize("path, reason", [
    ("wrong-base", "another base model"), ("big-rank", "rank 16 exceeds"), ("broken", "unreadable JSON"),
    ("missing", "not a directory"),
])
def test_manager_refuses_bad_adapters(roots, path, reason):
    m = AdapterManager(_FakeEngine(), max_rank=8, base_fingerprint=lambda: model_fingerprint(tiny_model()))
    with pytest.raises(AdapterRequestError, match=reason) as exc:
        m.load("x", roots / path)
    assert exc.value.field == "path" and m.names() == ()


# ----- HTTP -------------------------------------------------------------------------------------

def test_http_lifecycle_errors_and_restart(roots, tmp_path):
    state = tmp_path / "state"
    app, _, _ = _app(roots, state)
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.post("/adapters", json={"name": "v1", "path": str(roots / "v1")}).status_code == 200
        r = c.post("/adapters", json={"name": "v1", "path": str(roots / "v2")})
        assert r.status_code == 409 and r.json()["error"]["field"] == "name"
        for path, status, what in [("wrong-base", 400, "another base"), ("big-rank", 400, "maximum"),
                                   ("broken", 400, "JSON"), ("/etc", 403, "")]:
            r = c.post("/adapters", json={"name": f"bad-{status}", "path": str(roots / path) if path[0] != "/" else path})
            assert r.status_code == status and what in r.text
        assert c.put("/adapters/aliases/latest", json={"name": "v1"}).status_code == 200
        assert c.put("/adapters/aliases/latest", json={"name": "nope"}).status_code == 404
        listing = c.get("/adapters").json()
        (v1,) = listing["adapters"]
        assert (v1["name"], v1["rank"], v1["in_flight"], v1["aliases"]) == ("v1", 4, 0, ["latest"])
        assert v1["base_fingerprint"] == model_fingerprint(tiny_model()) and "q_proj" in v1["target_modules"]
        assert listing["aliases"] == {"latest": "v1"}
        r = c.post("/rollout", json={"input_ids": [1, 2, 3], "adapter": "latest",
                                     "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200 and r.json()["meta"]["adapter"] == "v1"
        assert c.post("/rollout", json={"input_ids": [1, 2], "adapter": "nope"}).status_code == 404
        assert c.delete("/adapters/nope").status_code == 404
        assert c.delete("/adapters/v1").status_code == 409  # alias still points at it
        assert c.get("/health").status_code == 200  # still serving after every refusal
    app2, engine2, _ = _app(roots, state)  # restart: versions and aliases come back
    with live_server(app2) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/adapters").json()["aliases"] == {"latest": "v1"}
        assert engine2.adapters() == ("v1",)
        assert c.delete("/adapters/aliases/latest").status_code == 200
        assert c.delete("/adapters/v1").json()["unloaded"] == "v1"
        assert c.get("/adapters").json()["adapters"] == [] and engine2.adapters() == ()
        r = c.post("/rollout", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}})
        assert r.status_code == 200 and r.json()["meta"]["adapter"] is None  # base model after the last unload


def _stream(url: str, body: dict, out: dict) -> None:
    """One streaming rollout; records the adapter every final event reports and any error."""
    try:
        with httpx.stream("POST", url + "/rollout", json={**body, "stream": True}, timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data:"):
                    event = json.loads(line[5:])
                    if "error" in event:
                        out["error"] = event["error"]
                    if event.get("done"):
                        out["adapter"] = event["meta"]["adapter"]
                        out["tokens"] = event["meta"]["completion_tokens"]
    except Exception as exc:  # noqa: BLE001 - the test counts any failure
        out["error"] = repr(exc)


def test_hot_swap_while_streaming(roots):
    """v1's requests are streaming (two tokens each sent, KV held) when v2 is loaded and the alias
    moves: they finish on v1, new ones run on v2, and unloading v1 waits for its requests. Pinned by
    pauses in place (no timing): the v1 requests cannot finish before the unload is asked for."""
    app, engine, manager = _app(roots)
    live_at_unload = []  # server side, at the moment the engine unloads: requests still running on it
    real_unload = engine.unload_adapter

    def unload(name):
        live_at_unload.append((name, [s.rid for s in engine.scheduler.live() if s.adapter == name]))
        return real_unload(name)

    def version(name):
        return next((a for a in manager.describe() if a["name"] == name), {})  # {} once unloaded

    def v1():
        return version("v1")

    engine.unload_adapter = unload
    n_tokens = 48
    body = {"input_ids": list(range(1, 40)), "adapter": "distill-latest",
            "sampling_params": {"max_new_tokens": n_tokens, "ignore_eos": True}}
    first, second = [{} for _ in range(4)], [{} for _ in range(4)]
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        pool = ThreadPoolExecutor(1)
        try:
            c.post("/adapters", json={"name": "v1", "path": str(roots / "v1")}).raise_for_status()
            c.put("/adapters/aliases/distill-latest", json={"name": "v1"}).raise_for_status()
            pause_in_place(server.url)  # the first wave queues, then starts together
            threads = [threading.Thread(target=_stream, args=(server.url, body, o)) for o in first]
            for t in threads:
                t.start()
            # admitted, prefilled and one decode step each (two tokens streamed), then frozen in place
            run_one_step_then_freeze(engine, server.url, 4)
            assert v1().get("in_flight") == 4 and {s.adapter for s in engine.scheduler.live()} == {"v1"}
            c.post("/adapters", json={"name": "v2", "path": str(roots / "v2")}).raise_for_status()
            c.put("/adapters/aliases/distill-latest", json={"name": "v2"}).raise_for_status()
            threads += [threading.Thread(target=_stream, args=(server.url, body, o)) for o in second]
            for t in threads[4:]:
                t.start()
            wait_until(lambda: engine.scheduler.counts().waiting == 4, 30, "the second wave queued")
            assert version("v2").get("in_flight") == 4  # the new wave resolved the alias to v2
            assert v1().get("in_flight") == 4  # v1 still busy when its unload is asked for: its requests are frozen
            unloading = pool.submit(c.delete, "/adapters/v1")  # blocks until v1's requests have ended
            wait_until(lambda: v1().get("draining") or unloading.done(), 30, "v1 draining")
            wait([unloading], timeout=0.5)  # time for a broken drain to unload anyway (a correct one waits:
            # v1's requests are frozen, so no amount of time lets them end)
            assert not unloading.done() and live_at_unload == [] and "v1" in engine.adapters()
            assert v1().get("in_flight") == 4 and engine.scheduler.counts().running == 4
            continue_generation(server.url)
            r = unloading.result(timeout=120)
            assert r.status_code == 200 and r.json()["unloaded"] == "v1"
            for t in threads:
                t.join(120)
            assert not any(t.is_alive() for t in threads)
            assert "v1" not in engine.adapters()
            assert c.post("/rollout", json={**body, "adapter": "v1"}).status_code == 404
        finally:  # a failure above must not leave the server paused (the DELETE and streams would hang)
            if engine.weight_sync.mode is not None:
                continue_generation(server.url)
            pool.shutdown(wait=True)
    for o in first + second:
        assert o.get("status") == 200 and "error" not in o and o["tokens"] == n_tokens, o
    assert [o["adapter"] for o in first] == ["v1"] * 4  # each finished on the version it started with
    assert [o["adapter"] for o in second] == ["v2"] * 4
    # unloaded only after its last request ended: checked on the server, where it happens (client
    # clocks on two connections cannot order a stream's end against the DELETE's answer)
    assert live_at_unload == [("v1", [])]


def test_dense_verification_ignores_the_adapter(roots):
    app, _, _ = _app(roots)
    prompt = list(range(1, 30))
    with live_server(app) as server, httpx.Client(base_url=server.url, timeout=60) as c:
        c.post("/adapters", json={"name": "v3", "path": str(roots / "v3")}).raise_for_status()
        r = c.post("/rollout", json={"input_ids": prompt, "adapter": "v3", "schedule": "dense", "verify": True,
                                     "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}}).json()
    meta = r["meta"]
    # Dense schedule: if the dense pass used the adapter, sparse and dense would be the same policy (1.0).
    from peft import PeftModel

    ids = torch.tensor([prompt + r["token_ids"][:-1]])
    with_adapter = PeftModel.from_pretrained(tiny_model(), str(roots / "v3")).eval()
    with torch.no_grad():
        dense = tiny_model()(input_ids=ids).logits[0, len(prompt) - 1:]
        sparse = with_adapter(input_ids=ids).logits[0, len(prompt) - 1:]
    expected = exact_acceptance(sparse.double(), dense.double()).numpy()
    assert meta["acceptance_mean"] < 0.99
    assert meta["acceptance_mean"] == pytest.approx(float(np.mean(expected)), abs=1e-4)


def test_publish_to_a_fleet(roots):
    from sparrow_server.distill.publish import PublishError, publish

    (app_a, engine_a, _), (app_b, engine_b, _) = _app(roots), _app(roots)
    with live_server(app_a) as a, live_server(app_b) as b:
        first = publish([a.url, b.url], "v1", str(roots / "v1"), alias="distill-latest")
        assert [(p.name, p.previous) for p in first] == [("v1", None), ("v1", None)]
        second = publish([a.url, b.url], "v2", str(roots / "v2"), alias="distill-latest")
        assert [(p.name, p.previous) for p in second] == [("v2", "v1"), ("v2", "v1")]
        for url, engine in ((a.url, engine_a), (b.url, engine_b)):
            listing = httpx.get(url + "/adapters").json()
            assert listing["aliases"] == {"distill-latest": "v2"} and engine.adapters() == ("v2",)
        with pytest.raises(PublishError) as exc:
            publish([a.url], "v3", "/etc", alias="distill-latest")  # outside the adapter root: 403
        assert a.url in exc.value.failures and "403" in exc.value.failures[a.url]
        assert httpx.get(a.url + "/adapters").json()["aliases"] == {"distill-latest": "v2"}  # unchanged


def test_fingerprint_follows_weight_updates(roots, tmp_path):
    """After a weight update the server checks adapters against its new base, not the one it started with."""
    new_base = make_adapter(tmp_path / "new-base", seed=8, fingerprint=model_fingerprint(tiny_model(seed=7)))
    base = {"model": tiny_model()}
    m = AdapterManager(_FakeEngine(), max_rank=8, base_fingerprint=lambda: model_fingerprint(base["model"]))
    m.load("v1", roots / "v1")
    base["model"] = tiny_model(seed=7)  # the server's weights change (update_weights)
    with pytest.raises(AdapterRequestError, match="another base model"):
        m.load("v2", roots / "v2")  # trained on the old base: refused now
    m.load("v3", new_base)  # trained on the updated base: accepted
    assert m.names() == ("v1", "v3")
