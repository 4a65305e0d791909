"""The OpenAI-compatible routes, driven by the official ``openai`` Python client against a live
reference server: models, completions and chat completions, streamed and not, logprobs; the schedule
named with ``extra_body={"sparrow_schedule": ...}`` and the adapter with ``model="BASE:ADAPTER"``;
every answer equals ``/generate`` on the same prompt (greedy), so the routes add no semantics of their
own. verl's ``main_generation_server.submit_request`` (volcengine/verl@b178a3c) posts the chat body
and builds ``openai.types.chat.ChatCompletion(**data)``: replayed last."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from helpers.live_server import live_server
from helpers.server_util import CharTokenizer
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.security import SecurityConfig
from sparrow_server.sparsity.registry import ScheduleRegistry
from test_adapter_lifecycle import make_adapter
from helpers.tiny_models import tiny_model

SPARSE = {"budgets_tokens": [48], "dense_layers": [0], "sink_pages": 1, "recent_pages": 1}
LONG_PROMPT = "the sparrow flies over the long field " * 3  # > 64 tokens: a 48-token budget is sparse


@pytest.fixture(scope="module")
def server(tmp_path_factory, one_torch_thread):
    root = tmp_path_factory.mktemp("openai")
    make_adapter(root / "lora", seed=3)
    tokenizer = CharTokenizer()
    engine = ReferenceEngine(tiny_model(), tokenizer, "tiny", kv_pool_tokens=8192)
    registry = ScheduleRegistry.load(persist_dir=root / "schedules")
    app = create_app(engine, registry, tokenizer=tokenizer, security=SecurityConfig(adapter_roots=(root,)))
    with live_server(app) as live:
        httpx.put(f"{live.url}/schedules/oa-sparse", json=SPARSE, timeout=10).raise_for_status()
        httpx.post(f"{live.url}/adapters", json={"name": "mine", "path": str(root / "lora")}, timeout=60).raise_for_status()
        live.client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        yield live


def generate(url: str, **body) -> dict:
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    r.raise_for_status()
    return r.json()


def test_models_lists_the_base_and_its_adapters(server):
    ids = [m.id for m in server.client.models.list().data]
    assert ids == ["tiny", "tiny:mine"]
    assert server.client.models.retrieve("tiny:mine").id == "tiny:mine"


def test_completion_equals_generate(server):
    out = server.client.completions.create(model="tiny", prompt="sparrow", max_tokens=6, temperature=0, logprobs=2)
    ref = generate(server.url, text="sparrow", sampling_params={"max_new_tokens": 6, "temperature": 0},
                   return_logprob=True, top_logprobs_num=2)
    choice = out.choices[0]
    assert choice.text == ref["text"] and choice.finish_reason == "length"
    assert choice.logprobs.token_logprobs == pytest.approx([lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]])
    assert len(choice.logprobs.top_logprobs) == 6 and all(len(t) <= 2 for t in choice.logprobs.top_logprobs)
    assert out.usage.prompt_tokens == len("sparrow") + 1 and out.usage.completion_tokens == 6
    assert choice.model_extra["sparrow"]["schedule"] == "dense"


def test_completion_stream_concatenates_to_the_whole(server):
    whole = server.client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=8, temperature=0)
    chunks = list(server.client.completions.create(model="tiny", prompt=[5, 6, 7, 8], max_tokens=8, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8 and chunks[-1].choices == []


def test_chat_equals_generate_on_the_template(server):
    messages = [{"role": "user", "content": "hello"}]
    out = server.client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0,
                                                logprobs=True, top_logprobs=3)
    ids = CharTokenizer().apply_chat_template(messages)
    ref = generate(server.url, input_ids=ids, sampling_params={"max_new_tokens": 5, "temperature": 0},
                   return_logprob=True)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == ref["text"]
    assert [c.logprob for c in choice.logprobs.content] == pytest.approx(
        [lp for lp, _, _ in ref["meta_info"]["output_token_logprobs"]])
    assert all(len(c.top_logprobs) == 3 for c in choice.logprobs.content)
    assert out.object == "chat.completion" and out.usage.prompt_tokens == len(ids)


def test_chat_stream_with_n_samples(server):
    stream = server.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4, temperature=1.0, seed=7, n=2, stream=True)
    text, finish, roles = {0: "", 1: ""}, {}, set()
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            roles.add(c.delta.role) if c.delta.role else None
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    whole = server.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=4, temperature=1.0, seed=7, n=2)
    assert roles == {"assistant"} and finish == {c.index: c.finish_reason for c in whole.choices}
    assert text == {c.index: c.message.content for c in whole.choices} and text[0] != text[1]


def test_schedule_and_adapter_naming(server):
    dense = server.client.completions.create(model="tiny", prompt=LONG_PROMPT, max_tokens=6, temperature=0)
    sparse = server.client.completions.create(model="tiny", prompt=LONG_PROMPT, max_tokens=6, temperature=0,
                                              extra_body={"sparrow_schedule": "oa-sparse"})
    ref = generate(server.url, text=LONG_PROMPT, sampling_params={"max_new_tokens": 6, "temperature": 0,
                                                                  "custom_params": {"sparrow_schedule": "oa-sparse"}})
    meta = sparse.choices[0].model_extra["sparrow"]
    assert meta["schedule"] == "oa-sparse" and sparse.choices[0].text == ref["text"]
    assert meta["kv_budget_tokens_mean"] < dense.choices[0].model_extra["sparrow"]["kv_budget_tokens_mean"]
    adapted = server.client.completions.create(model="tiny:mine", prompt="sparrow", max_tokens=6, temperature=0)
    ref = generate(server.url, text="sparrow", lora_path="mine", sampling_params={"max_new_tokens": 6, "temperature": 0})
    assert adapted.choices[0].model_extra["sparrow"]["adapter"] is not None and adapted.choices[0].text == ref["text"]
    with pytest.raises(openai.NotFoundError, match="ghost"):
        server.client.completions.create(model="tiny:ghost", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError, match="nope"):
        server.client.completions.create(model="tiny", prompt="x", max_tokens=1, extra_body={"sparrow_schedule": "nope"})


def test_unsupported_fields_are_refused_by_name(server):
    for kwargs, field in (({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
                          ({"response_format": {"type": "json_object"}}, "response_format"),
                          ({"frequency_penalty": 3.0}, "frequency_penalty"),
                          ({"max_tokens": -1}, "max_tokens"), ({"extra_body": {"regex": "a+"}}, "regex")):
        with pytest.raises(openai.UnprocessableEntityError) as exc:
            server.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], **kwargs)
        assert exc.value.body["field"] == field, exc.value.body


def test_verl_generation_server_chat_request(server):
    """verl main_generation_server.submit_request: aiohttp POST of {"model", "messages", **sampling_params}
    with a Bearer header, then ChatCompletion(**data)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}], "temperature": 0, "top_p": 1.0,
            "max_tokens": 5}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body,
                   headers={"Authorization": "Bearer token-abc123"}, timeout=60)
    completion = ChatCompletion(**json.loads(r.content))
    assert completion.choices[0].finish_reason == "length" and isinstance(completion.choices[0].message.content, str)


def test_completion_of_several_prompts_is_prompt_major(server):
    prompts = ["sparrow", "field of", "wings"]
    out = server.client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3, 4, 5]
    tokenizer = CharTokenizer()
    for i, prompt in enumerate(prompts):
        ref = generate(server.url, text=prompt, sampling_params={"max_new_tokens": 5, "temperature": 0})
        assert out.choices[2 * i].text == out.choices[2 * i + 1].text == ref["text"]
    assert out.usage.prompt_tokens == sum(len(tokenizer(p)["input_ids"]) for p in prompts) and out.usage.completion_tokens == 6 * 5
    stream = server.client.completions.create(model="tiny", prompt=prompts, max_tokens=5, temperature=0, n=2,
                                              stream=True, stream_options={"include_usage": True})
    text: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + c.text
        usage = chunk.usage or None
    assert text == {c.index: c.text for c in out.choices} and usage.total_tokens == out.usage.total_tokens
    tokens = server.client.completions.create(model="tiny", prompt=[[9, 8, 7], [6, 5, 4, 3]], max_tokens=2,
                                              temperature=0)
    assert [c.index for c in tokens.choices] == [0, 1] and tokens.usage.prompt_tokens == 7
