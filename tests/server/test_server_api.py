"""HTTP API in-process (TestClient): contract shapes and every bad-input case of the issue."""
from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from helpers.server_util import CharTokenizer
from helpers.tiny_models import TINY_CONTEXT, TINY_VOCAB, load_plain, save_tiny_model
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.registry import ScheduleRegistry

PROMPT = list(range(1, 41))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    model_dir = save_tiny_model(tmp_path_factory.mktemp("model"))
    tokenizer = CharTokenizer()
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), tokenizer, "tiny", kv_pool_tokens=4096)
    schedules = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("state") / "schedules")
    app = create_app(engine, schedules, tokenizer=tokenizer)
    with TestClient(app) as c:
        yield c
    torch.set_num_threads(previous)


def rollout(client, **body):
    body.setdefault("input_ids", PROMPT)
    body.setdefault("sampling_params", {"max_new_tokens": 4, "temperature": 0})
    return client.post("/rollout", json=body)


def test_non_streaming_rollout_shape(client):
    r = rollout(client, top_logprobs=3, rid="shape-1")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rid"] == "shape-1" and len(body["token_ids"]) == 4 == len(body["logprobs"]) == len(body["top_logprobs"])
    meta = body["meta"]
    assert {"finish_reason", "prompt_tokens", "completion_tokens", "schedule", "adapter", "kv_budget_tokens_mean",
            "weight_version"} <= set(meta)
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["schedule"]) == (40, 4, "dense")
    assert meta["kv_budget_tokens_mean"] == pytest.approx((41 + 42 + 43) / 3)
    assert body["top_logprobs"][0][0][1] == body["token_ids"][0]


def test_text_input_and_n_samples(client):
    r = rollout(client, input_ids=None, text="hello", apply_chat_template=True, n=3,
                sampling_params={"max_new_tokens": 3, "temperature": 1.0, "seed": 5})
    assert r.status_code == 200, r.text
    samples = r.json()["samples"]
    assert [s["index"] for s in samples] == [0, 1, 2] and len({s["rid"] for s in samples}) == 3
    assert all(s["meta"]["prompt_tokens"] == len("<user>hello<assistant>") + 1 for s in samples)
    assert all(isinstance(s["text"], str) for s in samples)


def test_streaming_sse_and_ndjson(client):
    with client.stream("POST", "/rollout", json={"input_ids": PROMPT, "stream": True,
                                                 "sampling_params": {"max_new_tokens": 5, "temperature": 0}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [l for l in r.iter_lines() if l]
    events = [json.loads(l[len("data: "):]) for l in lines]
    assert all(l.startswith("data: ") for l in lines) and len(events) == 5
    assert [e["done"] for e in events] == [False] * 4 + [True] and events[-1]["meta"]["completion_tokens"] == 5
    with client.stream("POST", "/rollout", headers={"accept": "application/x-ndjson"},
                       json={"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 5, "temperature": 0}}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        nd = [json.loads(l) for l in r.iter_lines() if l]
    assert [e["token_ids"] for e in nd] == [e["token_ids"] for e in events]


def test_generate_sglang_shape(client):
    r = client.post("/generate", json={"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 2,
                                       "sampling_params": {"max_new_tokens": 3, "temperature": 0,
                                                           "custom_params": {"sparrow_schedule": "dense"}},
                                       "some_future_sglang_key": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 3 and meta["completion_tokens"] == 3 and meta["prompt_tokens"] == 40
    assert [t for _, t, _ in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(x[2] is None for x in meta["output_token_logprobs"])
    assert len(meta["output_top_logprobs"]) == 3 and len(meta["output_top_logprobs"][0]) == 2
    assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "default" and meta["id"]
    with client.stream("POST", "/generate", json={"input_ids": PROMPT, "stream": True, "return_logprob": True,
                                                  "sampling_params": {"max_new_tokens": 3, "temperature": 0}}) as s:
        lines = [l for l in s.iter_lines() if l]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(l[6:]) for l in lines[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3]  # cumulative, as SGLang streams by default
    assert chunks[-1]["output_ids"] == body["output_ids"]


def test_schedules_endpoints(client):
    names = [s["name"] for s in client.get("/schedules").json()["schedules"]]
    assert names[0] == "dense" and "qwen3-1.7b-0.86" in names
    r = client.put("/schedules/mine", json={"budgets_tokens": [64, 128], "dense_layers": [0]})
    assert r.status_code == 200, r.text
    assert client.get("/schedules/mine").json()["budgets_tokens"] == [64, 128]
    assert rollout(client, schedule="mine").json()["meta"]["schedule"] == "mine"


def test_health_and_metrics(client):
    assert client.get("/health").json()["status"] == "ok"
    rollout(client)
    text = client.get("/metrics").text
    for name in ("sparrow_requests_total", "sparrow_generated_tokens_total", "sparrow_prompt_tokens_total",
                 "sparrow_request_latency_seconds_bucket", "sparrow_time_to_first_token_seconds_bucket",
                 "sparrow_kv_budget_tokens_bucket", "sparrow_running_requests", "sparrow_queued_requests",
                 "sparrow_weight_version_info"):
        assert name in text, name
    assert 'sparrow_requests_total{endpoint="rollout",schedule="dense",status="ok"}' in text


def error(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_unknown_schedule_and_adapter_404(client):
    e = error(rollout(client, schedule="no-such-schedule"), 404)
    assert e["name"] == "no-such-schedule" and "no-such-schedule" in e["message"]
    e = error(rollout(client, adapter="no-such-adapter"), 404)
    assert "no-such-adapter" in e["message"]
    e = error(client.get("/schedules/nope"), 404)
    assert "nope" in e["message"]
    r = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": {"custom_params": {"sparrow_schedule": "zzz"}}})
    assert "zzz" in error(r, 404)["message"]
    assert "ghost" in error(client.post("/generate", json={"input_ids": PROMPT, "lora_path": "ghost"}), 404)["message"]


@pytest.mark.parametrize("key,value", [("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("max_new_tokens", -1),
                                       ("temperature", "hot"), ("top_k", 0)])
def test_bad_sampling_params_422(client, key, value):
    e = error(rollout(client, sampling_params={key: value}), 422)
    assert e["field"] == f"sampling_params.{key}" and e["value"] == value
    assert f"sampling_params.{key}" in e["message"] and repr(value) in e["message"]


def test_context_overflow_400_names_both_numbers(client):
    e = error(rollout(client, sampling_params={"max_new_tokens": TINY_CONTEXT}), 400)
    assert "40" in e["message"] and str(TINY_CONTEXT) in e["message"]
    assert (e["prompt_tokens"], e["max_new_tokens"]) == (40, TINY_CONTEXT)


@pytest.mark.parametrize("ids,field", [([], "input_ids"), ([1, TINY_VOCAB], "input_ids[1]"), ([-1], "input_ids[0]")])
def test_bad_input_ids_422(client, ids, field):
    e = error(rollout(client, input_ids=ids), 422)
    assert e["field"] == field


def test_other_bad_inputs_422(client):
    assert error(rollout(client, text="hi"), 422)["field"] == "input_ids"  # both given
    assert error(rollout(client, input_ids=None), 422)["field"] == "input_ids"  # neither
    assert error(rollout(client, top_logprobs=21), 422)["field"] == "top_logprobs"
    assert error(rollout(client, n=0), 422)["field"] == "n"
    assert error(rollout(client, sampling_params={"stop": [""]}), 422)["field"] == "sampling_params.stop[0]"
    assert error(rollout(client, unknown_field=1), 422)["field"] == "unknown_field"
    assert error(rollout(client, sampling_params={"frequency_penalty": 2.5}), 422)["field"] == "sampling_params.frequency_penalty"
    assert error(rollout(client, sampling_params={"regex": "a+"}), 422)["field"] == "sampling_params.regex"


@pytest.mark.parametrize("body,field,reason", [
    ({"budgets_tokens": [100]}, "budgets_tokens[0]", "multiple of page_size"),
    ({"budgets_tokens": [256, 128]}, "budgets_tokens[1]", "decreases"),
    ({"budgets_tokens": [32]}, "budgets_tokens[0]", "reserved"),
    ({"bogus": 1}, "bogus", "unknown field"),
    ({"name": "other"}, "name", "differs"),
    ([1, 2], "<root>", "JSON object"),
])
def test_malformed_schedule_put_422(client, body, field, reason):
    e = error(client.put("/schedules/bad", json=body), 422)
    assert e["field"] == field and reason in e["reason"]


def test_builtin_schedule_cannot_be_replaced(client):
    assert "built-in" in error(client.put("/schedules/dense", json={"budgets_tokens": [64]}), 422)["reason"]


class ByteTokenizer:
    """One token per UTF-8 byte; decoding a split character yields U+FFFD, as real BPE tokenizers do."""

    def decode(self, ids, skip_special_tokens=True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_incremental_text_never_splits_characters():
    from sparrow_server.server.service import TextDecoder

    text = "Héllo — 日本語 🎉 ok"
    ids = list(text.encode())
    decoder = TextDecoder(ByteTokenizer())
    deltas = [decoder.delta(ids[: i + 1]) for i in range(len(ids))]
    assert "".join(deltas) == text and all("\ufffd" not in d for d in deltas)
    assert TextDecoder(None).delta([1, 2]) is None


def test_stop_strings(client):
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    full = rollout(client, sampling_params=params).json()
    decode = CharTokenizer().decode
    stop = full["text"][4:6]
    end = next(i for i in range(1, 13) if stop in decode(full["token_ids"][:i]))
    for value in (stop, [stop, "zzzzzzzz"]):
        out = rollout(client, sampling_params={**params, "stop": value}).json()
        assert out["meta"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert out["token_ids"] == full["token_ids"][:end]
