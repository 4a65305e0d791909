"""Keep the backend's landmark side cache consistent with SGLang's KV cache across weight updates.

SGLang flushes its caches through one method, ``Scheduler.flush_cache`` (``/flush_cache``, and
after ``/update_weights_from_disk``, ``/update_weights_from_tensor``,
``/update_weights_from_distributed`` and ``/update_weights_from_ipc`` when ``flush_cache`` is
true): it resets the radix tree and the KV allocators, but knows nothing of the backend's
landmark side cache. An AFTER hook on that method zeroes the landmarks of every sparrow backend
of the scheduler's model runner, so after a flush the side cache is what a freshly started server
has (all zeros) and no landmark computed with old weights can be scored again, whatever path
(HiCache load-back, PD transfer) later fills a page without passing through the backend.

With SGLang's memory saver (``--enable-memory-saver``) the backend allocates the landmarks inside
the saver's ``kv_cache`` region (``backend.py``), so ``/release_memory_occupation`` (tag
``kv_cache``) frees them with the KV pool and ``/resume_memory_occupation`` maps them back at the
same addresses (CUDA graphs stay valid) but with undefined contents. SGLang flushes *after* pausing
the region on release: the flush hook then leaves the unmapped landmarks alone, and an AFTER hook on
``SchedulerWeightUpdaterManager.resume_memory_occupation`` zeroes them once they are mapped again.

The flush hook has to be registered before ``Scheduler.__init__`` (SGLang binds ``self.flush_cache``
into ``SchedulerWeightUpdaterManager`` and ``SchedulerFlushWrapper`` there); hooks registered by
the plug-in's ``register()`` are applied by ``load_plugins()`` at the start of
``run_scheduler_process``, which is early enough. The HTTP-process side of a weight update (the
checkpoint preflight) is ``frontend.weight_preflight``. No SGLang import here (tested on CPU with
stand-ins).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

logger = logging.getLogger(__name__)

FLUSH_TARGET = "sglang.srt.managers.scheduler.Scheduler.flush_cache"
RESUME_TARGET = ("sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
                 ".resume_memory_occupation")
KV_CACHE_TAG = "kv_cache"  # SGLang's GPU_MEMORY_TYPE_KV_CACHE
# Attributes of a model runner, and of wrapper backends (hybrid, TBO), that hold attention backends.
RUNNER_BACKEND_ATTRS = ("attn_backend", "decode_attn_backend", "decode_attn_backend_group")
NESTED_BACKEND_ATTRS = ("prefill_backend", "decode_backend", "full_attn_backend", "primary", "children")
LANDMARKS_ATTR = "landmarks"  # SparrowAttnBackend.landmarks: {layer_id: [pages, Hkv, D] tensor}
LANDMARK_SCALES_ATTR = "landmark_scales"  # float8 landmarks' scales: {layer_id: [pages, Hkv] float32}


def _walk(obj: Any, seen: set[int]) -> Iterator[Any]:
    if obj is None or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _walk(item, seen)
        return
    if isinstance(getattr(obj, LANDMARKS_ATTR, None), dict):
        yield obj
    for name in NESTED_BACKEND_ATTRS:
        yield from _walk(getattr(obj, name, None), seen)


def sparrow_backends(model_runner: Any) -> list[Any]:
    """Every attention backend of ``model_runner`` that has a landmark side cache (deduplicated)."""
    seen: set[int] = set()
    return [b for name in RUNNER_BACKEND_ATTRS for b in _walk(getattr(model_runner, name, None), seen)]


def invalidate_landmarks(backend: Any) -> int:
    """Zero the backend's landmarks in place (addresses kept: CUDA graphs stay valid) and drop its
    step plan. Returns the number of layers zeroed."""
    tables = getattr(backend, LANDMARKS_ATTR)
    for tensor in (*tables.values(), *getattr(backend, LANDMARK_SCALES_ATTR, {}).values()):
        tensor.zero_()
    if hasattr(backend, "step"):
        backend.step = None
    return len(tables)


def after_flush_cache(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook of ``Scheduler.flush_cache``: invalidate landmarks when the flush happened
    (``result`` True; a flush refused because requests are running leaves everything as is)."""
    if not result:
        return None
    if KV_CACHE_TAG in getattr(getattr(scheduler, "weight_updater", None), "offload_tags", ()):
        logger.info("sparrow: cache flushed while the kv_cache memory is released; landmarks zeroed on resume")
        return None
    layers = _invalidate_all(scheduler)
    logger.info("sparrow: cache flushed; landmarks of %d sparse layers invalidated", layers)
    return None


def kv_cache_region(model_runner: Any) -> contextlib.AbstractContextManager:
    """SGLang's memory-saver region for the KV pool (``memory_saver_adapter.region("kv_cache")``),
    or a no-op when the saver is off: tensors allocated inside are released and resumed with the pool."""
    adapter = getattr(model_runner, "memory_saver_adapter", None)
    if adapter is None or not getattr(adapter, "enabled", False):
        return contextlib.nullcontext()
    return adapter.region(KV_CACHE_TAG)


def _invalidate_all(owner: Any) -> int:
    """Zero the landmarks of every sparrow backend of ``owner``'s (a scheduler's or a weight
    updater's) target and draft model runners."""
    runners = [getattr(getattr(owner, "tp_worker", None), "model_runner", None)]
    draft = getattr(owner, "draft_worker", None)
    runners.append(getattr(draft, "model_runner", None) if draft is not None else None)
    return sum(invalidate_landmarks(b) for r in runners if r is not None for b in sparrow_backends(r))


def after_resume_memory_occupation(result: Any, updater: Any, recv_req: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook of ``SchedulerWeightUpdaterManager.resume_memory_occupation``: the ``kv_cache``
    region (landmarks included) is mapped again with undefined contents; zero the landmarks."""
    tags = getattr(recv_req, "tags", None)
    if not tags or KV_CACHE_TAG in tags:
        layers = _invalidate_all(updater)
        logger.info("sparrow: kv_cache memory resumed; landmarks of %d sparse layers zeroed", layers)
    return None


def install(hook_registry: Any, hook_type: Any) -> None:
    """Register the flush and memory-resume hooks (``scheduler.install``, next to ``hooks.install``)."""
    hook_registry.register(FLUSH_TARGET, after_flush_cache, hook_type.AFTER)
    hook_registry.register(RESUME_TARGET, after_resume_memory_occupation, hook_type.AFTER)


__all__ = ["install", "after_flush_cache", "after_resume_memory_occupation", "invalidate_landmarks", "sparrow_backends",
           "kv_cache_region", "FLUSH_TARGET", "RESUME_TARGET"]
