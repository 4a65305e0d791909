"""Reference engine: dense equals HF, sparse equals a masked recomputation under the recorded
selections, batching does not change results, pages are freed, sampling and stop rules."""
from __future__ import annotations

import asyncio

import pytest

from helpers.engine_brake import DecodeBrake
from helpers.engine_util import collect, run_requests
from helpers.tiny_models import (
    PAGE_SIZE, TINY_VOCAB, load_plain, save_tiny_model, teacher_forced_logprobs,
)
from sparrow_server.engine.base import (
    ContextLengthError, DuplicateRequestError, GenerationRequest, InvalidRequestError, SamplingParams, UnknownAdapterError,
)
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.sparsity.schedule import Schedule, budget_pages, dense_schedule, kv_budget_tokens

PROMPT = tuple((i * 7 + 3) % (TINY_VOCAB - 1) for i in range(100))  # 100 tokens: 7 pages, no EOS
SPARSE = Schedule(name="tiny-sparse", budgets_tokens=(64,), dense_layers=(0,))
TOL = 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reference(model_dir):
    return load_plain(model_dir)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("qwen3"), "qwen3")


@pytest.fixture(params=["llama", "qwen3"])
def arch_engine(request, model_dir, qwen3_dir):
    """(engine, HF reference) for each architecture the equality tests cover."""
    directory = model_dir if request.param == "llama" else qwen3_dir
    eng = make_engine(directory)
    yield eng, load_plain(directory)
    asyncio.run(eng.shutdown())


def make_engine(model_dir, **kwargs) -> ReferenceEngine:
    return ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=kwargs.pop("kv_pool_tokens", 2048), **kwargs)


@pytest.fixture()
def engine(model_dir):
    eng = make_engine(model_dir)
    yield eng
    asyncio.run(eng.shutdown())


def req(rid, schedule=None, max_new=24, temperature=0.0, **kw) -> GenerationRequest:
    sampling = SamplingParams(max_new_tokens=max_new, temperature=temperature, ignore_eos=kw.pop("ignore_eos", True),
                              seed=kw.pop("seed", 0), top_k=kw.pop("top_k", -1), top_p=kw.pop("top_p", 1.0),
                              stop_token_ids=kw.pop("stop_token_ids", ()))
    return GenerationRequest(rid=rid, input_ids=kw.pop("input_ids", PROMPT), sampling=sampling,
                             schedule=schedule or dense_schedule(), **kw)


def max_diff(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_dense_schedule_equals_hf_forward(arch_engine):
    engine, reference = arch_engine
    greedy, sampled = run_requests(engine, req("g"), req("s", temperature=0.8, top_k=20, top_p=0.9, seed=3))
    assert max_diff(greedy.logprobs, teacher_forced_logprobs(reference, PROMPT, greedy.tokens)) < TOL
    # Sampled at T=0.8 with top-k/top-p: logprobs are log_softmax(logits / T), before truncation.
    assert max_diff(sampled.logprobs, teacher_forced_logprobs(reference, PROMPT, sampled.tokens, 0.8)) < TOL
    assert greedy.budgets[0] is None and greedy.budgets[1:] == [len(PROMPT) + i for i in range(1, len(greedy.tokens))]


def test_sparse_schedule_equals_masked_recomputation(arch_engine):
    engine, reference = arch_engine
    out, = run_requests(engine, req("s", SPARSE, max_new=40, temperature=0.7, return_selected_pages=True))
    assert len(out.selections) == len(out.tokens) == len(out.budgets) == 40
    masked = teacher_forced_logprobs(reference, PROMPT, out.tokens, 0.7, selections=out.selections)
    assert max_diff(out.logprobs, masked) < TOL
    dense = teacher_forced_logprobs(reference, PROMPT, out.tokens, 0.7)
    assert max_diff(out.logprobs, dense) > 1e-3, "the sparse schedule should change the distribution"
    assert out.selections[0] is None  # the first token comes from the dense prefill
    for i, sel in enumerate(out.selections[1:], start=1):
        length = len(PROMPT) + i
        n_pages = -(-length // PAGE_SIZE)
        assert sel[0] is None  # dense layer
        for heads in sel[1:]:
            for pages in heads:
                assert len(pages) == min(budget_pages(SPARSE, length), n_pages)
                assert pages[0] == 0 and pages[-2:] == (n_pages - 2, n_pages - 1)  # sink + recent
                assert list(pages) == sorted(set(pages))
        # kv_budget_tokens = tokens attended: the selected pages, the current partial one by its real tokens
        attended = (len(sel[1][0]) - 1) * PAGE_SIZE + (length - 1) % PAGE_SIZE + 1
        assert out.budgets[i] == attended == kv_budget_tokens(SPARSE, length)
    assert any(b % PAGE_SIZE for b in out.budgets[1:]), "a partial last page counts its real tokens"


def test_batching_does_not_change_results(model_dir):
    alone = []
    for r in (req("a", SPARSE, max_new=20), req("b", max_new=12, input_ids=PROMPT[:37])):
        eng = make_engine(model_dir)
        alone += run_requests(eng, r)
        asyncio.run(eng.shutdown())
    eng = make_engine(model_dir)
    together = run_requests(eng, req("a", SPARSE, max_new=20), req("b", max_new=12, input_ids=PROMPT[:37]))
    asyncio.run(eng.shutdown())
    for x, y in zip(alone, together):
        assert x.tokens == y.tokens
        assert max_diff(x.logprobs, y.logprobs) < 1e-5


def test_pages_freed_after_finish_and_abort(engine):
    total = engine.cache.free_pages

    async def main():
        await engine.start()
        await collect(engine, req("done", max_new=5))
        brake = DecodeBrake(engine, at=1)  # "long" is held in its first decode step: live whatever the machine's speed
        try:
            stream = engine.submit(req("long", max_new=500))
            first = await stream.__anext__()
            await brake.until_reached()
            assert first.token_ids and engine.live_requests() == ("long",)
            with pytest.raises(DuplicateRequestError):
                engine.validate(req("long"))
            long, = engine.scheduler.live()
            await stream.aclose()  # the consumer goes away: the request is aborted (marked; applied at the next step)
        finally:
            brake.release()
        await until(lambda: not engine.live_requests())
        # ended by the abort, at the step after the braked one, not by running its 500 tokens out
        assert len(long.output) <= 2

    asyncio.run(main())
    assert engine.live_requests() == ()
    assert engine.cache.free_pages == total


def test_abort_by_rid_finishes_with_abort(engine):
    async def main():
        await engine.start()
        brake = DecodeBrake(engine, at=2)  # held in its second decode step, after its second chunk
        chunks = []
        try:
            async for chunk in engine.submit(req("x", max_new=500)):
                chunks.append(chunk)
                if len(chunks) == 2:
                    await brake.until_reached()  # still live: the loop is held before its third token
                    assert await engine.abort("x")
                    brake.release()  # the abort lands at the next step
        finally:
            brake.release()
        return chunks

    chunks = asyncio.run(main())
    # the braked step's token, then the abort: not the 500 tokens a lost abort would let it run
    assert chunks[-1].finish.type == "abort" and len(chunks) <= 4
    assert engine.live_requests() == () and not asyncio.run(engine.abort("x"))


async def until(predicate, timeout_s: float = 60.0) -> None:
    """Wait for ``predicate()`` (the engine's loop thread makes it true); the timeout only bounds a failure."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting for the engine"
        await asyncio.sleep(0.005)


def test_stop_rules(engine):
    greedy, = run_requests(engine, req("g", max_new=10))
    stop_at = greedy.tokens[3]
    first = greedy.tokens.index(stop_at)
    stopped, eos_ignored, length = run_requests(
        engine, req("s", max_new=10, stop_token_ids=(stop_at,)), req("e", max_new=10), req("l", max_new=4))
    assert stopped.tokens == greedy.tokens[: first + 1]
    assert stopped.finish.type == "stop" and stopped.finish.matched == stop_at
    assert eos_ignored.finish.type == "length" and len(eos_ignored.tokens) == 10
    assert length.finish.to_dict() == {"type": "length", "length": 4}


def test_eos_stops_unless_ignored(model_dir):
    eng = make_engine(model_dir)
    eos = eng.eos_token_ids[0]
    greedy, = run_requests(eng, req("g", max_new=6))
    eng.eos_token_ids = (greedy.tokens[2],)  # pretend the third greedy token is EOS
    stopped, ignored = run_requests(eng, req("s", max_new=6, ignore_eos=False), req("i", max_new=6))
    asyncio.run(eng.shutdown())
    assert stopped.finish.type == "stop" and stopped.tokens == greedy.tokens[: greedy.tokens.index(greedy.tokens[2]) + 1]
    assert ignored.tokens == greedy.tokens and eos == 127


def test_seeded_sampling_is_reproducible(engine):
    a, b, c = run_requests(engine, req("a", temperature=1.0, seed=7), req("b", temperature=1.0, seed=7),
                           req("c", temperature=1.0, seed=8))
    assert a.tokens == b.tokens and a.logprobs == b.logprobs
    assert a.tokens != c.tokens
    greedy, top1 = run_requests(engine, req("g"), req("k", temperature=1.5, top_k=1, seed=1))
    assert top1.tokens == greedy.tokens  # top_k = 1 is greedy whatever the temperature


def test_top_logprobs(engine, reference):
    out, = run_requests(engine, req("t", max_new=5, top_logprobs=5))
    assert len(out.top) == 5
    for lp, tok, top in zip(out.logprobs, out.tokens, out.top):
        assert len(top) == 5 and top[0][1] == tok and abs(top[0][0] - lp) < 1e-6  # greedy: the best is sampled
        assert [x for x, _ in top] == sorted((x for x, _ in top), reverse=True)


def test_admission_errors(engine):
    with pytest.raises(InvalidRequestError) as e:
        engine.validate(req("v", input_ids=(1, TINY_VOCAB)))
    assert e.value.field == "input_ids[1]" and e.value.value == TINY_VOCAB
    with pytest.raises(ContextLengthError) as c:
        engine.validate(req("c", max_new=1000))
    assert (c.value.prompt_tokens, c.value.max_new_tokens, c.value.context_length) == (100, 1000, 1024)
    with pytest.raises(ContextLengthError):  # fits the context but not this small pool
        make_engine_small = ReferenceEngine(engine.runner.model, None, "tiny", kv_pool_tokens=64)
        make_engine_small.validate(req("p", max_new=10))
    with pytest.raises(InvalidRequestError) as st:  # stop strings need a tokenizer
        engine.validate(GenerationRequest(rid="st", input_ids=PROMPT, sampling=SamplingParams(stop=("x",))))
    assert st.value.field == "sampling_params.stop"
    with pytest.raises(UnknownAdapterError):
        engine.validate(req("a", adapter="nope"))
    with pytest.raises(InvalidRequestError):
        req("e", input_ids=())
    with pytest.raises(InvalidRequestError) as s:
        engine.validate(req("p", Schedule(name="big-pages", page_size=32)))
    assert s.value.field == "schedule.page_size"


def test_pool_pressure_queues_requests(model_dir):
    """A pool that fits one request at a time still serves several, one after another."""
    eng = make_engine(model_dir, kv_pool_tokens=160)
    outs = run_requests(eng, *(req(f"r{i}", max_new=20) for i in range(3)))
    asyncio.run(eng.shutdown())
    assert all(len(o.tokens) == 20 for o in outs)
    assert outs[0].tokens == outs[1].tokens == outs[2].tokens


def test_a_failing_step_ends_those_requests_with_an_error_and_the_engine_keeps_serving(engine):
    real_decode = engine.runner.decode
    calls = {"n": 0}

    def flaky_decode(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected fault")
        return real_decode(*args, **kwargs)

    engine.runner.decode = flaky_decode
    failed, = run_requests(engine, req("f", max_new=10))
    assert failed.finish.type == "error" and "injected fault" in failed.finish.message
    ok, = run_requests(engine, req("ok", max_new=5))
    assert ok.finish.type == "length" and len(ok.tokens) == 5
    assert engine.live_requests() == () and engine.cache.free_pages == engine.cache.usable_pages
