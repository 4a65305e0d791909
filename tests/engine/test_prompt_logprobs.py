"""Prompt logprobs (SGLang's ``logprob_start_len``) and scoring-only requests (``max_new_tokens = 0``)
on the reference engine, checked against one HF forward of the prompt."""
from __future__ import annotations

import asyncio

import pytest
import torch

from helpers.engine_util import run_requests
from helpers.tiny_models import TINY_VOCAB, load_plain, teacher_forced_logprobs
from sparrow_server.engine.base import GenerationRequest, InvalidRequestError, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.reference import sampler
from sparrow_server.engine.reference.sampler import prompt_logprobs
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

PROMPT = tuple((i * 5 + 2) % (TINY_VOCAB - 1) for i in range(70))
SPARSE = Schedule(name="tiny-sparse", budgets_tokens=(48,), dense_layers=(0,), sink_pages=1, recent_pages=1)
TOL = 1e-4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference(model_dir):
    return load_plain(model_dir)


@pytest.fixture()
def engine(model_dir):
    eng = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=2048)
    yield eng
    asyncio.run(eng.shutdown())


def req(rid, start, max_new=4, temperature=0.0, schedule=None, top=0) -> GenerationRequest:
    sampling = SamplingParams(max_new_tokens=max_new, temperature=temperature, ignore_eos=True, seed=1)
    return GenerationRequest(rid=rid, input_ids=PROMPT, sampling=sampling, schedule=schedule or dense_schedule(),
                             top_logprobs=top, logprob_start_len=start)


def hf_prompt_logprobs(reference, start: int) -> list[float]:
    """log p(prompt[j] | prompt[:j]) for j in start+1 .. L-1, at T = 1."""
    return teacher_forced_logprobs(reference, PROMPT[:start + 1], PROMPT[start + 1:])


def close(got, want) -> bool:
    return len(got) == len(want) and max((abs(a - b) for a, b in zip(got, want)), default=0.0) < TOL


@pytest.mark.parametrize("start", [0, 1, 37, len(PROMPT) - 1])
def test_prompt_logprobs_equal_hf_forward(engine, reference, start):
    out, = run_requests(engine, req("p", start))
    assert len(out.prompt_logprobs) == len(PROMPT) - start and out.prompt_logprobs[0] is None
    assert close(out.prompt_logprobs[1:], hf_prompt_logprobs(reference, start) if start < len(PROMPT) - 1 else [])
    assert len(out.tokens) == 4  # generation goes on as without prompt logprobs
    plain, = run_requests(engine, req("q", None))
    assert plain.prompt_logprobs is None and plain.tokens == out.tokens and close(plain.logprobs, out.logprobs)


def test_prompt_logprobs_are_at_temperature_one_and_ignore_the_sparse_schedule(engine, reference):
    """SGLang scores prompt tokens on raw logits; the prefill is dense whatever the schedule."""
    hot, sparse = run_requests(engine, req("t", 0, temperature=0.5), req("s", 0, schedule=SPARSE))
    want = hf_prompt_logprobs(reference, 0)
    assert close(hot.prompt_logprobs[1:], want) and close(sparse.prompt_logprobs[1:], want)


def test_start_at_the_prompt_end_gives_no_prompt_logprobs(engine):
    out, = run_requests(engine, req("e", len(PROMPT)))
    assert out.prompt_logprobs == [] and len(out.tokens) == 4


def test_prompt_top_logprobs(engine, reference):
    out, = run_requests(engine, req("k", 10, top=3))
    assert out.prompt_top[0] is None and len(out.prompt_top) == len(PROMPT) - 10
    for lp, tok, top in zip(out.prompt_logprobs[1:], PROMPT[11:], out.prompt_top[1:]):
        assert len(top) == 3 and [x for x, _ in top] == sorted((x for x, _ in top), reverse=True)
        assert top[0][0] >= lp - 1e-6 and (tok not in [t for _, t in top] or any(abs(x - lp) < 1e-6 for x, _ in top))


def test_scoring_only_request_returns_no_tokens(engine, reference):
    out, = run_requests(engine, req("z", 0, max_new=0))
    assert out.tokens == [] and out.finish.type == "length" and out.finish.length == 0
    assert close(out.prompt_logprobs[1:], hf_prompt_logprobs(reference, 0))
    assert engine.cache.free_pages == engine.cache.num_pages - 1  # the pages went back (page 0 is the null page)


@pytest.mark.parametrize("start", [-1, len(PROMPT) + 1, True, 2.0])
def test_bad_start_is_refused_naming_the_field(start):
    with pytest.raises(InvalidRequestError) as e:
        GenerationRequest(rid="b", input_ids=PROMPT, logprob_start_len=start)
    assert e.value.field == "logprob_start_len" and e.value.value == start


def test_long_prompts_are_scored_in_row_chunks(monkeypatch):
    """The chunked log_softmax gives what one log_softmax over all rows gives."""
    gen = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(9, 50, generator=gen), [int(t) for t in torch.randint(0, 50, (10,), generator=gen)]
    whole = torch.log_softmax(logits, -1)
    monkeypatch.setattr(sampler, "PROMPT_LOGPROB_ROWS", 4)
    got = prompt_logprobs(logits, tokens, top_logprobs=2)
    assert got.logprobs[0] is None and got.top_logprobs[0] is None
    assert close(got.logprobs[1:], [float(whole[j - 1, tokens[j]]) for j in range(1, 10)])
    best = torch.topk(whole, 2, -1)
    assert all(close([v for v, _ in got.top_logprobs[j]], best.values[j - 1].tolist()) for j in range(1, 10))
    assert all([i for _, i in got.top_logprobs[j]] == best.indices[j - 1].tolist() for j in range(1, 10))
