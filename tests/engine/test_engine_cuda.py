"""The reference engine runs unchanged on CUDA: same checks as on CPU (dense = HF forward, sparse =
masked recomputation under the recorded selections), the engine on the GPU, the reference on the CPU."""
from __future__ import annotations

import asyncio

import pytest

from helpers.engine_util import run_requests
from helpers.tiny_models import TINY_VOCAB, load_plain, save_tiny_model, teacher_forced_logprobs
from sparrow_server.engine.base import GenerationRequest, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

pytestmark = pytest.mark.gpu

PROMPT = tuple((i * 7 + 3) % (TINY_VOCAB - 1) for i in range(100))
SPARSE = Schedule(name="tiny-sparse", budgets_tokens=(64,), dense_layers=(0,))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_on_cuda_matches_cpu_references(arch, tmp_path):
    model_dir = save_tiny_model(tmp_path, arch)
    engine = ReferenceEngine(load_plain(model_dir, "sdpa").to("cuda"), None, "tiny", kv_pool_tokens=2048)
    assert engine.info().device.startswith("cuda")

    def req(rid, schedule, temperature):
        return GenerationRequest(rid=rid, input_ids=PROMPT, schedule=schedule, return_selected_pages=True,
                                 sampling=SamplingParams(max_new_tokens=40, temperature=temperature, seed=1, ignore_eos=True))

    dense, sparse = run_requests(engine, req("d", dense_schedule(), 1.0), req("s", SPARSE, 0.7))
    asyncio.run(engine.shutdown())
    assert engine.cache.free_pages == engine.cache.usable_pages
    reference = load_plain(model_dir)
    expected = teacher_forced_logprobs(reference, PROMPT, dense.tokens, 1.0)
    assert max(abs(a - b) for a, b in zip(dense.logprobs, expected)) < 1e-4
    masked = teacher_forced_logprobs(reference, PROMPT, sparse.tokens, 0.7, selections=sparse.selections)
    assert max(abs(a - b) for a, b in zip(sparse.logprobs, masked)) < 1e-4
