"""The SGLang flush hook (``sglang_plugin.scheduler.landmarks``) on stand-in scheduler objects: after a
successful ``Scheduler.flush_cache`` every sparrow backend's landmark side cache is zero (the
state of a freshly started server), whatever wrapper holds the backend; a refused flush changes
nothing; and the checkpoint preflight hook (``sglang_plugin.frontend.weight_preflight``). No SGLang needed."""
from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import torch

from helpers.tiny_models import save_tiny_model
from sparrow_server.sglang_plugin.frontend import weight_preflight
from sparrow_server.sglang_plugin.scheduler import landmarks


def sparrow_backend(layers=(1, 2), scaled=False):
    """A backend's landmark side cache; ``scaled``: float8's, with its scales ([pages, heads] each layer)."""
    backend = SimpleNamespace(landmarks={i: torch.randn(8, 2, 4) for i in layers}, step="plan of the last step")
    if scaled:
        backend.landmark_scales = {i: torch.rand(8, 2) + 1 for i in layers}
    return backend


def side_cache(backend):
    """Every tensor of the backend's landmark side cache: its landmarks and (float8) their scales."""
    return [*backend.landmarks.values(), *getattr(backend, "landmark_scales", {}).values()]


def stand_in_scheduler():
    main, other_stream, draft = sparrow_backend(scaled=True), sparrow_backend((3,)), sparrow_backend((0,))
    stock = SimpleNamespace(name="flashinfer")  # a backend without landmarks
    runner = SimpleNamespace(attn_backend=SimpleNamespace(prefill_backend=stock, decode_backend=main),
                             decode_attn_backend=main, decode_attn_backend_group=[main, other_stream])
    scheduler = SimpleNamespace(tp_worker=SimpleNamespace(model_runner=runner),
                                draft_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=draft)))
    return scheduler, (main, other_stream, draft)


def test_backends_are_found_through_wrappers_once_each():
    scheduler, (main, other_stream, _) = stand_in_scheduler()
    found = landmarks.sparrow_backends(scheduler.tp_worker.model_runner)
    assert [id(b) for b in found] == [id(main), id(other_stream)]


def test_successful_flush_zeroes_every_landmark_in_place():
    scheduler, backends = stand_in_scheduler()
    storage = [t.data_ptr() for b in backends for t in side_cache(b)]
    assert landmarks.after_flush_cache(True, scheduler, empty_cache=True) is None  # keeps flush_cache's result
    for backend in backends:
        assert all(float(t.abs().sum()) == 0 for t in side_cache(backend)) and backend.step is None
    assert len(side_cache(backends[0])) == 4  # the float8 backend's scales were zeroed too
    assert [t.data_ptr() for b in backends for t in side_cache(b)] == storage  # CUDA graphs keep their pointers


def test_refused_flush_changes_nothing():
    scheduler, backends = stand_in_scheduler()
    before = [t.clone() for b in backends for t in b.landmarks.values()]
    landmarks.after_flush_cache(False, scheduler)
    assert all(torch.equal(a, b) for a, b in zip(before, [t for b in backends for t in b.landmarks.values()]))


def test_install_registers_the_flush_and_preflight_hooks():
    calls = []
    registry = SimpleNamespace(register=lambda target, hook, kind: calls.append((target, hook, kind)))
    landmarks.install(registry, SimpleNamespace(AFTER="after", AROUND="around"))
    assert calls == [
        ("sglang.srt.managers.scheduler.Scheduler.flush_cache", landmarks.after_flush_cache, "after"),
        ("sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
         ".resume_memory_occupation", landmarks.after_resume_memory_occupation, "after"),
    ]
    calls.clear()
    weight_preflight.install(registry, SimpleNamespace(AFTER="after", AROUND="around"))
    assert calls == [("sglang.srt.managers.tokenizer_manager.TokenizerManager.update_weights_from_disk",
                      weight_preflight.around_update_weights_from_disk, "around")]


def test_flush_while_kv_memory_is_released_leaves_the_unmapped_landmarks_alone():
    """SGLang 0.5.17 ``release_memory_occupation``: offload_tags gets kv_cache, the region is paused,
    then flush_cache runs; touching the landmarks then would fault on the GPU."""
    scheduler, backends = stand_in_scheduler()
    scheduler.weight_updater = SimpleNamespace(offload_tags={"kv_cache"})
    before = [t.clone() for b in backends for t in b.landmarks.values()]
    landmarks.after_flush_cache(True, scheduler)
    assert all(torch.equal(a, b) for a, b in zip(before, [t for b in backends for t in b.landmarks.values()]))


def test_resume_of_kv_memory_zeroes_the_landmarks():
    scheduler, backends = stand_in_scheduler()
    updater = SimpleNamespace(tp_worker=scheduler.tp_worker, draft_worker=scheduler.draft_worker)
    landmarks.after_resume_memory_occupation(None, updater, SimpleNamespace(tags=["weights"]))
    assert all(float(t.abs().sum()) > 0 for b in backends for t in side_cache(b))  # weights only: untouched
    for tags in (["kv_cache"], None, []):
        for b in backends:
            for t in side_cache(b):
                t.normal_()
        landmarks.after_resume_memory_occupation(None, updater, SimpleNamespace(tags=tags))
        assert all(float(t.abs().sum()) == 0 for b in backends for t in side_cache(b)), tags


def test_landmarks_are_allocated_in_the_kv_cache_region_only_with_the_memory_saver():
    entered = []

    class Saver:
        enabled = True

        def region(self, tag):
            entered.append(tag)
            return contextlib.nullcontext()

    with landmarks.kv_cache_region(SimpleNamespace(memory_saver_adapter=Saver())):
        pass
    with landmarks.kv_cache_region(SimpleNamespace(memory_saver_adapter=SimpleNamespace(enabled=False))):
        pass
    with landmarks.kv_cache_region(SimpleNamespace()):
        pass
    assert entered == ["kv_cache"]


def test_preflight_hook_refuses_another_architecture_before_sglang_loads(tmp_path):
    serving, same = save_tiny_model(tmp_path / "a", seed=0), save_tiny_model(tmp_path / "b", seed=1)
    wider = save_tiny_model(tmp_path / "wider", seed=0, intermediate_size=96)
    forwarded = []

    async def original(manager, obj, request=None):  # SGLang's method: (success, message, num_paused_requests)
        forwarded.append(obj.model_path)
        return True, "Succeeded to update model weights.", 0

    def call(serving_path, new_path):
        manager, obj = SimpleNamespace(model_path=str(serving_path)), SimpleNamespace(model_path=str(new_path))
        return asyncio.run(weight_preflight.around_update_weights_from_disk(original, manager, obj, None))

    assert call(serving, same) == (True, "Succeeded to update model weights.", 0)
    ok, message, paused = call(serving, wider)
    assert not ok and "intermediate_size" in message and paused == 0
    assert not call(serving, tmp_path / "missing")[0]
    assert call("Qwen/Qwen3-0.6B", wider)[0]  # a hub id cannot be preflighted: SGLang decides
    assert forwarded == [str(same), str(wider)]
