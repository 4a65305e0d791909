"""HookRegistry hooks: carry per-request schedules and host-side KV rows to the backend.

- AFTER ``ReqToTokenPool.alloc``: record each request's schedule and prompt length under its
  KV row in the side table.
- AFTER ``ForwardBatch.init_new``: stash the batch's KV rows as a host list on decode batches
  (``forward_batch.req_pool_indices`` is on the GPU; reading it would sync every step).
- AROUND ``build_replay_fb_view``: forward that list into the CUDA-graph replay view.

Under tensor parallelism every TP rank is its own scheduler process; SGLang calls ``load_plugins()``
in each and broadcasts the requests to all ranks, so each rank's hooks fill that rank's side table.
"""
from __future__ import annotations

import logging

from sparrow_server.sglang_plugin.scheduler import state
from sparrow_server.sglang_plugin.scheduler.side_table import assign_request

logger = logging.getLogger(__name__)

ROWS_ATTR = "sparrow_rows"

ALLOC_TARGET = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool.alloc"
INIT_NEW_TARGET = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
REPLAY_VIEW_TARGET = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.build_replay_fb_view"


def after_alloc(result, pool, reqs, *args, **kwargs):
    if result is None:
        return None
    table = state.table(int(getattr(pool, "_alloc_size", pool.size + 1)))
    for req in reqs:
        assign_request(table, req, state.registry())
    return None


def schedule_batch(args, kwargs):
    batch = kwargs.get("batch")
    if batch is not None:
        return batch
    return next((a for a in args if hasattr(a, "reqs") and hasattr(a, "forward_mode")), None)


def after_init_new(result, *args, **kwargs):
    batch = schedule_batch(args, kwargs)
    if batch is not None and result is not None and result.forward_mode.is_decode():
        setattr(result, ROWS_ATTR, [int(r.req_pool_idx) for r in batch.reqs])
    return None


def around_replay_view(original, *args, **kwargs):
    view = original(*args, **kwargs)
    forward_batch = kwargs.get("forward_batch", args[0] if args else None)
    setattr(view, ROWS_ATTR, getattr(forward_batch, ROWS_ATTR, None))
    return view


def install(hook_registry, hook_type) -> None:
    """Register the hooks with SGLang's ``HookRegistry`` (applied by ``load_plugins``)."""
    hook_registry.register(ALLOC_TARGET, after_alloc, hook_type.AFTER)
    hook_registry.register(INIT_NEW_TARGET, after_init_new, hook_type.AFTER)
    hook_registry.register(REPLAY_VIEW_TARGET, around_replay_view, hook_type.AROUND)
