"""JSON shapes of responses: ``/rollout`` events and results, and SGLang's ``/generate``."""
from __future__ import annotations

import json
from typing import Any, Callable

from sparrow_server.engine.base import GenerationChunk
from sparrow_server.server.generate_models import GenerateItem
from sparrow_server.server.service import Rollout, SampleResult

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def ndjson(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def rollout_meta(rollout: Rollout, sample: SampleResult, elapsed_s: float) -> dict[str, Any]:
    return {
        "rid": sample.rid,
        "finish_reason": sample.finish.to_dict() if sample.finish else None,
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": len(sample.token_ids),
        "schedule": rollout.schedule.name,
        "schedule_id": rollout.schedule.id,
        "adapter": sample.adapter,
        "kv_budget_tokens_mean": sample.kv_budget_tokens_mean,
        "weight_version": sample.weight_version,
        "e2e_latency": elapsed_s,
        **(sample.verification or {}),
    }


def _top(values, k: int) -> list[list[Any]] | None:
    """The client's ``k`` top logprobs per token (an engine may record more for verification)."""
    return None if values is None else [[[lp, tok] for lp, tok in per_token[:k]] for per_token in values]


def _client_topk(rollout: Rollout) -> int:
    return rollout.requests[0].top_logprobs


def rollout_event(rollout: Rollout, sample: SampleResult, chunk: GenerationChunk, text_delta: str | None,
                  elapsed_s: float) -> dict[str, Any]:
    """One streamed event: the new tokens of one sample; the sample's last event has ``done`` and ``meta``."""
    event: dict[str, Any] = {"index": sample.index, "rid": sample.rid, "token_ids": list(chunk.token_ids),
                             "logprobs": list(chunk.logprobs), "kv_budget_tokens": list(chunk.kv_budget_tokens)}
    if text_delta is not None:
        event["text"] = text_delta
    if chunk.top_logprobs is not None and _client_topk(rollout):
        event["top_logprobs"] = _top(chunk.top_logprobs, _client_topk(rollout))
    if chunk.selected_pages is not None:
        event["selected_pages"] = _jsonable(chunk.selected_pages)
    event["done"] = chunk.finish is not None
    if chunk.finish is not None:
        event["meta"] = rollout_meta(rollout, sample, elapsed_s)
        event.update(_error_of(sample))
    return event


def _error_of(sample: SampleResult) -> dict[str, Any]:
    """``{"error": {...}}`` for a sample the engine ended with an error, else nothing."""
    if sample.finish is None or sample.finish.type != "error":
        return {}
    return {"error": {"type": "engine_error", "message": sample.finish.message or "engine error"}}


def rollout_result(rollout: Rollout, sample: SampleResult, elapsed_s: float, with_top: bool,
                   with_text: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"index": sample.index, "rid": sample.rid, "token_ids": sample.token_ids,
                           "logprobs": sample.logprobs, "kv_budget_tokens": sample.kv_budget_tokens}
    if with_text:
        out["text"] = sample.text
    if with_top:
        out["top_logprobs"] = _top(sample.top_logprobs, _client_topk(rollout))
    if rollout.requests[0].return_selected_pages:
        out["selected_pages"] = _jsonable(sample.selected_pages)
    out["done"] = True
    out["meta"] = rollout_meta(rollout, sample, elapsed_s)
    out.update(_error_of(sample))
    return out


def generate_response(rollout: Rollout, sample: SampleResult, elapsed_s: float, item: GenerateItem,
                      with_text: bool, token_text: Callable[[int], str] | None = None,
                      index: int | None = None, text: str | None = None) -> dict[str, Any]:
    """SGLang's ``/generate`` response (cumulative: everything generated so far; ``text`` replaces
    the sample's text, e.g. with its matched stop trimmed). ``token_text``
    (``return_text_in_logprobs``) fills the third entry of each logprob triple; ``index`` tags a
    sample of a batch or of ``n`` (item-major, as SGLang orders them)."""
    meta: dict[str, Any] = {
        "id": sample.rid,
        "finish_reason": sample.finish.to_dict() if sample.finish else None,
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": len(sample.token_ids),
        "cached_tokens": 0,
        "weight_version": sample.weight_version,
        "e2e_latency": elapsed_s,
        "sparrow": {"schedule": rollout.schedule.name, "schedule_id": rollout.schedule.id, "adapter": sample.adapter,
                    "kv_budget_tokens_mean": sample.kv_budget_tokens_mean},
    }
    if item.return_logprob:
        meta.update(_generate_logprobs(rollout, sample, item, token_text))
    out: dict[str, Any] = {"output_ids": list(sample.token_ids), "meta_info": meta}
    if index is not None:
        out["index"] = index
    if with_text:
        out = {"text": sample.text if text is None else text, **out}
    return out


def _generate_logprobs(rollout: Rollout, sample: SampleResult, item: GenerateItem,
                       token_text: Callable[[int], str] | None) -> dict[str, Any]:
    def triple(lp: float | None, tok: int) -> list[Any]:
        return [lp, tok, token_text(tok) if token_text else None]

    def top_rows(rows: list[Any]) -> list[Any]:
        return [None if row is None else [triple(lp, tok) for lp, tok in row[:item.top_logprobs_num]] for row in rows]

    prompt = rollout.requests[0].input_ids[item.logprob_start_len or 0:] if sample.prompt_logprobs is not None else ()
    meta: dict[str, Any] = {
        "input_token_logprobs": [triple(lp, tok) for lp, tok in zip(sample.prompt_logprobs or (), prompt)],
        "output_token_logprobs": [triple(lp, tok) for lp, tok in zip(sample.logprobs, sample.token_ids)],
        "output_token_logprobs_length": len(sample.token_ids),
    }
    if item.top_logprobs_num:
        meta["input_top_logprobs"] = top_rows(sample.prompt_top_logprobs or [])
        meta["output_top_logprobs"] = top_rows(sample.top_logprobs)
    return meta


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
