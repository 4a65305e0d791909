"""``SGLangEngine``: the service's ``Engine`` over an in-process ``sglang.Engine`` with the sparrow
backend (``sparrow-server serve --engine sglang --model PATH``).

SGLang runs its scheduler in spawned processes; this object lives in the service's event loop and
talks to SGLang's tokenizer manager through ``async_generate(stream=True)``. Each request's
schedule travels as JSON text in ``sampling_params.custom_params.sparrow_schedule_json`` (so
schedules registered at run time reach the scheduler), and the plug-in's side table applies it.
Extra SGLang ``ServerArgs`` come from ``SPARROW_SGLANG_ARGS`` (a JSON object), e.g.
``{"mem_fraction_static": 0.85, "cuda_graph_max_bs": 32}``.

Status: the translation logic is tested on CPU with a fake SGLang engine; this class has not been
run on a GPU yet (the backend itself is, through SGLang's own HTTP server: see docs/gpu-serving.md).
"""
from __future__ import annotations

import json
import os
from typing import Any, AsyncIterator

from sparrow_server.engine.base import (
    ContextLengthError, Engine, EngineHealth, EngineInfo, FinishReason, GenerationChunk, GenerationRequest,
    UnknownAdapterError,
)
from sparrow_server.sglang_plugin.config import BACKEND_NAME, CUSTOM_PARAM_SCHEDULE_JSON
from sparrow_server.sparsity.schedule import dump_schedule

ENV_SGLANG_ARGS = "SPARROW_SGLANG_ARGS"
PAGE_SIZE = 16


def sglang_server_kwargs(model: str, adapters=(), max_batch_size: int | None = None,
                         environ: dict | None = None) -> dict[str, Any]:
    """``sglang.Engine`` keyword arguments: the sparrow backend, page 16, plus ``SPARROW_SGLANG_ARGS``."""
    env = os.environ if environ is None else environ
    kwargs: dict[str, Any] = {"model_path": model, "attention_backend": BACKEND_NAME, "page_size": PAGE_SIZE,
                              "skip_tokenizer_init": True}
    if adapters:
        kwargs["lora_paths"] = [f"{name}={path}" for name, path in adapters]
    if max_batch_size:
        kwargs["max_running_requests"] = max_batch_size
    text = env.get(ENV_SGLANG_ARGS)
    if text:
        extra = json.loads(text)
        if not isinstance(extra, dict):
            raise ValueError(f"{ENV_SGLANG_ARGS}={text!r}: must be a JSON object of ServerArgs fields")
        kwargs.update(extra)
    if kwargs["page_size"] != PAGE_SIZE:
        raise ValueError(f"{ENV_SGLANG_ARGS} page_size={kwargs['page_size']}: the sparrow backend needs {PAGE_SIZE}")
    return kwargs


def sampling_dict(request: GenerationRequest) -> dict[str, Any]:
    """SGLang ``sampling_params`` of a request, the schedule included."""
    s = request.sampling
    out: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                           "top_k": s.top_k, "min_p": s.min_p, "ignore_eos": s.ignore_eos}
    if s.seed is not None:
        out["sampling_seed"] = s.seed
    if s.stop_token_ids:
        out["stop_token_ids"] = list(s.stop_token_ids)
    if request.schedule is not None:
        out["custom_params"] = {CUSTOM_PARAM_SCHEDULE_JSON: dump_schedule(request.schedule)}
    return out


def finish_reason(meta: dict[str, Any]) -> FinishReason | None:
    fr = meta.get("finish_reason")
    if not fr:
        return None
    return FinishReason(type=fr.get("type", "stop"), matched=fr.get("matched"), length=fr.get("length"),
                        message=fr.get("message"))


class StreamState:
    """Turns SGLang stream outputs (cumulative or incremental) into ``GenerationChunk`` deltas."""

    def __init__(self, request: GenerationRequest):
        self.request = request
        self.sent = 0

    def chunk(self, out: dict[str, Any]) -> GenerationChunk:
        meta = out.get("meta_info", {})
        total = int(meta.get("completion_tokens", 0))
        ids = list(out.get("output_ids") or [])
        lps = list(meta.get("output_token_logprobs") or [])
        tops = meta.get("output_top_logprobs")
        cumulative = len(ids) == total and total >= self.sent
        new_ids = ids[self.sent:] if cumulative else ids
        n = len(new_ids)
        new_lps = lps[len(lps) - n:] if n else []
        new_tops = None
        if self.request.top_logprobs and tops is not None:
            new_tops = tuple(tuple((float(t[0]), int(t[1])) for t in (row or ())) for row in tops[len(tops) - n:]) if n else ()
        self.sent += n
        return GenerationChunk(
            rid=self.request.rid, token_ids=tuple(int(t) for t in new_ids),
            logprobs=tuple(float(x[0]) for x in new_lps), prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=self.sent, top_logprobs=new_tops, finish=finish_reason(meta),
            adapter=self.request.adapter, weight_version=str(meta.get("weight_version", "default")),
        )


class SGLangEngine(Engine):
    """The service's engine over ``sglang.Engine`` (see the module docstring)."""

    def __init__(self, sgl_engine: Any, model_name: str, context_length: int, vocab_size: int,
                 eos_token_ids: tuple[int, ...] = (), adapters: tuple[str, ...] = ()):
        self._sgl = sgl_engine
        self._model_name = model_name
        self._context_length = context_length
        self._vocab_size = vocab_size
        self._eos = eos_token_ids
        self._adapters = adapters
        self._live: set[str] = set()

    async def start(self) -> None:  # SGLang started its processes in its constructor
        return None

    async def shutdown(self) -> None:
        for rid in list(self._live):
            await self.abort(rid)
        self._sgl.shutdown()

    def validate(self, request: GenerationRequest) -> None:
        need = len(request.input_ids) + request.sampling.max_new_tokens
        if need > self._context_length:
            raise ContextLengthError(len(request.input_ids), request.sampling.max_new_tokens, self._context_length)
        self.resolve_adapter(request.adapter)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.validate(request)
        self._live.add(request.rid)
        state = StreamState(request)
        finished = False
        try:
            stream = await self._sgl.async_generate(
                input_ids=list(request.input_ids), sampling_params=sampling_dict(request), return_logprob=True,
                top_logprobs_num=request.top_logprobs or None, lora_path=request.adapter, stream=True,
                rid=request.rid)
            async for out in stream:
                chunk = state.chunk(out)
                finished = chunk.done
                yield chunk
                if finished:
                    break
        finally:
            self._live.discard(request.rid)
            if not finished:
                self._sgl.tokenizer_manager.abort_request(rid=request.rid)

    async def abort(self, rid: str) -> bool:
        if rid not in self._live:
            return False
        self._sgl.tokenizer_manager.abort_request(rid=rid)
        return True

    def live_requests(self) -> tuple[str, ...]:
        return tuple(sorted(self._live))

    def health(self) -> EngineHealth:
        return EngineHealth(ok=True, live_requests=len(self._live), queued_requests=0)

    def info(self) -> EngineInfo:
        return EngineInfo(engine="sglang", model_name=self._model_name, vocab_size=self._vocab_size,
                          context_length=self._context_length, weight_version="default", page_size=PAGE_SIZE,
                          eos_token_ids=self._eos, device="cuda")

    def adapters(self) -> tuple[str, ...]:
        return self._adapters

    def resolve_adapter(self, name: str | None) -> str | None:
        if name is None or name in self._adapters:
            return name
        raise UnknownAdapterError(name, self._adapters)


def build_sglang_engine(options):
    """``EngineOptions`` -> ``BuiltEngine`` (the entry in ``engine.factory.ENGINE_FACTORIES``)."""
    import sglang
    from sglang.srt.plugins import load_plugins

    from sparrow_server.engine.factory import BuiltEngine

    if not options.model:
        raise ValueError("--engine sglang needs --model PATH (a Hugging Face model directory)")
    load_plugins()  # registers the sparrow backend in this process before ServerArgs validation
    sgl = sglang.Engine(**sglang_server_kwargs(options.model, options.adapters, options.max_batch_size))
    cfg = sgl.tokenizer_manager.model_config
    eos = getattr(cfg.hf_config, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    tokenizer = None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(options.model)
    except Exception:  # token-id-only serving (e.g. dummy weights without a tokenizer)
        tokenizer = None
    engine = SGLangEngine(sgl, model_name=os.path.basename(os.path.normpath(options.model)),
                          context_length=int(cfg.context_len), vocab_size=int(cfg.vocab_size),
                          eos_token_ids=eos_ids, adapters=tuple(name for name, _ in options.adapters))
    return BuiltEngine(engine=engine, tokenizer=tokenizer, model_name=engine.info().model_name)
