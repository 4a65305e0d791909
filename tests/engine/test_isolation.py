"""One request can never hurt another on the reference engine: per trigger class, two victims
decoded in the same batches as a faulting request get exactly the tokens they get alone, the
faulting request ends alone with a clear error, and nothing stays live or allocated.

Trigger classes: sampling (the request's own part after the forward), budget evaluation (its
schedule, before the forward), a failing adapter (inside the shared forward: the step is retried
with each request alone), and the reported original trigger, a tiny positive temperature (now
greedy, as in SGLang)."""
from __future__ import annotations

import asyncio

import pytest

from helpers.engine_util import run_requests
from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.engine.base import GenerationRequest, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.reference import engine as engine_module
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

PROMPT = tuple((i * 5 + 1) % (TINY_VOCAB - 1) for i in range(40))
SPARSE = Schedule(name="iso-sparse", budgets_tokens=(64,), dense_layers=(0,))
FAULTY_SCHEDULE = Schedule(name="iso-faulty", budgets_tokens=(64,), dense_layers=(0,))
NEW_TOKENS = 24
FAULT_AFTER = 3  # the faulting request fails at its 3rd decode step: it is mid-batch with the victims

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def request(rid: str, schedule=None, temperature: float = 0.8, seed: int = 1, prompt=PROMPT, adapter=None):
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=temperature, seed=seed, ignore_eos=True)
    return GenerationRequest(rid=rid, input_ids=tuple(prompt), sampling=sampling, schedule=schedule or dense_schedule(),
                             adapter=adapter)


def victims():
    return request("victim-1", seed=11), request("victim-2", SPARSE, seed=22, prompt=PROMPT[:29])


@pytest.fixture()
def engine(model_dir):
    eng = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=2048)
    yield eng
    asyncio.run(eng.shutdown())


@pytest.fixture(scope="module")
def alone(model_dir):
    """Each victim run by itself (and the faulting prompt greedily), on a fresh engine."""
    eng = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=2048)
    out = {r.rid: run_requests(eng, r)[0] for r in (*victims(), request("greedy", temperature=0.0, prompt=PROMPT[5:]))}
    asyncio.run(eng.shutdown())
    return out


def check_victims(engine, results, alone) -> None:
    for got in results:
        expected = alone[got.rid]
        assert got.finish.type == "length" and got.tokens == expected.tokens and len(got.tokens) == NEW_TOKENS
        assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs)) < 1e-5
        assert got.budgets == expected.budgets
    assert engine.live_requests() == () and engine.cache.free_pages == engine.cache.usable_pages


def run(engine, faulty: GenerationRequest):
    v1, v2 = victims()
    results = run_requests(engine, v1, faulty, v2)
    for r, res in zip((v1, faulty, v2), results):
        res.rid = r.rid  # Collected has no rid; the victims are compared by it
    return results


def fails_at_step(predicate):
    """Count calls per key; True from the FAULT_AFTER-th call of a matching key on."""
    calls: dict = {}

    def should_fail(key) -> bool:
        if not predicate(key):
            return False
        calls[key] = calls.get(key, 0) + 1
        return calls[key] >= FAULT_AFTER

    return should_fail


def test_a_sampling_failure_ends_that_request_alone(engine, alone, monkeypatch):
    real = engine_module.sample_token
    should_fail = fails_at_step(lambda seed: seed == 666)

    def sample_token(logits, params, *args):
        if should_fail(params.seed):
            raise FloatingPointError("injected: probability tensor contains inf or nan")
        return real(logits, params, *args)

    monkeypatch.setattr(engine_module, "sample_token", sample_token)
    v1, faulty, v2 = run(engine, request("faulty", seed=666, prompt=PROMPT[5:]))
    assert faulty.finish.type == "error" and "FloatingPointError: injected" in faulty.finish.message
    assert 0 < len(faulty.tokens) < NEW_TOKENS
    check_victims(engine, (v1, v2), alone)


def test_a_budget_evaluation_failure_ends_that_request_alone(engine, alone, monkeypatch):
    real = engine_module.attended_pages
    should_fail = fails_at_step(lambda name: name == FAULTY_SCHEDULE.name)

    def attended_pages(schedule, *args, **kwargs):
        if should_fail(schedule.name):
            raise OverflowError("injected: budget larger than any integer the engine holds")
        return real(schedule, *args, **kwargs)

    monkeypatch.setattr(engine_module, "attended_pages", attended_pages)
    v1, faulty, v2 = run(engine, request("faulty", FAULTY_SCHEDULE, prompt=PROMPT[5:]))
    assert faulty.finish.type == "error" and "OverflowError: injected" in faulty.finish.message
    check_victims(engine, (v1, v2), alone)


def test_a_failing_adapter_in_the_shared_forward_ends_that_request_alone(engine, alone, monkeypatch):
    """The forward is shared: it fails for the whole batch; the step is retried with each request
    alone, and only the request whose adapter fails by itself ends."""
    real_decode, real_prefill = engine.runner.decode, engine.runner.prefill
    monkeypatch.setattr(engine, "resolve_adapter", lambda name: name)  # "broken" passes admission

    def decode(tokens, adapters, ctx):
        if "broken" in adapters:
            raise RuntimeError("injected: adapter 'broken' has mismatched LoRA shapes")
        return real_decode(tokens, adapters, ctx)

    monkeypatch.setattr(engine.runner, "decode", decode)
    monkeypatch.setattr(engine.runner, "prefill", lambda ids, adapter, ctx, **kw: real_prefill(ids, None, ctx, **kw))
    steps_before = engine.steps
    v1, faulty, v2 = run(engine, request("faulty", adapter="broken", prompt=PROMPT[5:]))
    assert faulty.finish.type == "error" and "adapter 'broken'" in faulty.finish.message
    assert len(faulty.tokens) == 1  # the prefill's token; its first decode step failed
    check_victims(engine, (v1, v2), alone)
    assert engine.steps - steps_before >= NEW_TOKENS - 1


def test_a_tiny_positive_temperature_is_greedy_and_hurts_nobody(engine, alone):
    """The reported trigger: T = 1e-30 made logits / T non-finite and ended the whole batch."""
    v1, tiny, v2 = run(engine, request("tiny", temperature=1e-30, prompt=PROMPT[5:]))
    assert tiny.finish.type == "length" and tiny.tokens == alone["greedy"].tokens
    assert tiny.logprobs == pytest.approx(alone["greedy"].logprobs, abs=1e-5)  # reported at T = 1, as greedy
    check_victims(engine, (v1, v2), alone)
