"""CPU tests of ``SGLangEngine``'s translation to and from SGLang, with a fake ``sglang.Engine``."""
from __future__ import annotations

import asyncio
import json

import pytest

from sparrow_server.engine.base import ContextLengthError, GenerationRequest, SamplingParams, UnknownAdapterError
from sparrow_server.sglang_plugin.engine import SGLangEngine, StreamState, sampling_dict, sglang_server_kwargs
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import parse_schedule_text


class _FakeTM:
    def __init__(self):
        self.aborted = []

    def abort_request(self, rid="", abort_all=False):
        self.aborted.append(rid)


class _FakeSGL:
    """Streams cumulative outputs like SGLang's default (non-incremental) streaming."""

    def __init__(self, tokens, incremental=False):
        self.tokens = tokens
        self.incremental = incremental
        self.tokenizer_manager = _FakeTM()
        self.calls = []

    async def async_generate(self, **kw):
        self.calls.append(kw)

        async def gen():
            n = len(self.tokens)
            for i in range(0, n, 2):
                upto = min(i + 2, n)
                ids = self.tokens[i:upto] if self.incremental else self.tokens[:upto]
                lps = [[-0.1 * (j + 1), t, None] for j, t in enumerate(self.tokens[:upto])]
                meta = {"completion_tokens": upto, "prompt_tokens": len(kw["input_ids"]),
                        "output_token_logprobs": lps[i:upto] if self.incremental else lps,
                        "finish_reason": {"type": "length", "length": n} if upto == n else None}
                yield {"output_ids": ids, "meta_info": meta}
        return gen()

    def shutdown(self):
        pass


def _collect(engine, req):
    async def run():
        return [c async for c in engine.submit(req)]
    return asyncio.run(run())


@pytest.mark.parametrize("incremental", [False, True])
def test_stream_chunks_are_deltas(incremental):
    sgl = _FakeSGL([5, 6, 7, 8, 9], incremental)
    eng = SGLangEngine(sgl, "m", context_length=100, vocab_size=10)
    sched = ScheduleRegistry().get("qwen3-1.7b-0.86")
    req = GenerationRequest(rid="r1", input_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=5, seed=3),
                            schedule=sched)
    chunks = _collect(eng, req)
    assert [t for c in chunks for t in c.token_ids] == [5, 6, 7, 8, 9]
    assert [round(x, 3) for c in chunks for x in c.logprobs] == [-0.1, -0.2, -0.3, -0.4, -0.5]
    assert chunks[-1].done and chunks[-1].finish.type == "length" and chunks[-1].completion_tokens == 5
    sp = sgl.calls[0]["sampling_params"]
    assert parse_schedule_text(sp["custom_params"]["sparrow_schedule_json"]) == sched
    assert sp["sampling_seed"] == 3 and sgl.calls[0]["stream"] and sgl.calls[0]["rid"] == "r1"
    assert eng.live_requests() == () and sgl.tokenizer_manager.aborted == []


def test_closing_early_aborts():
    sgl = _FakeSGL([5, 6, 7, 8, 9])
    eng = SGLangEngine(sgl, "m", context_length=1000, vocab_size=10)

    async def run():
        it = eng.submit(GenerationRequest(rid="r2", input_ids=(1,)))
        first = await it.__anext__()
        await it.aclose()
        return first
    assert asyncio.run(run()).token_ids == (5, 6)
    assert sgl.tokenizer_manager.aborted == ["r2"]


def test_validate_context_and_adapter():
    eng = SGLangEngine(_FakeSGL([]), "m", context_length=10, vocab_size=10, adapters=("a",))
    with pytest.raises(ContextLengthError):
        eng.validate(GenerationRequest(rid="x", input_ids=(1,) * 5, sampling=SamplingParams(max_new_tokens=6)))
    with pytest.raises(UnknownAdapterError):
        eng.validate(GenerationRequest(rid="x", input_ids=(1,), adapter="b", sampling=SamplingParams(max_new_tokens=2)))
    eng.validate(GenerationRequest(rid="x", input_ids=(1,), adapter="a", sampling=SamplingParams(max_new_tokens=2)))


def test_server_kwargs():
    kw = sglang_server_kwargs("/m", adapters=(("a", "/p"),), max_batch_size=8,
                              environ={"SPARROW_SGLANG_ARGS": json.dumps({"mem_fraction_static": 0.8})})
    assert kw["attention_backend"] == "sparrow" and kw["page_size"] == 16 and kw["lora_paths"] == ["a=/p"]
    assert kw["max_running_requests"] == 8 and kw["mem_fraction_static"] == 0.8
    with pytest.raises(ValueError, match="page_size"):
        sglang_server_kwargs("/m", environ={"SPARROW_SGLANG_ARGS": '{"page_size": 1}'})


def test_dense_request_sends_no_schedule_when_none():
    assert "custom_params" not in sampling_dict(GenerationRequest(rid="x", input_ids=(1,)))
    assert StreamState(GenerationRequest(rid="x", input_ids=(1,))).sent == 0
