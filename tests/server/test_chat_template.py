"""Chat prompts through the embedded model's real tokenizer and chat template (SmolLM2-135M-Instruct)
with the installed transformers, whose ``apply_chat_template(tokenize=True)`` returns a ``BatchEncoding``
in 5.x: ``/v1/chat/completions`` over HTTP (the raw body, and the openai client plain and streamed),
``/rollout`` with ``apply_chat_template``, the CLI's ``rollout --chat`` and calibration prompts all
send the template's token ids. The oracle renders the template as text and tokenises that, so it
does not share the code under test. The model is a tiny random Llama with SmolLM2's vocabulary."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from helpers.live_server import live_server
from helpers.tiny_models import tiny_model
from sparrow_server.calibrate.prompts import load_prompts
from sparrow_server.cli import main
from sparrow_server.engine.chat_template import chat_template_ids, token_id_list
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.registry import ScheduleRegistry

MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]
GREEDY = {"max_new_tokens": 5, "temperature": 0}


def template_ids(tokenizer, messages=MESSAGES) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def server(smollm2_tokenizer, tmp_path_factory, one_torch_thread):
    tok = smollm2_tokenizer
    model = tiny_model(vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    engine = ReferenceEngine(model, tok, "smol-tiny", kv_pool_tokens=8192)
    registry = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("chat-schedules"))
    with live_server(create_app(engine, registry, tokenizer=tok)) as live:
        live.tokenizer = tok
        live.ids = template_ids(tok)
        live.client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        yield live


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def generate_text(server, ids: list[int]) -> str:
    r = post(server, "/generate", {"input_ids": ids, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    return r.json()["text"]


def test_the_installed_transformers_returns_a_batch_encoding_and_the_helper_reads_its_ids(smollm2_tokenizer):
    raw = smollm2_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = template_ids(smollm2_tokenizer)
    assert token_id_list(raw) == ids == chat_template_ids(smollm2_tokenizer, MESSAGES)
    assert token_id_list([ids]) == token_id_list({"input_ids": [ids]}) == ids
    with pytest.raises(TypeError, match="not token ids"):
        token_id_list(["input_ids", "attention_mask"])


def test_chat_completion_over_http_sends_the_template_ids(server):
    r = post(server, "/v1/chat/completions", {"model": "smol-tiny", "messages": MESSAGES, "max_tokens": 5,
                                              "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == len(server.ids)
    assert body["choices"][0]["message"]["content"] == generate_text(server, server.ids)


def test_openai_client_chat_plain_and_streamed(server):
    whole = server.client.chat.completions.create(model="smol-tiny", messages=MESSAGES, max_tokens=5, temperature=0)
    assert whole.usage.prompt_tokens == len(server.ids)
    assert whole.choices[0].message.content == generate_text(server, server.ids)
    chunks = list(server.client.chat.completions.create(model="smol-tiny", messages=MESSAGES, max_tokens=5,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == len(server.ids)


def test_chat_template_kwargs_reach_the_template_and_reserved_ones_are_refused(server):
    r = post(server, "/v1/chat/completions", {"model": "smol-tiny", "messages": MESSAGES, "max_tokens": 1,
                                              "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    for key, value in (("tokenize", False), ("return_dict", True), ("add_generation_prompt", False)):
        r = post(server, "/v1/chat/completions", {"model": "smol-tiny", "messages": MESSAGES, "max_tokens": 1,
                                                  "chat_template_kwargs": {key: value}})
        assert r.status_code == 422, r.text
        assert (r.json()["error"]["field"], r.json()["error"]["value"]) == (f"chat_template_kwargs.{key}", value)


def test_rollout_with_apply_chat_template_sends_the_template_ids(server):
    r = post(server, "/rollout", {"text": MESSAGES[0]["content"], "apply_chat_template": True, "sampling_params": GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["prompt_tokens"] == len(server.ids)
    assert body["text"] == generate_text(server, server.ids)


def test_cli_rollout_chat(server, capsys):
    rc = main(["rollout", "--url", server.url, "--text", MESSAGES[0]["content"], "--chat", "--max-new-tokens", "3",
               "--temperature", "0"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"prompt {len(server.ids)} tokens" in out.out


def test_calibration_prompt_goes_through_the_template(smollm2_tokenizer, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": MESSAGES[0]["content"]}) + "\n")
    assert [list(p) for p in load_prompts(path, smollm2_tokenizer)] == [template_ids(smollm2_tokenizer)]
