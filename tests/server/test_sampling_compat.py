"""SGLang 0.5.17's sampling keys on ``/generate`` (reference engine), checked against a plain
PyTorch computation: penalties, ``min_new_tokens`` and ``logit_bias`` (greedy and sampled), null
values, neutral empties, ``no_stop_trim``, and a 422 naming each key this engine does not implement.

Semantics read from sglang 0.5.17 (the PyPI wheel): ``srt/sampling/sampling_params.py``
(``__post_init__``: null = default; bounds in ``verify``), ``srt/sampling/penaltylib/*.py``
(penalties count generated tokens only; min_new_tokens masks EOS and stop ids),
``srt/sampling/sampling_batch_info.py`` (``apply_logits_bias``: additive, then scaling, then bias),
``srt/managers/detokenizer_manager.py`` (``trim_matched_stop``), ``lang/backend/runtime_endpoint.py``
and ``lang/ir.py`` (the frontend's ``gen()`` payload)."""
from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from helpers.server_util import CharTokenizer
from helpers.tiny_models import TINY_CONTEXT, TINY_VOCAB, load_plain
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app

EOS = TINY_VOCAB - 1
PROMPT = [(7 * i + 3) % (TINY_VOCAB - 1) + 1 for i in range(24)]
PENALTIES = {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repetition_penalty": 1.8}
TOL = 1e-4


@pytest.fixture(scope="module")
def plain(model_dir):
    return load_plain(model_dir)


@pytest.fixture(scope="module")
def client(model_dir, one_torch_thread):
    tokenizer = CharTokenizer()
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), tokenizer, "tiny", kv_pool_tokens=4096)
    with TestClient(create_app(engine, tokenizer=tokenizer)) as c:
        yield c


def generate(client, status=200, **body):
    body.setdefault("input_ids", PROMPT)
    r = client.post("/generate", json=body)
    assert r.status_code == status, r.text
    return r.json()


def adjust(row: torch.Tensor, done: list[int], params: dict) -> torch.Tensor:
    """The penalties written out token by token (an independent reading of penaltylib)."""
    out = row.clone().float()
    for token in set(done):
        count = done.count(token)
        out[token] -= params.get("frequency_penalty", 0.0) * count + params.get("presence_penalty", 0.0)
        rep = params.get("repetition_penalty", 1.0)
        out[token] = out[token] * rep if out[token] < 0 else out[token] / rep
    if len(done) < params.get("min_new_tokens", 0):
        out[EOS] = float("-inf")
    for key, bias in params.get("logit_bias", {}).items():
        out[int(key)] += bias
    return out


def reference_logprobs(plain, output: list[int], params: dict, temperature: float) -> list[torch.Tensor]:
    """log_softmax of the adjusted logits at each generated position."""
    with torch.no_grad():
        logits = plain(input_ids=torch.tensor([PROMPT + output])).logits[0]
    n = len(PROMPT)
    return [torch.log_softmax(adjust(logits[n - 1 + t], output[:t], params) / temperature, dim=-1)
            for t in range(len(output))]


def logprobs_of(out) -> list[float]:
    return [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


def test_penalties_greedy_match_plain_pytorch(client, plain):
    params = {"max_new_tokens": 12, "temperature": 0, **PENALTIES}
    out = generate(client, sampling_params=params, return_logprob=True)
    plain_out = generate(client, sampling_params={"max_new_tokens": 12, "temperature": 0})
    assert out["output_ids"] != plain_out["output_ids"]  # the penalties changed the rollout
    ref = reference_logprobs(plain, out["output_ids"], params, 1.0)
    for t, (token, lp) in enumerate(zip(out["output_ids"], logprobs_of(out))):
        assert int(torch.argmax(ref[t])) == token, t
        assert abs(float(ref[t][token]) - lp) < TOL, t


def test_penalties_sampled_report_the_adjusted_distribution(client, plain):
    params = {"max_new_tokens": 10, "temperature": 0.8, "sampling_seed": 11, **PENALTIES}
    out = generate(client, sampling_params=params, return_logprob=True)
    again = generate(client, sampling_params=params)
    assert again["output_ids"] == out["output_ids"]  # seeded
    ref = reference_logprobs(plain, out["output_ids"], params, 0.8)
    got = logprobs_of(out)
    assert max(abs(float(ref[t][tok]) - got[t]) for t, tok in enumerate(out["output_ids"])) < TOL


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_min_new_tokens_holds_eos_back(client, plain, temperature):
    forced = {"logit_bias": {str(EOS): 40.0}}  # EOS wins every step once allowed
    base = {"max_new_tokens": 8, "temperature": temperature, "sampling_seed": 3, **forced}
    assert generate(client, sampling_params=base)["output_ids"] == [EOS]
    params = {**base, "min_new_tokens": 3}
    out = generate(client, sampling_params=params, return_logprob=True)
    assert len(out["output_ids"]) == 4 and EOS not in out["output_ids"][:3] and out["output_ids"][3] == EOS
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    ref = reference_logprobs(plain, out["output_ids"], params, temperature or 1.0)
    got = logprobs_of(out)
    assert max(abs(float(ref[t][tok]) - got[t]) for t, tok in enumerate(out["output_ids"])) < TOL


def test_null_is_the_default_and_empties_are_neutral(client):
    seeded = {"max_new_tokens": 6, "sampling_seed": 5}
    nulls = {k: None for k in ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                               "repetition_penalty", "min_new_tokens", "n", "ignore_eos", "skip_special_tokens",
                               "spaces_between_special_tokens", "no_stop_trim", "stop", "stop_token_ids",
                               "json_schema", "regex", "ebnf", "structural_tag", "custom_params", "stream_interval")}
    empties = {"stop_regex": [], "logit_bias": {}, "stop": [], "stop_token_ids": [], "json_schema": "", "regex": ""}
    want = generate(client, sampling_params=seeded)["output_ids"]
    assert generate(client, sampling_params={**seeded, **nulls})["output_ids"] == want
    assert generate(client, sampling_params={**seeded, **empties})["output_ids"] == want


def test_null_max_new_tokens_runs_to_the_end_of_the_context(client):
    prompt = [5] * (TINY_CONTEXT - 7)
    out = generate(client, input_ids=prompt, sampling_params={"max_new_tokens": None, "ignore_eos": True,
                                                                "temperature": 0})
    assert len(out["output_ids"]) == 7 and out["meta_info"]["finish_reason"] == {"type": "length", "length": 7}


@pytest.mark.parametrize("key,value", [("regex", "a+"), ("json_schema", "{}"), ("ebnf", "root ::= 'a'"),
                                       ("structural_tag", "{}"), ("stop_regex", ["a+"]), ("stop_regex", "a")])
def test_unimplemented_keys_are_refused_by_name(client, key, value):
    r = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": {key: value}})
    assert r.status_code == 422 and r.json()["error"]["field"] == f"sampling_params.{key}", r.text


@pytest.mark.parametrize("params,field", [({"frequency_penalty": 2.5}, "frequency_penalty"),
                                          ({"presence_penalty": -3}, "presence_penalty"),
                                          ({"repetition_penalty": 0}, "repetition_penalty"),
                                          ({"min_new_tokens": -1}, "min_new_tokens"),
                                          ({"logit_bias": {"x": 1.0}}, "logit_bias.x"),
                                          ({"logit_bias": {str(TINY_VOCAB): 1.0}}, f"logit_bias.{TINY_VOCAB}")])
def test_out_of_range_values_are_422(client, params, field):
    r = client.post("/generate", json={"input_ids": PROMPT, "sampling_params": params})
    assert r.status_code == 422 and r.json()["error"]["field"] == f"sampling_params.{field}", r.text


def test_stop_string_trimmed_unless_no_stop_trim(client):
    greedy = {"max_new_tokens": 12, "temperature": 0}
    full = generate(client, input_ids=None, text="sparrow", sampling_params=greedy)["text"]
    stop = full[5:7]
    head = full[:full.find(stop)]
    trimmed = generate(client, input_ids=None, text="sparrow", sampling_params={**greedy, "stop": stop})
    kept = generate(client, input_ids=None, text="sparrow", sampling_params={**greedy, "stop": stop, "no_stop_trim": True})
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert trimmed["text"] == head and kept["text"] == head + stop
    assert trimmed["output_ids"] == kept["output_ids"]  # only the text is trimmed


def test_stop_token_text_trimmed_unless_no_stop_trim(client):
    greedy = {"max_new_tokens": 12, "temperature": 0}
    full = generate(client, input_ids=None, text="sparrow", sampling_params=greedy)
    token = full["output_ids"][3]
    end = full["output_ids"].index(token) + 1
    decode = CharTokenizer().decode
    params = {**greedy, "stop_token_ids": [token]}
    trimmed = generate(client, input_ids=None, text="sparrow", sampling_params=params)
    kept = generate(client, input_ids=None, text="sparrow", sampling_params={**params, "no_stop_trim": True})
    assert trimmed["output_ids"] == kept["output_ids"] == full["output_ids"][:end]
    assert trimmed["text"] == decode(full["output_ids"][:end - 1]) and kept["text"] == decode(full["output_ids"][:end])


def test_streamed_text_is_trimmed_in_the_last_chunk(client):
    import json

    greedy = {"max_new_tokens": 12, "temperature": 0}
    full = generate(client, input_ids=None, text="sparrow", sampling_params=greedy)["text"]
    stop = full[5:7]
    body = {"text": "sparrow", "stream": True, "sampling_params": {**greedy, "stop": stop}}
    with client.stream("POST", "/generate", json=body) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line and line != "data: [DONE]"]
    assert chunks[-1]["text"] == full[:full.find(stop)]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_min_new_tokens_holds_stop_strings_back_too(client):
    greedy = {"max_new_tokens": 12, "temperature": 0}
    full = generate(client, input_ids=None, text="sparrow", sampling_params=greedy)
    stop = full["text"][1:3]  # completed by the third token
    early = generate(client, input_ids=None, text="sparrow", sampling_params={**greedy, "stop": stop})
    held = generate(client, input_ids=None, text="sparrow",
                    sampling_params={**greedy, "stop": stop, "min_new_tokens": 8})
    assert len(early["output_ids"]) < 8 <= len(held["output_ids"])
    assert held["output_ids"] == full["output_ids"][:len(held["output_ids"])]
