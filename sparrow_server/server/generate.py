"""SGLang's ``POST /generate`` on the Sparrow service: single or batched prompts, ``n`` samples
each, streamed (SSE, cumulative chunks tagged with ``index``) or not; output and prompt logprobs
in SGLang's triples. The schedule comes from ``custom_params`` or ``extra_key``; see
``generate_models``."""
from __future__ import annotations

import bisect
import contextlib
import time
from typing import Any, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from sparrow_server.engine.base import InvalidRequestError
from sparrow_server.server import formats
from sparrow_server.server.admission import GuardedStreamingResponse, admission_of, guarded_call, guarded_stream
from sparrow_server.server.generate_models import GenerateIn, GenerateItem
from sparrow_server.server.handling import CLIENT_CLOSED, SSE, admit, unless_disconnected
from sparrow_server.server.limits import LimitExceededError
from sparrow_server.server.security import require_rollout_auth
from sparrow_server.server.service import Rollout, RolloutService, merge

Prepared = list[tuple[GenerateItem, Rollout]]


def install_generate_routes(app: FastAPI, service: RolloutService) -> None:
    async def generate(body: GenerateIn, request: Request):
        prepared = prepare_batch(service, body, request.app.state.limits.max_generate_batch)
        offsets = _offsets(prepared)
        shape = _shaper(service, body, prepared, offsets)
        slot = await admit(request, *(ro for _, ro in prepared))
        if body.stream:
            async def events() -> AsyncIterator[bytes]:
                async with contextlib.aclosing(_stream(service, prepared, offsets)) as stream:  # closed with events
                    async for k, sample in stream:
                        yield formats.sse(shape(k, sample))
                yield formats.SSE_DONE

            def error_event(error: dict[str, Any]) -> bytes:
                return formats.sse({"error": error, "done": True}) + formats.SSE_DONE

            return GuardedStreamingResponse(guarded_stream(admission_of(request), slot, events(), error_event),
                                            media_type=SSE)
        results = await guarded_call(admission_of(request), slot, unless_disconnected(_collect(service, prepared, offsets), request))
        if results is None:
            return Response(status_code=CLIENT_CLOSED)
        outputs = [shape(k, sample) for k, sample in results]
        return outputs[0] if len(outputs) == 1 and body.batch_size is None else outputs

    auth = [Depends(require_rollout_auth)]
    app.add_api_route("/generate", generate, methods=["POST"], dependencies=auth, operation_id="generate")
    # SGLang serves PUT too; one schema entry is enough
    app.add_api_route("/generate", generate, methods=["PUT"], dependencies=auth, include_in_schema=False)


def prepare_batch(service: RolloutService, body: GenerateIn, max_generate_batch: int) -> Prepared:
    """Validate every prompt before anything runs: a bad field anywhere is the whole request's 4xx."""
    if body.batch_size is not None and body.batch_size > max_generate_batch:
        raise LimitExceededError("text" if isinstance(body.text, list) else "input_ids", body.batch_size,
                                 max_generate_batch, "max_generate_batch")
    listed = body.listed_fields()
    prepared = []
    for item in body.items():
        try:
            ids = service.encode(item.input_ids, item.text)
            prepared.append((item, service.prepare(
                "generate", ids, item.sampling_params, item.schedule_name, item.lora_path, item.top_logprobs_num,
                item.sampling_params.n, item.rid, logprob_start_len=item.logprob_start_len)))
        except InvalidRequestError as exc:
            if body.batch_size is None:
                raise
            raise in_batch_item(exc, item.index, listed) from exc
    return prepared


def in_batch_item(exc: InvalidRequestError, index: int, listed: set[str]) -> InvalidRequestError:
    """The same error, naming the batch entry: ``input_ids[3]`` of prompt 2 -> ``input_ids[2][3]``."""
    head = exc.field.split(".")[0].split("[")[0]
    if head in listed:
        return InvalidRequestError(head + f"[{index}]" + exc.field[len(head):], exc.value, exc.reason)
    return InvalidRequestError(exc.field, exc.value, f"{exc.reason} (prompt {index} of the batch)")


def _shaper(service: RolloutService, body: GenerateIn, prepared: Prepared, offsets: list[int]):
    """(flat sample index, sample) -> SGLang's response object."""
    tagged = len(prepared) > 1 or len(prepared[0][1].requests) > 1
    token_text = _token_text(service) if body.return_text_in_logprobs else None
    with_text = service.tokenizer is not None

    def shape(k: int, sample) -> dict[str, Any]:
        item, ro = prepared[bisect.bisect_right(offsets, k) - 1]
        text = None
        if with_text and sample.finish is not None:
            text = service.final_text(sample, ro.skip_special_tokens, item.sampling_params.no_stop_trim)
        return formats.generate_response(ro, sample, time.monotonic() - ro.started, item, with_text, token_text,
                                         k if tagged else None, text)

    return shape


def _offsets(prepared: Prepared) -> list[int]:
    """Flat index of each prompt's first sample (prompt-major, its ``n`` samples together)."""
    out, total = [], 0
    for _, ro in prepared:
        out.append(total)
        total += len(ro.requests)
    return out


async def _stream(service: RolloutService, prepared: Prepared, offsets: list[int]) -> AsyncIterator[tuple[int, Any]]:
    """(flat sample index, accumulated sample) per chunk of any prompt's samples."""
    async with contextlib.aclosing(merge([service.stream(ro) for _, ro in prepared])) as merged:
        async for i, (sample, _, _) in merged:
            yield offsets[i] + sample.index, sample


async def _collect(service: RolloutService, prepared: Prepared, offsets: list[int]) -> list[tuple[int, Any]]:
    last: dict[int, Any] = {}
    async for k, sample in _stream(service, prepared, offsets):
        last[k] = sample
    return sorted(last.items())


def _token_text(service: RolloutService):
    if service.tokenizer is None:
        raise InvalidRequestError("return_text_in_logprobs", True, "this server's model has no tokenizer")
    return lambda token: service.tokenizer.decode([token], skip_special_tokens=False)
