"""What the HTTP service calls to verify rollouts (kept here so the service needs only a few lines).

- ``build_verifier(engine, metrics, fraction)``: a ``DenseVerifier`` for an engine, or ``None``
  when this engine cannot be verified (neither an in-process model nor a scorer of its own);
- ``request_flags(verifier, requested)``: the ``verify`` / ``record_topk`` fields of one engine
  request (decided at admission, so the engine records top-k only for verified requests);
- ``on_finished(verifier, request, sample, requested)``: submits the finished rollout; when the
  client asked (``verify: true``) it waits for the result, off the event loop, and returns the
  fields for the response's ``meta``; sampled rollouts only feed the metrics.
"""
from __future__ import annotations

import asyncio
from typing import Any

from sparrow_server.engine.base import Engine
from sparrow_server.monitor.metrics import AcceptanceMetrics
from sparrow_server.monitor.scoring import HFScorer
from sparrow_server.monitor.verifier import DEFAULT_SAMPLE_FRACTION, DenseVerifier, VerificationJob, topk_from_chunks
from sparrow_server.sparsity.schedule import Schedule

EXACT_NO_RECORDING = 0  # record_topk for engines verified exactly by a teacher-forced forward


def build_verifier(engine: Engine, metrics: AcceptanceMetrics | None,
                   sample_fraction: float = DEFAULT_SAMPLE_FRACTION) -> DenseVerifier | None:
    """A verifier scoring exactly on the engine's in-process model (under its step lock), or with
    the scorer an engine offers (``engine.dense_scoring()``, SGLang)."""
    offer = engine.dense_scoring()
    if offer is not None:
        return DenseVerifier(offer.scorer, metrics, sample_fraction=sample_fraction, record_topk=offer.record_topk,
                             weight_version=offer.scorer.weight_version, exact_stride=offer.exact_stride)
    local = engine.local_model()
    if local is None:
        return None
    scorer = HFScorer(local.current, lock=local.step_lock)
    return DenseVerifier(scorer, metrics, sample_fraction=sample_fraction, record_topk=EXACT_NO_RECORDING,
                         weight_version=lambda: engine.info().weight_version)


def request_flags(verifier: DenseVerifier | None, requested: bool) -> dict[str, Any]:
    if verifier is None or not verifier.should_verify(requested):
        return {"verify": False, "record_topk": 0}
    return {"verify": True, "record_topk": verifier.record_topk, "exact_keep": verifier.choose_kept()}


def _job(request: Any, schedule: Schedule, token_ids: list[int], top_logprobs: list[Any], requested: bool,
         adapter: str | None, weight_version: str | None) -> VerificationJob:
    topk = topk_from_chunks(top_logprobs) if request.record_topk and top_logprobs else None
    return VerificationJob(
        rid=request.rid, schedule=schedule, prompt_ids=tuple(request.input_ids), completion_ids=tuple(token_ids),
        temperature=request.sampling.logprob_temperature, adapter=adapter, sparse_topk=topk, requested=requested,
        weight_version=weight_version, exact_keep=getattr(request, "exact_keep", None),
    )


async def on_finished(verifier: DenseVerifier | None, request: Any, schedule: Schedule, sample: Any,
                      requested: bool) -> dict[str, Any] | None:
    """Verify a finished sample (``request.verify`` set at admission); ``meta`` fields when requested."""
    if verifier is None or not request.verify or not sample.token_ids:
        return None
    if sample.finish is None or sample.finish.type not in ("stop", "length"):
        return None  # aborted or failed: nothing meaningful to score
    job = _job(request, schedule, sample.token_ids, sample.top_logprobs, requested, sample.adapter,
               sample.weight_version or None)
    future = verifier.submit(job)
    if future is None or not requested:
        return None
    try:
        result = await asyncio.wrap_future(future)
    except Exception as exc:  # verification must never fail the rollout itself
        return {"acceptance_error": f"{type(exc).__name__}: {exc}"}
    return result.meta()


__all__ = ["build_verifier", "request_flags", "on_finished"]
