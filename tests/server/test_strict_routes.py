"""The control-plane, default-schedule, weight, adapter, autopilot and OpenAI routes follow the edge's
strict type rules (``STRICT`` in api_models.py) like ``/generate``: no boolean for an integer, no float
for an integer, no string for a number or a boolean, no NaN or Infinity; each answer is a 422 naming the
field and its value. Unknown keys stay ignored on the OpenAI routes (the ``openai`` client's extras).
A body that is not JSON at all is a 422 saying where it broke (line, column, character) and why."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from helpers.fake_engine import FakeEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.registry import ScheduleRegistry
from test_edge_bounds import assert_422, post_raw

COMPLETION = '"model": "fake", "prompt": "x"'
CHAT = '"model": "fake", "messages": [{"role": "user", "content": "x"}]'

# (method, path, raw JSON body, field named by the 422, its value)
CASES = [
    ("POST", "/release_memory_occupation", '{"tags": [true]}', "tags[0]", True),
    ("POST", "/resume_memory_occupation", '{"tags": ["kv_cache"], "rid": 7}', "rid", 7),
    ("POST", "/weights_checker", '{"allow_quant_error": 1}', "allow_quant_error", 1),
    ("POST", "/weights_checker", '{"action": "checksum", "allow_quant_error": "true"}', "allow_quant_error", "true"),
    ("POST", "/default_schedule", '{"name": 5}', "name", 5),
    ("POST", "/update_weights_from_disk", '{"model_path": "m", "token_step": true}', "token_step", True),
    ("POST", "/update_weights_from_disk", '{"model_path": "m", "token_step": 3.0}', "token_step", 3.0),
    ("POST", "/update_weights_from_disk", '{"model_path": "m", "flush_cache": 0}', "flush_cache", 0),
    ("POST", "/pause_generation", '{"mode": 1}', "mode", 1),
    ("POST", "/adapters", '{"name": 1, "path": "p"}', "name", 1),
    ("PUT", "/schedules/s/autopilot", '{"target": true}', "target", True),
    ("PUT", "/schedules/s/autopilot", '{"target": 0.9, "min_tokens": 30.0}', "min_tokens", 30.0),
    ("PUT", "/schedules/s/autopilot", '{"target": "0.9"}', "target", "0.9"),
    ("POST", "/schedules/s/versions", '{"version": true, "budgets_tokens": [64]}', "version", True),
    ("POST", "/v1/completions", f'{{{COMPLETION}, "max_tokens": true}}', "max_tokens", True),
    ("POST", "/v1/completions", f'{{{COMPLETION}, "n": 2.0}}', "n", 2.0),
    ("POST", "/v1/completions", f'{{{COMPLETION}, "temperature": "0.5"}}', "temperature", "0.5"),
    ("POST", "/v1/completions", f'{{{COMPLETION}, "logprobs": true}}', "logprobs", True),
    ("POST", "/v1/completions", f'{{{COMPLETION}, "seed": 1.5}}', "seed", 1.5),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "logprobs": 1}}', "logprobs", 1),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "top_logprobs": false}}', "top_logprobs", False),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "max_completion_tokens": 8.0}}', "max_completion_tokens", 8.0),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "stream": 1}}', "stream", 1),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "stream": true, "stream_options": {{"include_usage": "yes"}}}}',
     "stream_options.include_usage", "yes"),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "logit_bias": {{"5": true}}}}', "logit_bias[5]", True),
]

NON_FINITE = [
    ("PUT", "/schedules/s/autopilot", '{"target": NaN}', "target"),
    ("POST", "/weights_checker", '{"action": "checksum", "rid": Infinity}', "rid"),
    ("POST", "/default_schedule", '{"name": NaN}', "name"),
    ("POST", "/release_memory_occupation", '{"tags": [NaN]}', "tags[0]"),
    ("POST", "/v1/completions", f'{{{COMPLETION}, "temperature": NaN}}', "temperature"),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "top_p": -Infinity}}', "top_p"),
    ("POST", "/v1/chat/completions", f'{{{CHAT}, "unknown_extra": [1, NaN]}}', "unknown_extra[1]"),
]

# (method, path, a body that is not JSON, where it breaks: line, column, character, the parser's message)
MALFORMED = [
    ("POST", "/rollout", '{"input_ids": [1,\n 2,, 3]}', 2, 4, 21, "Expecting value"),
    ("POST", "/generate", '{"text": "x" "sampling_params": {}}', 1, 14, 13, "Expecting ',' delimiter"),
    ("POST", "/v1/chat/completions", '{"model": "fake", "messages": [', 1, 32, 31, "Expecting value"),
    ("POST", "/update_weights_from_disk", '{"model_path": "m",}', 1, 20, 19,
     "Expecting property name enclosed in double quotes"),
    ("PUT", "/schedules/s", '{"budgets_tokens": [64]', 1, 24, 23, "Expecting ',' delimiter"),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    registry = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("strict") / "schedules")
    with TestClient(create_app(FakeEngine(), registry)) as client:
        yield client


@pytest.mark.parametrize(("method", "path", "raw", "field", "value"), CASES)
def test_wrong_types_are_422_naming_the_field(client, method, path, raw, field, value):
    assert_422(post_raw(client, path, raw, method=method), field, value)


@pytest.mark.parametrize(("method", "path", "raw", "field"), NON_FINITE)
def test_non_finite_numbers_are_422_naming_the_field(client, method, path, raw, field):
    body = assert_422(post_raw(client, path, raw, method=method), field)
    assert body["error"]["value"] in ("NaN", "Infinity", "-Infinity")


@pytest.mark.parametrize(("method", "path", "raw", "line", "column", "char", "message"), MALFORMED)
def test_a_body_that_is_not_json_says_where_it_broke(client, method, path, raw, line, column, char, message):
    error = assert_422(post_raw(client, path, raw, method=method), "body")["error"]
    assert (error["line"], error["column"], error["position"]) == (line, column, char)
    assert f"not valid JSON: {message}: line {line} column {column} (char {char})" in error["message"]
    assert error["value"] in raw  # the text around the place it broke
