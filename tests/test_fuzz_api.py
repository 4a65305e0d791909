"""Fuzzing the HTTP API: no input makes the server answer 5xx.

- schemathesis against the app's own OpenAPI schema (skipped where schemathesis is not
  installed): without a key, generation and schedules (pausing, weight updates and aborts are left
  out because they change what later examples see); with a key, every state-changing operation,
  which must refuse the unauthenticated examples with 401;
- hypothesis-generated JSON bodies for ``/rollout`` and ``/generate`` (always runs).

A tiny random model on the reference engine, so generation is real and fast.
"""
from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.tiny_models import TINY_VOCAB, load_plain, save_tiny_model
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.limits import Limits
from sparrow_server.server.security import SecurityConfig
from sparrow_server.sparsity.registry import ScheduleRegistry

schemathesis = pytest.importorskip("schemathesis")

KEY = "fuzz-key-0123456789"
LIMITS = Limits(max_new_tokens_limit=16, max_n=4, request_timeout_s=60)
# Operations fuzzed without a key (pausing, weight updates and aborts change what later examples see).
OPEN = {("POST", "/rollout"), ("POST", "/generate"), ("PUT", "/schedules/{name}"), ("GET", "/schedules/{name}")}
ADMIN = {("PUT", "/schedules/{name}"), ("POST", "/update_weights_from_disk"), ("POST", "/pause_generation"),
         ("POST", "/continue_generation"), ("POST", "/adapters"), ("DELETE", "/adapters/{name}"),
         ("PUT", "/adapters/aliases/{alias}"), ("DELETE", "/adapters/aliases/{alias}")}
EXAMPLES = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    model_dir = save_tiny_model(tmp_path_factory.mktemp("model"))
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=4096)
    engine.start_thread()  # schemathesis calls the app without running its lifespan
    yield engine
    engine._stopping = True
    with engine._cond:
        engine._cond.notify_all()
    torch.set_num_threads(previous)


def make_app(engine, tmp_path_factory, security: SecurityConfig | None):
    schedules = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("state") / "schedules")
    return create_app(engine, schedules, security=security, limits=LIMITS)


@pytest.fixture(scope="module")
def open_schema(engine, tmp_path_factory):
    app = make_app(engine, tmp_path_factory, None)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def keyed_schema(engine, tmp_path_factory):
    return schemathesis.openapi.from_asgi("/openapi.json", make_app(engine, tmp_path_factory, SecurityConfig(api_key=KEY)))


def operation_of(ctx) -> tuple[str, str]:
    return ctx.operation.method.upper(), ctx.operation.path


open_api = schemathesis.pytest.from_fixture("open_schema").include(lambda ctx: operation_of(ctx) in OPEN)
keyed_api = schemathesis.pytest.from_fixture("keyed_schema").include(lambda ctx: operation_of(ctx) in ADMIN)


@open_api.parametrize()
@EXAMPLES
def test_no_5xx_without_key(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])



@keyed_api.parametrize()
@EXAMPLES
def test_no_5xx_and_admin_needs_key(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    operation = (case.operation.method.upper(), case.operation.path)
    if operation in ADMIN and case.method.upper() == operation[0]:  # not the wrong-method probes (405)
        assert response.status_code == 401, (case.method, case.path, response.status_code)


# ----- hypothesis bodies (no schemathesis needed) -------------------------------------------------
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=8))
json_any = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                              st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=10)
token_ids = st.lists(st.integers(-2, TINY_VOCAB + 2), max_size=24)
sampling = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(st.integers(-2, 20), json_any), "temperature": st.one_of(st.floats(-1, 3), json_any),
    "top_p": st.floats(-0.5, 1.5), "top_k": st.integers(-3, 200), "min_p": st.floats(-0.5, 1.5),
    "seed": st.one_of(st.integers(-5, 2**70), json_any), "stop_token_ids": st.one_of(token_ids, json_any),
    "ignore_eos": st.booleans(), "n": st.integers(-1, 6), "custom_params": st.one_of(
        st.fixed_dictionaries({"sparrow_schedule": st.one_of(st.sampled_from(["dense", "qwen3-1.7b-0.86", "nope"]), json_any)}),
        json_any),
})
rollout_bodies = st.fixed_dictionaries({}, optional={
    "input_ids": st.one_of(token_ids, json_any), "text": st.one_of(st.text(max_size=10), json_any),
    "sampling_params": st.one_of(sampling, json_any), "schedule": st.one_of(st.sampled_from(["dense", "nope"]), json_any),
    "adapter": st.one_of(st.none(), st.text(max_size=4)), "top_logprobs": st.integers(-2, 25), "n": st.integers(-1, 6),
    "stream": st.booleans(), "rid": st.one_of(st.none(), st.text(max_size=6)), "return_selected_pages": st.booleans(),
    "extra": json_any,
})
generate_bodies = st.fixed_dictionaries({}, optional={
    "input_ids": st.one_of(token_ids, json_any), "sampling_params": st.one_of(sampling, json_any),
    "return_logprob": st.booleans(), "top_logprobs_num": st.integers(-2, 25), "lora_path": st.one_of(st.none(), json_any),
    "stream": st.booleans(), "rid": st.one_of(st.none(), st.text(max_size=6)), "logprob_start_len": json_any,
})


@pytest.fixture(scope="module")
def client(engine, tmp_path_factory):
    with TestClient(make_app(engine, tmp_path_factory, None), raise_server_exceptions=False) as c:
        yield c


def check_response(response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["type"] and error["message"]
        if response.status_code == 422:
            assert "field" in error
    elif response.headers["content-type"].startswith("text/event-stream"):
        lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
        events = [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]
        assert events and all("error" not in e for e in events)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(rollout_bodies, json_any))
def test_rollout_bodies_never_5xx(client, body):
    check_response(client.post("/rollout", json=body))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(generate_bodies, json_any))
def test_generate_bodies_never_5xx(client, body):
    check_response(client.post("/generate", json=body))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=64))
def test_garbage_bytes_never_5xx(client, raw):
    for path in ("/rollout", "/generate"):
        check_response(client.post(path, content=raw, headers={"content-type": "application/json"}))
    check_response(client.put("/schedules/fuzzed", content=raw, headers={"content-type": "application/json"}))
