"""SGLang's ``/generate`` contract beyond one prompt: batched prompts (lists of ``input_ids`` or
``text``, per-prompt fields as lists), ``n`` within a batch, streaming tags, prompt logprobs
(``logprob_start_len``), scoring-only requests (``max_new_tokens: 0``) and token text in logprobs.
Every batched result must equal the same prompt sent alone (greedy)."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from helpers.server_util import CharTokenizer
from helpers.tiny_models import TINY_VOCAB, load_plain, teacher_forced_logprobs
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.api_models import SamplingParamsIn
from sparrow_server.server.app import create_app
from sparrow_server.server.limits import Limits
from sparrow_server.sparsity.registry import ScheduleRegistry

PROMPTS = [[(i * k + 3) % (TINY_VOCAB - 1) + 1 for i in range(30 + 5 * k)] for k in range(1, 4)]
GREEDY = {"max_new_tokens": 4, "temperature": 0}
TOL = 1e-4


@pytest.fixture(scope="module")
def client(model_dir, tmp_path_factory, one_torch_thread):
    tokenizer = CharTokenizer()
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), tokenizer, "tiny", kv_pool_tokens=4096)
    schedules = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("state") / "schedules")
    app = create_app(engine, schedules, tokenizer=tokenizer, limits=Limits(max_generate_batch=4))
    with TestClient(app) as c:
        yield c


def generate(client, status=200, **body):
    body.setdefault("sampling_params", GREEDY)
    r = client.post("/generate", json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_a_batch_equals_each_prompt_alone(client):
    out = generate(client, input_ids=PROMPTS, return_logprob=True, rid=["a", "b", "c"])
    assert isinstance(out, list) and [o["meta_info"]["id"] for o in out] == ["a", "b", "c"]
    for prompt, o in zip(PROMPTS, out):
        alone = generate(client, input_ids=prompt, return_logprob=True)
        assert o["output_ids"] == alone["output_ids"] and o["meta_info"]["prompt_tokens"] == len(prompt)
        got = [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]]
        want = [lp for lp, _, _ in alone["meta_info"]["output_token_logprobs"]]
        assert max(abs(x - y) for x, y in zip(got, want)) < TOL


def test_per_prompt_sampling_params_and_n_are_item_major(client):
    params = [{"max_new_tokens": 2, "temperature": 0, "n": 2}, {"max_new_tokens": 5, "temperature": 0, "n": 2}]
    out = generate(client, input_ids=PROMPTS[:2], sampling_params=params)
    assert [o["index"] for o in out] == [0, 1, 2, 3]
    assert [len(o["output_ids"]) for o in out] == [2, 2, 5, 5]
    assert out[0]["output_ids"] == out[1]["output_ids"]  # greedy: both samples of a prompt agree


def test_text_batch(client):
    out = generate(client, text=["hello", "sparse world"])
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [len("hello") + 1, len("sparse world") + 1]
    assert all(isinstance(o["text"], str) for o in out)


def test_streamed_batch_tags_every_chunk_with_its_prompt(client):
    body = {"input_ids": PROMPTS, "stream": True, "sampling_params": [{"max_new_tokens": k, "temperature": 0}
                                                                        for k in (1, 2, 3)]}
    with client.stream("POST", "/generate", json=body) as s:
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    by_index = {i: [len(c["output_ids"]) for c in chunks if c["index"] == i] for i in range(3)}
    assert by_index == {0: [1], 1: [1, 2], 2: [1, 2, 3]}  # cumulative per prompt


def test_prompt_logprobs_match_the_model_and_sglang_shape(client, model_dir):
    reference = load_plain(model_dir)
    prompt = PROMPTS[0]
    out = generate(client, input_ids=prompt, return_logprob=True, logprob_start_len=0, top_logprobs_num=2)
    rows = out["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in rows] == prompt and rows[0][0] is None
    want = teacher_forced_logprobs(reference, prompt[:1], prompt[1:])
    assert max(abs(lp - w) for (lp, _, _), w in zip(rows[1:], want)) < TOL
    tops = out["meta_info"]["input_top_logprobs"]
    assert tops[0] is None and all(len(t) == 2 for t in tops[1:]) and len(tops) == len(prompt)
    later = generate(client, input_ids=prompt, return_logprob=True, logprob_start_len=10)["meta_info"]
    assert [t for _, t, _ in later["input_token_logprobs"]] == prompt[10:]
    default = generate(client, input_ids=prompt, return_logprob=True)["meta_info"]
    assert default["input_token_logprobs"] == []  # SGLang's default (-1): output logprobs only


def test_scoring_only_request_slime_style(client, model_dir):
    """What slime's on-policy distillation sends to score a finished sequence."""
    reference = load_plain(model_dir)
    tokens = PROMPTS[1]
    out = generate(client, input_ids=tokens, return_logprob=True, logprob_start_len=0,
                   sampling_params={"temperature": 0.7, "max_new_tokens": 0, "skip_special_tokens": False})
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    scored = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]]
    want = teacher_forced_logprobs(reference, tokens[:1], tokens[1:])  # T = 1, as SGLang scores prompts
    assert max(abs(a - b) for a, b in zip(scored, want)) < TOL


def test_text_in_logprobs(client):
    out = generate(client, input_ids=PROMPTS[0], return_logprob=True, return_text_in_logprobs=True,
                   logprob_start_len=0, top_logprobs_num=1)
    meta = out["meta_info"]
    tokenizer = CharTokenizer()
    assert all(text == tokenizer.decode([tok]) for _, tok, text in meta["output_token_logprobs"] + meta["input_token_logprobs"])
    assert all(row[0][2] == tokenizer.decode([row[0][1]]) for row in meta["output_top_logprobs"])


@pytest.mark.parametrize("body,field", [
    ({"input_ids": PROMPTS, "rid": ["a", "b"]}, "rid"),
    ({"input_ids": PROMPTS[0], "rid": ["a"]}, "rid"),
    ({"input_ids": PROMPTS, "sampling_params": [GREEDY]}, "sampling_params"),
    ({"input_ids": [PROMPTS[0], [1, TINY_VOCAB + 5]]}, "input_ids[1][1]"),
    ({"input_ids": PROMPTS[:2], "sampling_params": [GREEDY, {**GREEDY, "temperature": -1}]},
     "sampling_params[1].temperature"),
    ({"input_ids": PROMPTS[:2], "return_logprob": True, "logprob_start_len": [0, 999]}, "logprob_start_len[1]"),
    ({"input_ids": PROMPTS[0], "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [PROMPTS[0]] * 5}, "input_ids"),
    ({"input_ids": PROMPTS[0], "text": ["", ""]}, "input_ids"),  # both: was a 500 (IndexError), found by fuzzing
    ({"input_ids": PROMPTS[:2], "text": "hi"}, "input_ids"),
])
def test_bad_batches_are_422_naming_the_field(client, body, field):
    error = generate(client, 422, **body)["error"]
    assert error["field"] == field, error


def prompt_tokens_served(client) -> float:
    lines = client.get("/metrics").text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("sparrow_prompt_tokens_total{"))


def test_a_bad_prompt_runs_nothing(client):
    """Validation covers the whole batch before any prompt is admitted."""
    before = prompt_tokens_served(client)
    generate(client, 422, input_ids=[PROMPTS[0], [TINY_VOCAB + 1]])
    assert prompt_tokens_served(client) == before
    generate(client, input_ids=[PROMPTS[0]])  # the counter does move when a prompt runs
    assert prompt_tokens_served(client) == before + len(PROMPTS[0])


@pytest.mark.parametrize("body,field", [
    ({"input_ids": PROMPTS[0], "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
    ({"input_ids": PROMPTS[0], "sampling_params": {"bogus": 1}}, "sampling_params.bogus"),
    ({"input_ids": [1, "x"]}, "input_ids[1]"),
    ({"input_ids": PROMPTS[:2], "sampling_params": [GREEDY, {"top_k": "all"}]}, "sampling_params[1].top_k"),
])
def test_type_errors_name_the_json_path(client, body, field):
    """Union fields (one value or one per prompt) must not leak pydantic's member tags into the path."""
    error = generate(client, 422, **body)["error"]
    assert error["field"] == field, error


def test_skip_special_tokens_is_honoured_in_text(client):
    """``skip_special_tokens: false`` (what slime sends) keeps special tokens in ``text``."""
    from sparrow_server.server.service import TextDecoder

    assert TextDecoder(CharTokenizer()).delta([0, 5]) == "e"
    assert TextDecoder(CharTokenizer(), skip_special_tokens=False).delta([0, 5]) == "<s>e"
    service = client.app.state.service
    kept = service.prepare("generate", (1, 2), SamplingParamsIn(skip_special_tokens=False), None, None, 0, 1, None)
    assert kept.skip_special_tokens is False
    assert service.prepare("generate", (1, 2), SamplingParamsIn(), None, None, 0, 1, None).skip_special_tokens is True


def test_client_scores_a_rollout_with_the_dense_policy(client):
    """``SparrowClient.score`` is one prefill-only /generate; on a dense T = 1 rollout it gives back the
    behaviour logprobs, and on a sparse rollout the dense logprobs the TIS weights need."""
    from sparrow_server.client import SparrowClient, sampled_acceptance

    c = SparrowClient(http=client)
    prompt = PROMPTS[2]
    dense = c.rollout(input_ids=prompt, sampling_params={"max_new_tokens": 12, "temperature": 1.0, "seed": 4})
    scored = c.score(prompt, dense.token_ids)
    assert len(scored) == 12 and max(abs(a - b) for a, b in zip(scored, dense.logprobs)) < TOL
    client.put("/schedules/tight", json={"budgets_tokens": [48], "dense_layers": [0], "sink_pages": 1, "recent_pages": 1})
    sparse = c.rollout(input_ids=prompt, schedule="tight", sampling_params={"max_new_tokens": 12, "temperature": 1.0, "seed": 4})
    rescored = c.score(prompt, sparse.token_ids)
    assert len(rescored) == 12 and rescored != sparse.logprobs  # the sparse decode really differs from dense
    accepted = sampled_acceptance(rescored, sparse.logprobs)
    assert all(0.0 < a <= 1.0 for a in accepted) and min(accepted) < 1.0
    with pytest.raises(ValueError, match="prompt_ids"):
        c.score([], [1])
