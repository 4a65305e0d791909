"""``SGLangEngine``: the service's ``Engine`` over SGLang's tokenizer manager, inside SGLang's own
HTTP server (``sparrow-server serve --engine sglang``; see ``sglang_plugin.frontend.host``).

The engine talks to SGLang through a small ``runtime`` (``sglang_plugin.frontend.runtime``): stream a
``GenerateReqInput``, abort, load/unload a LoRA adapter, prefill-score densely. Each request's
schedule travels as JSON text in ``sampling_params.custom_params.sparrow_schedule_json`` (so
schedules registered at run time reach the scheduler), and the plug-in's side table applies it.

Per token, ``kv_budget_tokens`` is what the backend's planner attends at that length
(``schedule.kv_budget_tokens``, the function the backend's planner and the reference engine
report, with the backend's top-k cap): token 0 comes from the dense prefill (``None``). Adapters map onto SGLang's LoRA pool
under their immutable versioned names (``/load_lora_adapter`` semantics; the adapter manager
drains before unloading).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from sparrow_server.engine.base import (
    DEFAULT_WEIGHT_VERSION, ContextLengthError, Engine, EngineHealth, EngineInfo, FinishReason, GenerationChunk, GenerationRequest,
    UnknownAdapterError,
)
from sparrow_server.engine.ports import AdapterPort, DenseScoring, LoadedAdapter
from sparrow_server.sglang_plugin.config import PAGE_SIZE, PROMPT_LOGPROBS_OFF, PluginConfig
from sparrow_server.sparsity import wire
from sparrow_server.sparsity.schedule import Schedule, kv_budget_tokens
from sparrow_server.stats import exact_wire



@dataclass(frozen=True)
class ModelFacts:
    """What the engine needs to know of the served model (read from SGLang once it is up)."""

    name: str
    context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()


class SGLangRuntime(Protocol):
    """The SGLang calls the engine makes (``runtime.TokenizerManagerRuntime``; a fake in CPU tests)."""

    def stream(self, **generate_kwargs: Any) -> AsyncIterator[dict[str, Any]]: ...
    def abort(self, rid: str) -> None: ...
    async def load_lora(self, name: str, path: str) -> None: ...
    async def unload_lora(self, name: str) -> None: ...
    def model_facts(self) -> ModelFacts: ...


def sampling_dict(request: GenerationRequest) -> dict[str, Any]:
    """SGLang ``sampling_params`` of a request, the schedule included."""
    s = request.sampling
    out: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                           "top_k": s.top_k, "min_p": s.min_p, "ignore_eos": s.ignore_eos}
    if s.seed is not None:
        out["sampling_seed"] = s.seed
    if s.stop_token_ids:
        out["stop_token_ids"] = list(s.stop_token_ids)
    custom: dict[str, Any] = {}
    if request.schedule is not None:
        custom.update(wire.encode_schedule(request.schedule))
    if request.exact_keep is not None:
        custom.update(exact_wire.encode_keep(request.exact_keep))
    if custom:
        out["custom_params"] = custom
    return out


def top_logprobs_num(request: GenerationRequest) -> int:
    """Top logprobs to ask SGLang for: what the client wants, or the verifier's recording if larger."""
    return max(request.top_logprobs, request.record_topk)


def finish_reason(meta: dict[str, Any]) -> FinishReason | None:
    fr = meta.get("finish_reason")
    if not fr:
        return None
    return FinishReason(type=fr.get("type", "stop"), matched=fr.get("matched"), length=fr.get("length"),
                        message=fr.get("message"))


class BudgetPlan:
    """Per-token KV budget of one request, from the backend's planning function."""

    def __init__(self, schedule: Schedule | None, prompt_len: int, topk_cap_pages: int):
        self.schedule, self.prompt_len, self.cap = schedule, prompt_len, topk_cap_pages

    def tokens(self, start: int, n: int) -> tuple[int | None, ...]:
        """Budgets of completion tokens ``start .. start + n - 1`` (token 0: the dense prefill)."""
        if self.schedule is None:
            return ()
        return tuple(None if j == 0 else kv_budget_tokens(self.schedule, self.prompt_len + j, self.prompt_len, self.cap)
                     for j in range(start, start + n))


class StreamState:
    """Turns SGLang stream outputs (cumulative or incremental) into ``GenerationChunk`` deltas."""

    def __init__(self, request: GenerationRequest, budgets: BudgetPlan | None = None):
        self.request = request
        self.budgets = budgets
        self.sent = 0
        self.prompt_sent = request.logprob_start_len is None  # prompt logprobs go out once, when first seen

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
        if top_logprobs_num(self.request) and tops is not None:
            new_tops = tuple(tuple((float(t[0]), int(t[1])) for t in (row or ())) for row in tops[len(tops) - n:]) if n else ()
        budgets = self.budgets.tokens(self.sent, n) if self.budgets is not None else ()
        self.sent += n
        return GenerationChunk(
            rid=self.request.rid, token_ids=tuple(int(t) for t in new_ids),
            logprobs=tuple(float(x[0]) for x in new_lps), prompt_tokens=int(meta.get("prompt_tokens", 0)),
            completion_tokens=self.sent, top_logprobs=new_tops, kv_budget_tokens=budgets, finish=finish_reason(meta),
            adapter=self.request.adapter, weight_version=str(meta.get("weight_version", DEFAULT_WEIGHT_VERSION)),
            **self._prompt_fields(meta),
        )

    def _prompt_fields(self, meta: dict[str, Any]) -> dict[str, Any]:
        if self.prompt_sent or "input_token_logprobs" not in meta:
            return {}
        self.prompt_sent = True
        tops = None
        if self.request.top_logprobs:
            tops = tuple(None if row is None else tuple((float(t[0]), int(t[1])) for t in row[:self.request.top_logprobs])
                         for row in meta.get("input_top_logprobs") or ())
        values = tuple(None if row[0] is None else float(row[0]) for row in meta["input_token_logprobs"])
        return {"prompt_logprobs": values, "prompt_top_logprobs": tops}


class SGLangEngine(Engine):
    """The service's engine over an SGLang runtime (see the module docstring)."""

    default_schedule_fixed_at_start = True  # the schedulers read it from their environment, once

    def __init__(self, runtime: SGLangRuntime, adapters: tuple[tuple[str, str], ...] = (),
                 config: PluginConfig | None = None):
        self._runtime = runtime
        self.lora_paths: dict[str, str] = dict(adapters)  # (name, path) loaded by SGLang at start, then ours
        self._live: set[str] = set()
        self._facts: ModelFacts | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._weight_version = DEFAULT_WEIGHT_VERSION  # the newest SGLang reported in a request's meta_info
        cfg = config or PluginConfig.from_env()
        self.topk_cap_pages = cfg.topk_cap_pages
        self.exact_stride = cfg.exact_stride  # exact acceptance every s-th position of verified requests (0: off)
        # Layers every request runs dense (the stock path). Any schedule runs: a request's extra dense layers
        # are honoured (dense by budget, scheduler.layer_groups); one with fewer runs these dense too.
        self.dense_layers = cfg.server_dense_layers()

    @property
    def facts(self) -> ModelFacts:
        if self._facts is None:
            self._facts = self._runtime.model_facts()
        return self._facts

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop SGLang's tokenizer manager runs on (set by ``start``)."""
        return self._loop

    async def start(self) -> None:  # SGLang started its processes before the HTTP app
        self._loop = asyncio.get_running_loop()

    async def shutdown(self) -> None:
        for rid in list(self._live):
            await self.abort(rid)

    def validate(self, request: GenerationRequest) -> None:
        need = len(request.input_ids) + request.sampling.max_new_tokens
        if need > self.facts.context_length:
            raise ContextLengthError(len(request.input_ids), request.sampling.max_new_tokens, self.facts.context_length)
        if request.schedule is not None:
            self.check_schedule(request.schedule)
        self.resolve_adapter(request.adapter)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.validate(request)
        self._live.add(request.rid)
        state = StreamState(request, BudgetPlan(request.schedule, len(request.input_ids), self.topk_cap_pages))
        finished = False
        try:
            stream = self._runtime.stream(
                input_ids=list(request.input_ids), sampling_params=sampling_dict(request), return_logprob=True,
                top_logprobs_num=top_logprobs_num(request) or None, lora_path=request.adapter, stream=True,
                rid=request.rid, logprob_start_len=PROMPT_LOGPROBS_OFF if request.logprob_start_len is None
                else request.logprob_start_len)
            async for out in stream:
                chunk = state.chunk(out)
                self._weight_version = chunk.weight_version
                finished = chunk.done
                yield chunk
                if finished:
                    break
        finally:
            self._live.discard(request.rid)
            if not finished:
                self._runtime.abort(request.rid)

    async def abort(self, rid: str) -> bool:
        if rid not in self._live:
            return False
        self._runtime.abort(rid)
        return True

    def live_requests(self) -> tuple[str, ...]:
        return tuple(sorted(self._live))

    def health(self) -> EngineHealth:
        return EngineHealth(ok=True, live_requests=len(self._live), queued_requests=0)

    def info(self) -> EngineInfo:
        f = self.facts
        return EngineInfo(engine="sglang", model_name=f.name, vocab_size=f.vocab_size, context_length=f.context_length,
                          weight_version=self._weight_version, page_size=PAGE_SIZE, eos_token_ids=f.eos_token_ids, device="cuda")

    # ----- adapters: SGLang's LoRA pool, under immutable versioned names --------------------
    def adapters(self) -> tuple[str, ...]:
        return tuple(sorted(self.lora_paths))

    def resolve_adapter(self, name: str | None) -> str | None:
        if name is None or name in self.lora_paths:
            return name
        raise UnknownAdapterError(name, self.adapters())

    def adapter_port(self) -> AdapterPort:
        return self

    def loaded_adapters(self) -> tuple[LoadedAdapter, ...]:
        return tuple(LoadedAdapter(n, p) for n, p in sorted(self.lora_paths.items()))

    def load_adapter(self, name: str, path: str) -> None:
        """Called off the event loop (the adapter manager runs it in a worker thread)."""
        self._on_loop(self._runtime.load_lora(name, path))
        self.lora_paths[name] = path

    def unload_adapter(self, name: str) -> None:
        """Called off the event loop, once the manager has drained the version's requests."""
        self.lora_paths.pop(name, None)
        self._on_loop(self._runtime.unload_lora(name))

    def _on_loop(self, coro) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the SGLang engine has not started (no event loop yet)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def dense_scoring(self) -> DenseScoring:
        """Dense verification by a dense, adapter-free prefill on this server: exact on the kept positions, which
        records nothing per token, or (exact stride 0) the top-k bound, which records the sparse top-k."""
        from sparrow_server.sglang_plugin.frontend.verification import SGLangDenseScorer

        record_topk = 0 if self.exact_stride else SGLangDenseScorer.RECORD_TOPK
        return DenseScoring(SGLangDenseScorer(self._runtime, lambda: self._loop), record_topk, exact_stride=self.exact_stride)


def build_sglang_engine(options):
    raise ValueError("--engine sglang runs inside SGLang's HTTP server: use `sparrow-server serve --engine sglang "
                     "--model PATH [SGLang args]` (sparrow_server.sglang_plugin.frontend.host), not build_engine")


__all__ = ["SGLangEngine", "SGLangRuntime", "ModelFacts", "StreamState", "BudgetPlan", "sampling_dict",
           "top_logprobs_num"]
