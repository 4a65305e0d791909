"""HookRegistry hooks of exact acceptance on a subsample (issue 25); the logic is in ``exact_rows`` and
``exact_verify``. A request carrying no exact-acceptance parameter costs one cached attribute read
per batch and step.

- AFTER ``ForwardBatch.init_new``: on the host, from the batch's CPU lengths, which rows of this
  batch's next-token logits are kept positions (``CAPTURES_ATTR``) and which requests are verify
  prefills (``VERIFY_ATTR``, also kept as the pending extend's jobs, see ``around_logits_forward``).
  A kept decode position whose request's schedule covers its length (every page attended) is, for a
  request without an adapter, the dense step: its value is 1 and no row is kept (``exact_rows``).
- BEFORE ``ModelRunner.sample``: copy the kept rows as float16 ``logits - max``. ``sample`` runs after
  the forward, outside any CUDA graph (the decode graph captures the logits processor; its output
  buffer is read here, before the next replay overwrites it, in stream order), and before the
  sampler's temperature, penalties and logit bias (the stored row is at temperature 1).
- AROUND ``LogitsProcessor.forward``: in a verify prefill, the dense rows at the kept positions (the
  processor's own LM head on those hidden states) against the stored rows. A prefill that returns
  logprobs runs its logits processor eagerly (SGLang's prefill graphs keep an eager logits tail), but
  a body-capture replay passes the processor a batch object of its own, so the jobs are also kept
  module-wide for the extend being run (checked against its lengths).
- AFTER ``Scheduler.abort_request``: free the aborted requests' rows.
"""
from __future__ import annotations

import logging
from typing import Any

from sparrow_server.sglang_plugin.scheduler import state
from sparrow_server.sglang_plugin.scheduler.exact_rows import decode_captures, extend_captures
from sparrow_server.sglang_plugin.scheduler.exact_verify import finish, publish, score_chunk, verify_jobs
from sparrow_server.sglang_plugin.scheduler.hooks import INIT_NEW_TARGET, schedule_batch
from sparrow_server.sparsity.schedule import is_sparse_at
from sparrow_server.stats.acceptance import compact_logits

logger = logging.getLogger(__name__)

SAMPLE_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.sample"
LOGITS_TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"
ABORT_TARGET = "sglang.srt.managers.scheduler.Scheduler.abort_request"

CAPTURES_ATTR = "sparrow_exact_captures"
VERIFY_ATTR = "sparrow_exact_verify"

_pending: tuple[tuple[int, ...], list] | None = None  # (extend lengths, verify jobs) of the extend being run


def attends_every_page(req: Any, length: int) -> bool:
    """Whether ``req``'s decode step at ``length`` tokens attends every page on every sparse layer (its
    schedule's budget covers the length, as the backend plans it: ``planning.plan_request``)."""
    table, row = state.schedule_table(), getattr(req, "req_pool_idx", None)
    if table is None or row is None:
        return False
    return not is_sparse_at(table.schedule_of(int(row)), length, int(table.prompt_len[int(row)]))


def after_init_new(result, *args, **kwargs):
    global _pending
    batch = schedule_batch(args, kwargs)
    if batch is None or result is None:
        return None
    mode = result.forward_mode
    if mode.is_decode():
        seq_lens = getattr(result, "seq_lens_cpu", None)
        if seq_lens is None:
            seq_lens = getattr(batch, "seq_lens_cpu", None)
        if seq_lens is not None:
            setattr(result, CAPTURES_ATTR, decode_captures(batch.reqs, seq_lens, attends_every_page))
        return None
    prefix, extend = getattr(result, "extend_prefix_lens_cpu", None), getattr(result, "extend_seq_lens_cpu", None)
    if not mode.is_extend() or prefix is None or extend is None:
        return None
    setattr(result, CAPTURES_ATTR, extend_captures(batch.reqs, prefix, extend, state.exact_store()))
    jobs = verify_jobs(batch.reqs, prefix, extend)
    setattr(result, VERIFY_ATTR, jobs)
    _pending = (tuple(int(e) for e in extend), jobs) if jobs else None
    return None


def before_sample(runner, logits_output, forward_batch, *args, **kwargs):
    captures = getattr(forward_batch, CAPTURES_ATTR, None)
    logits = getattr(logits_output, "next_token_logits", None)
    if not captures or logits is None:
        return None
    store = state.exact_store()
    for c in captures:
        if c.dense:
            store.put_dense(c.rid, c.kept, c.position)
        elif c.index < logits.shape[0]:
            store.put(c.rid, c.kept, c.position, compact_logits(logits[c.index]))
    return None


def _jobs_for(metadata: Any) -> list:
    """This forward's verify jobs: from the batch itself, else the pending extend's if the lengths match."""
    global _pending
    jobs = getattr(metadata, VERIFY_ATTR, None)
    if jobs is not None:
        return jobs
    if _pending is None:
        return []
    lens = getattr(metadata, "extend_seq_lens_cpu", None)
    if lens is None or tuple(int(e) for e in lens) != _pending[0]:
        return []
    jobs, _pending = _pending[1], None
    return jobs


def _logits_metadata(metadata: Any) -> Any:
    from sglang.srt.layers.logits_processor import LogitsMetadata

    return metadata if isinstance(metadata, LogitsMetadata) else LogitsMetadata.from_forward_batch(metadata)


def dense_logits(processor: Any, hidden_rows: Any, lm_head: Any, meta: Any) -> Any:
    """The processor's own LM head on some hidden rows: scaling, TP gather and soft-capping as SGLang's own
    logits (its ``_get_logits``; no public method computes logits of chosen rows)."""
    return processor._get_logits(hidden_rows, lm_head, meta, use_logits_buffer=False)


def _arg(args, kwargs, index: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else (args[index] if len(args) > index else None)


def around_logits_forward(original, processor, *args, **kwargs):
    out = original(processor, *args, **kwargs)
    metadata = _arg(args, kwargs, 3, "logits_metadata")
    mode = getattr(metadata, "forward_mode", None)
    if mode is None or not mode.is_extend() or getattr(processor, "do_tensor_parallel_all_gather_dp_attn", False):
        return out  # (DP attention: the LM head's gathers depend on other ranks' batches; not supported)
    jobs = _jobs_for(metadata)
    if not jobs:
        return out
    hidden, lm_head = _arg(args, kwargs, 1, "hidden_states"), _arg(args, kwargs, 2, "lm_head")
    meta = _logits_metadata(metadata)
    store = state.exact_store()
    for job in jobs:
        try:
            score_chunk(job, store, lambda idx: dense_logits(processor, hidden[idx], lm_head, meta), hidden.device)
            if job.is_last_chunk:
                publish(job.req, finish(job, store))
        except Exception:  # never fail the batch for a statistic; the frontend reports the values missing
            logger.exception("request %s: exact acceptance failed", getattr(job.req, "rid", "?"))
            store.free(job.verify.rid)
    return out


def after_abort(result, scheduler, recv_req, *args, **kwargs):
    store = state.exact_store()
    if getattr(recv_req, "abort_all", False):
        store.clear()
    elif getattr(recv_req, "rid", None):
        store.free_prefix(recv_req.rid)
    return None


def install(hook_registry, hook_type) -> None:
    hook_registry.register(INIT_NEW_TARGET, after_init_new, hook_type.AFTER)
    hook_registry.register(SAMPLE_TARGET, before_sample, hook_type.BEFORE)
    hook_registry.register(LOGITS_TARGET, around_logits_forward, hook_type.AROUND)
    hook_registry.register(ABORT_TARGET, after_abort, hook_type.AFTER)


__all__ = ["install", "attends_every_page", "after_init_new", "before_sample", "around_logits_forward", "after_abort",
           "SAMPLE_TARGET", "LOGITS_TARGET", "ABORT_TARGET"]
