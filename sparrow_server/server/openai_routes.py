"""OpenAI-compatible routes on the Sparrow service: ``GET /v1/models`` (and ``/v1/models/{id}``),
``POST /v1/completions`` and ``POST /v1/chat/completions``, streamed (SSE, OpenAI's delta chunks,
``stream_options.include_usage``) or not, with OpenAI's logprobs shapes. Requests run through the
same service as ``/generate`` (admission, limits, schedules, adapters, metrics); each response
carries ``sparrow`` = {schedule, schedule_id, adapter, kv_budget_tokens_mean, weight_version} per
choice. Bodies and naming: ``openai_models``.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from sparrow_server.engine.base import InvalidRequestError, UnknownAdapterError
from sparrow_server.engine.chat_template import chat_template_ids
from sparrow_server.server import formats
from sparrow_server.server.admission import GuardedStreamingResponse, admission_of, guarded_call, guarded_stream
from sparrow_server.server.handling import CLIENT_CLOSED, SSE, admit, unless_disconnected
from sparrow_server.server.openai_models import ChatCompletionIn, CompletionIn
from sparrow_server.server.security import require_rollout_auth
from sparrow_server.server.limits import LimitExceededError
from sparrow_server.server.service import Rollout, RolloutService, SampleResult, merge

FINISH = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}
SAMPLING_PREFIX = "sampling_params."
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}  # /generate name -> OpenAI's


def install_openai_routes(app: FastAPI, service: RolloutService) -> None:
    auth = [Depends(require_rollout_auth)]

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(service, name) for name in _model_ids(service)]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str):
        if model not in _model_ids(service):
            raise UnknownAdapterError(model.split(":", 1)[-1], service.engine.adapters())
        return _model_card(service, model)

    @app.post("/v1/completions", dependencies=auth)
    async def completions(body: CompletionIn, request: Request):
        body.check()
        prompts = body.prompts()
        if len(prompts) > request.app.state.limits.max_generate_batch:
            raise LimitExceededError("prompt", len(prompts), request.app.state.limits.max_generate_batch,
                                     "max_generate_batch")
        shapes = []
        for i, (input_ids, text) in enumerate(prompts):  # all validated before any runs
            rid = body.rid if len(prompts) == 1 or body.rid is None else f"{body.rid}_{i}"
            ro = _prepare(service, "completions", service.encode(input_ids, text), body, body.max_tokens,
                          body.logprobs or 0, rid)
            shapes.append(_Shaper(service, body, ro, chat=False, logprobs=body.logprobs is not None,
                                  offset=i * body.n))
        return await _respond(request, service, body, shapes)

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(body: ChatCompletionIn, request: Request):
        body.check()
        ids = _chat_ids(service, body)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        ro = _prepare(service, "chat", ids, body, body.max_new_tokens(), top, body.rid)
        return await _respond(request, service, body, [_Shaper(service, body, ro, chat=True, logprobs=body.logprobs)])


def _model_ids(service: RolloutService) -> list[str]:
    base = service.engine.info().model_name
    return [base, *(f"{base}:{name}" for name in service.engine.adapters())]


def _model_card(service: RolloutService, model_id: str) -> dict[str, Any]:
    info = service.engine.info()
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "sparrow-server",
            "root": info.model_name, "max_model_len": info.context_length}


def _chat_ids(service: RolloutService, body: ChatCompletionIn) -> tuple[int, ...]:
    if service.tokenizer is None:
        raise InvalidRequestError("messages", "<chat>", "this server's model has no tokenizer (chat needs one)")
    return tuple(chat_template_ids(service.tokenizer, body.conversation(), body.chat_template_kwargs))


def _prepare(service: RolloutService, endpoint: str, ids: tuple[int, ...], body, max_new_tokens: int | None,
             top_logprobs: int, rid: str | None) -> Rollout:
    try:
        return service.prepare(endpoint, ids, body.sampling(max_new_tokens), body.schedule_name(), body.adapter(),
                               top_logprobs, body.n, rid)
    except InvalidRequestError as exc:  # name the field as this body spells it
        if not exc.field.startswith(SAMPLING_PREFIX):
            raise
        name = exc.field[len(SAMPLING_PREFIX):]
        head = name.split(".")[0].split("[")[0]
        raise InvalidRequestError(OPENAI_NAMES.get(head, head) + name[len(head):], exc.value, exc.reason) from None


async def _respond(request: Request, service: RolloutService, body, shapes: list["_Shaper"]):
    """Run every prompt's rollout together; one response (or stream) with their choices in order."""
    slot = await admit(request, *(shape.ro for shape in shapes))
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage

        async def events() -> AsyncIterator[bytes]:
            last: dict[tuple[int, int], SampleResult] = {}
            for shape in shapes:
                for head in shape.stream_heads():
                    yield formats.sse(head)
            async for i, (sample, _, _) in merge([service.stream(shape.ro) for shape in shapes]):
                last[i, sample.index] = sample
                chunk = shapes[i].chunk(sample)
                if chunk is not None:
                    yield formats.sse(chunk)
            if include_usage:
                yield formats.sse(shapes[0].usage_chunk(_by_prompt(last, len(shapes))))
            yield formats.SSE_DONE

        def error_event(error: dict[str, Any]) -> bytes:
            return formats.sse({"error": error}) + formats.SSE_DONE

        return GuardedStreamingResponse(guarded_stream(admission_of(request), slot, events(), error_event),
                                        media_type=SSE)
    async def collect_all() -> list[list[SampleResult]]:
        return list(await asyncio.gather(*(service.collect(shape.ro) for shape in shapes)))

    results = await guarded_call(admission_of(request), slot, unless_disconnected(collect_all(), request))
    if results is None:
        return Response(status_code=CLIENT_CLOSED)
    choices = [choice for shape, samples in zip(shapes, results) for choice in shape.choices(samples)]
    return {**shapes[0].head(), "choices": choices, "usage": shapes[0].usage(results)}


def _by_prompt(last: dict[tuple[int, int], SampleResult], prompts: int) -> list[list[SampleResult]]:
    return [[s for (i, _), s in sorted(last.items()) if i == p] for p in range(prompts)]


class _Shaper:
    """OpenAI's JSON for one request: the whole response, or stream chunks with text deltas."""

    def __init__(self, service: RolloutService, body, ro: Rollout, chat: bool, logprobs: bool, offset: int = 0):
        self.service, self.body, self.ro, self.chat, self.logprobs = service, body, ro, chat, logprobs
        self.offset = offset  # choice index of this prompt's first sample (prompt-major, as SGLang)
        self.id = ("chatcmpl-" if chat else "cmpl-") + ro.rid
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.sent_text: dict[int, str] = {}
        self.sent_tokens: dict[int, int] = {}
        self.decode: Callable[[int], str] = self._token_text()

    def _token_text(self) -> Callable[[int], str]:
        tokenizer = self.service.tokenizer
        if tokenizer is None:
            return lambda token: ""
        return lambda token: tokenizer.decode([token], skip_special_tokens=False)

    def _text(self, sample: SampleResult) -> str:
        if sample.finish is None:
            return sample.text
        return self.service.final_text(sample, self.ro.skip_special_tokens, bool(self.body.no_stop_trim))

    def head(self, object_suffix: str = "") -> dict[str, Any]:
        return {"id": self.id, "object": self.object + object_suffix, "created": self.created, "model": self.body.model}

    def _sparrow(self, sample: SampleResult) -> dict[str, Any]:
        return {"schedule": self.ro.schedule.name, "schedule_id": self.ro.schedule.id, "adapter": sample.adapter,
                "kv_budget_tokens_mean": sample.kv_budget_tokens_mean, "weight_version": sample.weight_version}

    def _finish(self, sample: SampleResult) -> str | None:
        return FINISH.get(sample.finish.type, "stop") if sample.finish is not None else None

    @staticmethod
    def usage(per_prompt: list[list[SampleResult]]) -> dict[str, int]:
        """OpenAI's usage: each prompt counted once, every sample's completion."""
        prompt = sum(samples[0].prompt_tokens for samples in per_prompt if samples)
        completion = sum(len(s.token_ids) for samples in per_prompt for s in samples)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _logprobs(self, sample: SampleResult, start: int, end: int) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        tokens = sample.token_ids[start:end]
        lps = sample.logprobs[start:end]
        tops = sample.top_logprobs[start:end] if sample.top_logprobs else [()] * len(tokens)
        k = self.ro.requests[0].top_logprobs
        if self.chat:
            return {"content": [{"token": self.decode(t), "logprob": lp, "bytes": list(self.decode(t).encode()),
                                 "top_logprobs": [{"token": self.decode(tt), "logprob": tl,
                                                   "bytes": list(self.decode(tt).encode())} for tl, tt in top[:k]]}
                                for t, lp, top in zip(tokens, lps, tops)]}
        texts = [self.decode(t) for t in tokens]
        offsets, pos = [], len(self.sent_text.get(sample.index, "")) if start else 0
        for text in texts:
            offsets.append(pos)
            pos += len(text)
        return {"tokens": texts, "token_logprobs": lps, "text_offset": offsets,
                "top_logprobs": [{self.decode(tt): tl for tl, tt in top[:k]} for top in tops] if k else None}

    def _choice(self, sample: SampleResult, text: str, start: int, end: int, delta: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": self.offset + sample.index, "logprobs": self._logprobs(sample, start, end),
                                  "finish_reason": self._finish(sample), "sparrow": self._sparrow(sample)}
        if sample.finish is not None and sample.finish.type == "stop":
            choice["matched_stop"] = sample.finish.matched
        if not self.chat:
            choice["text"] = text
        elif not delta:
            choice["message"] = {"role": "assistant", "content": text}
        else:  # the role went in the stream's head; a last chunk without new text has an empty delta
            choice["delta"] = {"content": text} if text or sample.finish is None else {}
        return choice

    def choices(self, samples: list[SampleResult]) -> list[dict[str, Any]]:
        return [self._choice(s, self._text(s), 0, len(s.token_ids), delta=False) for s in samples]

    def stream_heads(self) -> list[dict[str, Any]]:
        """Chat streams open each choice with the assistant role (as OpenAI's and SGLang's do)."""
        if not self.chat:
            return []
        return [{**self.head(".chunk"), "choices": [{"index": self.offset + i, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]}
                for i in range(len(self.ro.requests))]

    def chunk(self, sample: SampleResult) -> dict[str, Any] | None:
        text = self._text(sample)
        sent = self.sent_text.get(sample.index, "")
        delta = text[len(sent):] if text.startswith(sent) else ""
        start, end = self.sent_tokens.get(sample.index, 0), len(sample.token_ids)
        if not delta and sample.finish is None and start == end:
            return None
        choice = self._choice(sample, delta, start, end, delta=True)
        self.sent_text[sample.index] = sent + delta
        self.sent_tokens[sample.index] = end
        return {**self.head(".chunk" if self.chat else ""), "choices": [choice]}

    def usage_chunk(self, per_prompt: list[list[SampleResult]]) -> dict[str, Any]:
        return {**self.head(".chunk" if self.chat else ""), "choices": [], "usage": self.usage(per_prompt)}
