"""Weight updates and pause modes on the reference engine (in process, tiny random models).

Two checkpoints of one architecture (seeds 0 and 1) stand for two policy versions; a model with
another MLP width and a Qwen3 model stand for "a different architecture"."""
from __future__ import annotations

import asyncio
from typing import Callable

import pytest
import torch

from helpers.engine_brake import DecodeBrake
from helpers.engine_util import scenario
from helpers.tiny_models import TINY_VOCAB, load_plain, save_tiny_model
from sparrow_server.engine.base import DEFAULT_WEIGHT_VERSION, GenerationRequest, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.reference.kv_cache import PagedKVCache
from sparrow_server.engine.reference.weight_update import architecture_mismatch
from sparrow_server.engine.weights import (
    WeightLoadError, WeightSyncConflictError, WeightUpdate, next_weight_version,
)
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

PROMPT = tuple((i * 7 + 3) % (TINY_VOCAB - 1) for i in range(40))
LONG_PROMPT = tuple((i * 11 + 5) % (TINY_VOCAB - 1) for i in range(100))  # 7 pages
SPARSE = Schedule(name="tiny-sparse", budgets_tokens=(48,), dense_layers=(0,), sink_pages=1, recent_pages=1)
TOL = 1e-4
ABORTED_MAX_NEW = 500  # requests the tests abort (they hold at most a few tokens when it lands)
PAUSED_MAX_NEW = 200  # requests the tests pause


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    return {
        "a": save_tiny_model(root / "a", seed=0),
        "b": save_tiny_model(root / "b", seed=1),
        "wider": save_tiny_model(root / "wider", seed=0, intermediate_size=96),
        "qwen3": save_tiny_model(root / "qwen3", "qwen3", seed=0),
    }


def make_engine(directory) -> ReferenceEngine:
    return ReferenceEngine(load_plain(directory, "sdpa"), None, "tiny", kv_pool_tokens=2048)


def req(rid, max_new=24, prompt=PROMPT, schedule=None, **kw) -> GenerationRequest:
    sampling = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    return GenerationRequest(rid=rid, input_ids=prompt, sampling=sampling, schedule=schedule or dense_schedule(), **kw)


class Stream:
    """One request's chunks, consumed by a task."""

    def __init__(self, engine: ReferenceEngine, request: GenerationRequest):
        self.chunks = []
        self.task = asyncio.create_task(self._consume(engine, request))

    async def _consume(self, engine, request):
        async for chunk in engine.submit(request):
            self.chunks.append(chunk)
        return self

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def logprobs(self) -> list[float]:
        return [x for c in self.chunks for x in c.logprobs]

    @property
    def last(self):
        return self.chunks[-1]

    @property
    def versions(self) -> set[str]:
        return {c.weight_version for c in self.chunks}

    async def until(self, n_tokens: int) -> None:
        await until(lambda: len(self.tokens) >= n_tokens)


async def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.002)


async def braked_pause(engine: ReferenceEngine, brake: DecodeBrake, mode: str):
    """Pause while the loop is held in a decode step: the pause has closed the gate and announced
    itself to the step lock (before its first await) when the brake lets that step finish."""
    sync = engine.weight_sync
    await brake.until_reached()
    pausing = asyncio.create_task(sync.pause_generation(mode))
    await until(lambda: sync.mode == mode)
    brake.release()
    return await pausing


async def run(engine, request) -> Stream:
    return await Stream(engine, request).task


def fresh_run(directory, request) -> Stream:
    engine = make_engine(directory)
    return scenario(engine, lambda: run(engine, request))


def test_next_weight_version():
    assert next_weight_version(DEFAULT_WEIGHT_VERSION) == "1"
    assert next_weight_version("7") == "8"
    assert next_weight_version("step-007") == "step-008"
    assert next_weight_version("v1.9") == "v1.10"
    assert next_weight_version("policy") == "policy.1"


def test_architecture_mismatch_names_the_difference(ckpt):
    a = load_plain(ckpt["a"])
    assert architecture_mismatch(a, load_plain(ckpt["b"])) is None
    assert "intermediate_size: serving 128, new 96" in architecture_mismatch(a, load_plain(ckpt["wider"]))
    assert "model_type: serving 'llama', new 'qwen3'" in architecture_mismatch(a, load_plain(ckpt["qwen3"]))


def test_update_waits_for_in_flight_requests_and_new_ones_use_new_weights(ckpt):
    engine = make_engine(ckpt["a"])
    assert engine.weights() is engine.weight_sync

    async def go():
        baseline = await run(engine, req("base", max_new=60))
        brake = DecodeBrake(engine, at=5)
        in_flight = Stream(engine, req("old", max_new=60))
        await brake.until_reached()
        update = asyncio.create_task(engine.weight_sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"]), weight_version="step-1")))
        await until(lambda: engine.weight_sync.updating)  # loaded; now draining the in-flight request
        queued = Stream(engine, req("new"))  # arrives while the update drains: held, then runs on the new weights
        brake.release()
        result = await update
        assert in_flight.last.finish.type == "length"  # the update waited for it
        return baseline, await in_flight.task, await queued.task, result, await run(engine, req("after"))

    baseline, old, queued, result, after = scenario(engine, go)
    assert old.versions == {DEFAULT_WEIGHT_VERSION} and old.tokens == baseline.tokens
    assert old.last.finish.type == "length"
    assert (result.previous_weight_version, result.weight_version) == (DEFAULT_WEIGHT_VERSION, "step-1")
    assert result.drain_s > 0 and engine.info().weight_version == "step-1"
    fresh = fresh_run(ckpt["b"], req("fresh"))
    for stream in (queued, after):
        assert stream.versions == {"step-1"}
        assert stream.tokens == fresh.tokens
        assert max(abs(x - y) for x, y in zip(stream.logprobs, fresh.logprobs)) < TOL


def _record_allocations(cache: PagedKVCache) -> list[int]:
    pages: list[int] = []
    allocate = cache.allocate

    def recording(table, new_length):
        before = len(table.pages)
        allocate(table, new_length)
        pages.extend(table.pages[before:])

    cache.allocate = recording
    return pages


def test_pages_reused_after_update_match_a_fresh_engine_and_the_cache_is_flushed(ckpt):
    """Sparse decode scores pages by their landmarks: a page reused after the update must carry
    the new weights' landmark, so selections, tokens and logprobs equal a fresh engine's."""
    engine = make_engine(ckpt["a"])
    request = req("sparse", max_new=40, prompt=LONG_PROMPT, schedule=SPARSE, return_selected_pages=True)
    before = _record_allocations(engine.cache)

    async def go():
        await run(engine, request)
        await engine.weight_sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"])))
        flushed = all(float(t.abs().sum()) == 0 for t in (engine.cache.k, engine.cache.v, engine.cache.landmarks))
        used_before = list(before)
        before.clear()
        return flushed, used_before, await run(engine, request)

    flushed, pages_old, new = scenario(engine, go)
    assert flushed
    assert set(before) == set(pages_old), "the test needs the same physical pages reused"
    fresh = fresh_run(ckpt["b"], request)
    assert new.versions == {"1"} and new.tokens == fresh.tokens
    assert [c.selected_pages for c in new.chunks] == [c.selected_pages for c in fresh.chunks]
    assert max(abs(x - y) for x, y in zip(new.logprobs, fresh.logprobs)) < TOL


def test_flush_is_what_invalidates_a_landmark_cache_that_survives_page_reuse(ckpt, monkeypatch):
    """Control with teeth: a cache that, like a GPU side cache, neither zeroes landmarks on
    allocation nor recomputes a page's landmark once set serves stale landmarks after an update
    unless the flush zeroes them. Without the flush the sparse rollout differs from a fresh one."""
    def compute_once(self, layer, page_ids):
        if page_ids.numel():
            unset = self.landmarks[layer, page_ids].abs().flatten(1).sum(1) == 0
            ids = page_ids[unset]
            self.landmarks[layer, ids] = self.k[layer, ids].to(torch.float32).mean(dim=1)

    def zero_kv_only(self, pages):
        idx = torch.tensor(pages, dtype=torch.long)
        self.k[:, idx] = 0
        self.v[:, idx] = 0

    init = PagedKVCache.__init__

    def init_zero_landmarks(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.landmarks.zero_()

    monkeypatch.setattr(PagedKVCache, "__init__", init_zero_landmarks)
    monkeypatch.setattr(PagedKVCache, "update_landmarks", compute_once)
    monkeypatch.setattr(PagedKVCache, "_zero_pages", zero_kv_only)
    request = req("sparse", max_new=40, prompt=LONG_PROMPT, schedule=SPARSE, return_selected_pages=True)
    fresh = fresh_run(ckpt["b"], request)

    def updated_run(flush: bool) -> Stream:
        engine = make_engine(ckpt["a"])

        async def go():
            await run(engine, request)
            await engine.weight_sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"]), flush_cache=flush))
            return await run(engine, request)

        return scenario(engine, go)

    selections = [c.selected_pages for c in fresh.chunks]
    assert [c.selected_pages for c in updated_run(flush=True).chunks] == selections
    assert [c.selected_pages for c in updated_run(flush=False).chunks] != selections


def test_bad_updates_are_refused_and_the_old_weights_keep_serving(ckpt, tmp_path):
    engine = make_engine(ckpt["a"])
    (tmp_path / "empty").mkdir()
    bad = [
        (WeightUpdate(str(tmp_path / "missing")), "model_path", "no such file"),
        (WeightUpdate(str(tmp_path / "empty")), "model_path", "no config.json"),
        (WeightUpdate(str(ckpt["wider"])), "model_path", "intermediate_size"),
        (WeightUpdate(str(ckpt["qwen3"])), "model_path", "model_type"),
        (WeightUpdate(str(ckpt["b"]), load_format="npcache"), "load_format", "HF checkpoints"),
    ]

    async def go():
        baseline = await run(engine, req("x"))
        errors = []
        for update, _, _ in bad:
            with pytest.raises(WeightLoadError) as info:
                await engine.weight_sync.update_weights_from_disk(update)
            errors.append(info.value)
        return baseline, errors, await run(engine, req("y"))

    baseline, errors, after = scenario(engine, go)
    for error, (_, field, words) in zip(errors, bad):
        assert error.field == field and words in str(error)
    assert after.tokens == baseline.tokens and after.versions == {DEFAULT_WEIGHT_VERSION}
    assert engine.info().weight_version == DEFAULT_WEIGHT_VERSION


def test_abort_all_requests_aborts_in_flight_ones(ckpt):
    engine = make_engine(ckpt["a"])

    async def go():
        brake = DecodeBrake(engine, at=3)
        in_flight = Stream(engine, req("old", max_new=ABORTED_MAX_NEW))
        await brake.until_reached()
        update = asyncio.create_task(engine.weight_sync.update_weights_from_disk(
            WeightUpdate(str(ckpt["b"]), weight_version="2", abort_all_requests=True)))
        await until(lambda: engine.weight_sync.updating)  # the abort is marked: the next step lands it
        brake.release()
        result = await update
        return await in_flight.task, result

    old, result = scenario(engine, go)
    assert old.last.finish.type == "abort" and old.versions == {DEFAULT_WEIGHT_VERSION}
    assert len(old.tokens) == 4 and result.num_aborted_requests == 1 and result.weight_version == "2"


def test_pause_in_place_freezes_and_continue_resumes(ckpt):
    engine = make_engine(ckpt["a"])
    sync = engine.weight_sync

    async def go():
        baseline = await run(engine, req("base", max_new=PAUSED_MAX_NEW))
        brake = DecodeBrake(engine, at=5)
        running = Stream(engine, req("run", max_new=PAUSED_MAX_NEW))
        state = await braked_pause(engine, brake, "in_place")
        await running.until(6)  # the prefill's token and five decodes': the braked step finished, no other ran
        held = Stream(engine, req("held", max_new=5))
        await asyncio.sleep(0.2)  # time to move, were the pause broken (frozen, no amount of it moves anything)
        assert len(running.tokens) == 6 and not held.tokens
        assert sync.pause_state().mode == "in_place" and state.running == 1
        await sync.continue_generation()
        return baseline, await running.task, await held.task

    baseline, resumed, held = scenario(engine, go)
    assert resumed.tokens == baseline.tokens and resumed.last.finish.type == "length"
    assert len(held.tokens) == 5


def test_pause_retract_frees_kv_and_recomputes_it_on_continue(ckpt):
    engine = make_engine(ckpt["a"])
    sync = engine.weight_sync

    async def go():
        baseline = await run(engine, req("base", max_new=PAUSED_MAX_NEW))
        brake = DecodeBrake(engine, at=5)
        running = Stream(engine, req("run", max_new=PAUSED_MAX_NEW))
        state = await braked_pause(engine, brake, "retract")
        free = engine.cache.free_pages
        await sync.continue_generation()
        return baseline, state, free, await running.task

    baseline, state, free, resumed = scenario(engine, go)
    assert (state.mode, state.running, state.waiting) == ("retract", 0, 1)
    assert free == engine.cache.usable_pages
    assert resumed.tokens == baseline.tokens and resumed.versions == {DEFAULT_WEIGHT_VERSION}
    assert max(abs(x - y) for x, y in zip(resumed.logprobs, baseline.logprobs)) < TOL


def test_update_while_retracted_aborts_requests_holding_old_tokens(ckpt):
    engine = make_engine(ckpt["a"])
    sync = engine.weight_sync

    async def go():
        brake = DecodeBrake(engine, at=3)
        running = Stream(engine, req("run", max_new=ABORTED_MAX_NEW))
        await braked_pause(engine, brake, "retract")
        queued = Stream(engine, req("queued"))  # no tokens yet: it simply runs on the new weights
        result = await sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"])))
        await sync.continue_generation()
        return result, await running.task, await queued.task

    result, old, queued = scenario(engine, go)
    assert result.num_paused_requests == 1 and result.num_aborted_requests == 1
    assert old.last.finish.type == "abort" and "retracted" in old.last.finish.message
    assert old.versions == {DEFAULT_WEIGHT_VERSION}
    assert queued.versions == {"1"} and queued.tokens == fresh_run(ckpt["b"], req("fresh")).tokens


def test_update_while_paused_in_place_is_refused_unless_aborting(ckpt):
    engine = make_engine(ckpt["a"])
    sync = engine.weight_sync

    async def go():
        brake = DecodeBrake(engine, at=3)
        running = Stream(engine, req("run", max_new=ABORTED_MAX_NEW))
        await braked_pause(engine, brake, "in_place")
        with pytest.raises(WeightSyncConflictError, match="paused in_place"):
            await sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"])))
        assert engine.info().weight_version == DEFAULT_WEIGHT_VERSION and not running.task.done()
        await sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"]), abort_all_requests=True))
        await sync.continue_generation()
        return await running.task, await run(engine, req("after"))

    old, after = scenario(engine, go)
    assert old.last.finish.type == "abort" and old.versions == {DEFAULT_WEIGHT_VERSION}
    assert after.versions == {"1"}


def test_pause_abort_aborts_and_holds_new_requests_until_continue(ckpt):
    engine = make_engine(ckpt["a"])
    sync = engine.weight_sync

    async def go():
        brake = DecodeBrake(engine, at=3)
        running = Stream(engine, req("run", max_new=ABORTED_MAX_NEW))
        await braked_pause(engine, brake, "abort")
        # pause returns once the request is finished; its last chunk reaches the client's task a few
        # event-loop turns later, and must do so while generation is still paused
        assert "run" not in engine.live_requests()
        await running.task
        held = Stream(engine, req("held", max_new=4))
        await asyncio.sleep(0.1)
        assert not held.tokens
        await sync.continue_generation()
        return await running.task, await held.task

    aborted, held = scenario(engine, go)
    assert aborted.last.finish.type == "abort" and len(aborted.tokens) == 4 and held.last.finish.type == "length"


def test_keep_pause_holds_generation_after_the_update(ckpt):
    engine = make_engine(ckpt["a"])
    sync = engine.weight_sync

    async def go():
        await sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"]), keep_pause=True))
        held = Stream(engine, req("held", max_new=4))
        await asyncio.sleep(0.1)
        assert sync.pause_state().mode == "in_place" and not held.tokens
        await sync.continue_generation()
        return await held.task

    held = scenario(engine, go)
    assert held.versions == {"1"} and len(held.tokens) == 4


def test_update_keeps_lora_adapters_attached_on_the_new_base(ckpt, tmp_path):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(load_plain(ckpt["a"]), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                                   init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")

    def engine_on(directory) -> ReferenceEngine:
        engine = make_engine(directory)
        engine.load_adapter("ad1", str(tmp_path / "adapter"))
        return engine

    updated, fresh = engine_on(ckpt["a"]), engine_on(ckpt["b"])

    async def go(engine, update: bool):
        if update:
            await engine.weight_sync.update_weights_from_disk(WeightUpdate(str(ckpt["b"])))
        return await run(engine, req("lora", adapter="ad1")), await run(engine, req("base"))

    got = scenario(updated, lambda: go(updated, True))
    want = scenario(fresh, lambda: go(fresh, False))
    for g, w in zip(got, want):
        assert g.tokens == w.tokens and max(abs(x - y) for x, y in zip(g.logprobs, w.logprobs)) < TOL
    assert got[0].last.adapter == "ad1" and got[0].logprobs != got[1].logprobs
