"""Reference-engine parts: the paged cache's landmarks, sampling truncation, LoRA per request."""
from __future__ import annotations

import asyncio

import pytest
import torch

from helpers.engine_util import run_requests
from helpers.tiny_models import load_plain, save_tiny_model, teacher_forced_logprobs, tiny_model
from sparrow_server.engine.base import GenerationRequest, InvalidRequestError, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.reference.kv_cache import NULL_PAGE, PagedKVCache, PageTable
from sparrow_server.engine.reference.sampler import truncated_probs
from sparrow_server.sparsity.selection import page_landmarks


def test_cache_landmarks_match_core_definition():
    cache = PagedKVCache(num_layers=2, num_pages=8, page_size=4, num_kv_heads=2, head_dim=3, dtype=torch.float32)
    table = PageTable()
    cache.allocate(table, 10)
    assert len(table.pages) == 3 and NULL_PAGE not in table.pages and cache.free_pages == 4
    keys = torch.randn(10, 2, 3)
    pages, offsets = cache.slots(table, torch.arange(10))
    cache.write(1, pages, offsets, keys, keys)
    cache.update_landmarks(1, torch.tensor(table.pages[:2]))
    k, _, lm = cache.gather(1, torch.tensor([table.pages]))
    assert torch.equal(k[0, :10], keys)
    assert torch.equal(lm[0, :2], page_landmarks(keys, 4))
    cache.free(table)
    assert cache.free_pages == 7 and table.pages == []
    again = PageTable()
    cache.allocate(again, 4)  # a reused page comes back zeroed, landmark included
    assert torch.count_nonzero(cache.k[:, again.pages]) == 0 and torch.count_nonzero(cache.landmarks[:, again.pages]) == 0


def _brute_force(logits, params):
    probs = torch.softmax(logits.double() / params.temperature, -1)
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep = set(order[: params.top_k] if params.top_k > 0 else order)
    mass, nucleus = 0.0, set()
    for i in order:
        if mass > params.top_p * float(probs.sum()) - 1e-12:
            break
        nucleus.add(i)
        mass += float(probs[i])
    kept = keep & nucleus
    out = torch.tensor([float(probs[i]) if i in kept else 0.0 for i in range(len(probs))], dtype=torch.float64)
    return out / out.sum()


@pytest.mark.parametrize("top_k,top_p", [(-1, 1.0), (3, 1.0), (-1, 0.5), (5, 0.8), (1, 0.3)])
def test_truncation_matches_brute_force(top_k, top_p):
    logits = torch.randn(32, generator=torch.Generator().manual_seed(top_k + int(top_p * 10)))
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    assert torch.allclose(truncated_probs(logits, params).double(), _brute_force(logits, params), atol=1e-6)


@pytest.mark.parametrize("field,kwargs", [
    ("sampling_params.temperature", {"temperature": -0.5}),
    ("sampling_params.top_p", {"top_p": 0.0}),
    ("sampling_params.top_p", {"top_p": 1.5}),
    ("sampling_params.max_new_tokens", {"max_new_tokens": -1}),
    ("sampling_params.top_k", {"top_k": 0}),
])
def test_sampling_params_name_field_and_value(field, kwargs):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)
    assert e.value.field == field and e.value.value == next(iter(kwargs.values()))


def test_lora_adapter_per_request(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    torch.set_num_threads(1)
    model_dir = save_tiny_model(tmp_path / "base")
    peft_model = get_peft_model(tiny_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                         init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=1024)
    engine.load_adapter("ad1", str(tmp_path / "adapter"))
    prompt = tuple(range(1, 40))

    def request(rid, adapter):
        return GenerationRequest(rid=rid, input_ids=prompt, sampling=SamplingParams(max_new_tokens=12, temperature=0.0,
                                 ignore_eos=True), adapter=adapter)

    with_adapter, base = run_requests(engine, request("a", "ad1"), request("b", None))
    asyncio.run(engine.shutdown())
    assert with_adapter.adapter == "ad1" and base.adapter is None
    plain = load_plain(model_dir)
    assert max(abs(x - y) for x, y in zip(base.logprobs, teacher_forced_logprobs(plain, prompt, base.tokens))) < 1e-4
    adapted = PeftModel.from_pretrained(load_plain(model_dir), str(tmp_path / "adapter")).eval()
    expected = teacher_forced_logprobs(adapted, prompt, with_adapter.tokens)
    assert max(abs(x - y) for x, y in zip(with_adapter.logprobs, expected)) < 1e-4
    assert with_adapter.logprobs != base.logprobs


def test_sliding_window_models_are_refused():
    model = tiny_model("qwen3", use_sliding_window=True, sliding_window=32, max_window_layers=1)
    with pytest.raises(ValueError, match="sliding"):
        ReferenceEngine(model, None, "tiny", kv_pool_tokens=256)
