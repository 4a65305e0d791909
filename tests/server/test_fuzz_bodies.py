"""Hypothesis-generated request bodies (well-typed, mistyped and garbage) for ``/rollout``,
``/generate`` and ``PUT /schedules``: never a 5xx; every error names its type (and its field
on 422); a 200 stream carries no error event. Needs no schemathesis (``test_fuzz_api.py``)."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.fuzz_app import fuzz_app, running_engine
from helpers.tiny_models import TINY_VOCAB

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
def client(tmp_path_factory):
    with running_engine(tmp_path_factory) as engine:
        with TestClient(fuzz_app(engine, tmp_path_factory), raise_server_exceptions=False) as c:
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
