"""Bounds at the HTTP edge: every number a request carries is refused at parse time (422 naming the
field and value, in a body that is strict JSON) unless the engine can execute it; non-finite
numbers and lone surrogates anywhere in a body, booleans as integers, seeds beyond 64 bits; a
schedule is validated in full (page size, name length as a file name) before anything is stored."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from helpers.fake_engine import FakeEngine
from sparrow_server.engine.bounds import MAX_SEED, MAX_TOP_K
from sparrow_server.server.app import create_app
from sparrow_server.server.security import SecurityConfig
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule

OK_SAMPLING = '"max_new_tokens": 3'


@pytest.fixture()
def client(tmp_path):
    registry = ScheduleRegistry.load(persist_dir=tmp_path / "schedules")
    with TestClient(create_app(FakeEngine(), registry)) as client:
        yield client


def strict_json(text: str):
    def refuse(token):
        raise AssertionError(f"error body is not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def post_raw(client, path: str, raw: str, method: str = "POST"):
    return client.request(method, path, content=raw.encode("utf-8", "surrogatepass"),
                          headers={"content-type": "application/json"})


def assert_422(response, field: str, value=None) -> dict:
    assert response.status_code == 422, response.text
    body = strict_json(response.text)
    assert body["error"]["field"] == field, body
    if value is not None:
        assert body["error"]["value"] == value, body
    return body


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("path", ["/rollout", "/generate"])
def test_non_finite_numbers_are_422_with_a_json_body(client, path, token):
    r = post_raw(client, path, f'{{"input_ids": [1, 2], "sampling_params": {{"temperature": {token}}}}}')
    assert_422(r, "sampling_params.temperature", "-Infinity" if token == "-Infinity" else
               "NaN" if token == "NaN" else "Infinity")


def test_non_finite_numbers_anywhere_in_a_body(client):
    r = post_raw(client, "/generate", '{"input_ids": [1, 2], "sampling_params": {"custom_params": {"x": [1, NaN]}}}')
    assert_422(r, "sampling_params.custom_params.x[1]", "NaN")
    r = post_raw(client, "/schedules/s1", '{"budgets_tokens": [64], "threshold": Infinity}', method="PUT")
    assert_422(r, "threshold", "Infinity")
    assert client.get("/schedules/s1").status_code == 404
    r = post_raw(client, "/rollout", '{"input_ids": [1, 2], "sampling_params": {"frequency_penalty": -1e999}}')
    assert_422(r, "sampling_params.frequency_penalty", "-Infinity")


def test_lone_surrogates_are_422(client):
    r = post_raw(client, "/rollout", '{"text": "abc \\ud800 def"}')
    body = assert_422(r, "text")
    assert "\\ud800" in body["error"]["value"] and "Unicode" in body["error"]["message"]
    r = post_raw(client, "/generate", '{"input_ids": [1], "rid": "\\udfff"}')
    assert_422(r, "rid")
    r = post_raw(client, "/generate", '{"input_ids": [1], "sampling_params": {"custom_params": {"\\ud83d": 1}}}')
    assert r.status_code == 422 and "Unicode" in strict_json(r.text)["error"]["message"]
    r = post_raw(client, "/rollout", '{"text": "emoji \\ud83d\\ude00 is fine", "input_ids": null}')
    assert r.status_code == 422 and strict_json(r.text)["error"]["field"] == "text"  # FakeEngine has no tokenizer
    assert "tokenizer" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/rollout", "/generate"])
def test_booleans_are_not_integers(client, path):
    assert_422(client.post(path, json={"input_ids": [True, 2]}), "input_ids[0]", True)
    assert_422(client.post(path, json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": True}}),
               "sampling_params.max_new_tokens", True)
    assert_422(client.post(path, json={"input_ids": [1, 2], "sampling_params": {"top_k": 2.0}}),
               "sampling_params.top_k", 2.0)
    assert_422(client.post(path, json={"input_ids": [1, 2], "sampling_params": {"temperature": False}}),
               "sampling_params.temperature", False)


def test_top_k_and_seed_bounds(client):
    def rollout(**sampling):
        return client.post("/rollout", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, **sampling}})

    assert_422(rollout(top_k=10 ** 30), "sampling_params.top_k", 10 ** 30)
    assert_422(rollout(top_k=1e30), "sampling_params.top_k")
    assert rollout(top_k=MAX_TOP_K).status_code == 200
    assert_422(rollout(seed=MAX_SEED + 1), "sampling_params.seed", MAX_SEED + 1)
    assert_422(rollout(seed=-1), "sampling_params.seed", -1)
    assert rollout(seed=MAX_SEED).status_code == 200
    r = client.post("/rollout", json={"input_ids": [1, 2], "n": 4, "sampling_params": {"seed": MAX_SEED - 2}})
    body = assert_422(r, "sampling_params.seed", MAX_SEED - 2)
    assert "seed + 3" in body["error"]["message"]
    r = client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"n": 2, "sampling_seed": MAX_SEED}})
    assert_422(r, "sampling_params.sampling_seed", MAX_SEED)
    assert_422(rollout(temperature=1e7), "sampling_params.temperature", 1e7)
    assert_422(rollout(stop_token_ids=[2 ** 40]), "sampling_params.stop_token_ids[0]", 2 ** 40)


def test_schedule_is_validated_in_full_before_it_is_stored(client, tmp_path):
    r = client.put("/schedules/p32", json={"budgets_tokens": [128], "page_size": 32})
    assert_422(r, "page_size", 32)
    assert client.get("/schedules/p32").status_code == 404
    name = "é" * 120  # 120 characters, 240 bytes: "<name>.json" would not fit a file name
    r = client.put(f"/schedules/{name}", json={"budgets_tokens": [64]})
    assert_422(r, "name", name)
    assert client.get(f"/schedules/{name}").status_code == 404 and name not in client.get("/schedules").text
    r = client.put("/schedules/huge", json={"budgets_tokens": [16 * 2 ** 70]})
    assert_422(r, "budgets_tokens[0]", 16 * 2 ** 70)
    assert not list((tmp_path / "schedules").glob("*"))
    ok = "é" * 90  # 180 bytes: fine
    assert client.put(f"/schedules/{ok}", json={"budgets_tokens": [64]}).status_code == 200
    assert (tmp_path / "schedules" / f"{ok}.json").exists()


def test_a_failed_store_leaves_nothing_registered(tmp_path, monkeypatch):
    registry = ScheduleRegistry.load(persist_dir=tmp_path / "schedules")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sparrow_server.sparsity.registry.os.replace", failing_replace)
    with pytest.raises(OSError):
        registry.register(Schedule(name="full-disk", budgets_tokens=(64,)), persist=True)
    assert "full-disk" not in registry and not list((tmp_path / "schedules").glob("*"))


def test_unauthenticated_bodies_get_401_before_any_body_check(tmp_path):
    registry = ScheduleRegistry.load(persist_dir=tmp_path / "schedules")
    with TestClient(create_app(FakeEngine(), registry, security=SecurityConfig(api_key="k" * 20))) as client:
        r = post_raw(client, "/schedules/x", '{"budgets_tokens": [NaN], "name": "\\ud800"}', method="PUT")
        assert r.status_code == 401
