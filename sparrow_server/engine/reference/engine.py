"""The reference engine: continuous batching over a paged KV cache on one background thread.

Each loop iteration processes aborts, admits waiting requests whose pages fit (reserving
``prompt + max_new_tokens`` tokens so an admitted request never runs out), prefills them one by
one (dense), then runs one decode step for every running request together. Chunks go back to
each request's asyncio queue on the caller's event loop.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import torch

from sparrow_server.engine.base import (
    DEFAULT_WEIGHT_VERSION,
    ContextLengthError,
    DuplicateRequestError,
    Engine,
    EngineHealth,
    EngineInfo,
    FinishReason,
    GenerationChunk,
    GenerationRequest,
    InvalidRequestError,
    PageSelection,
)
from sparrow_server.engine.memory import MemoryControl
from sparrow_server.engine.ports import AdapterPort, LoadedAdapter, LocalModel
from sparrow_server.engine.weights import WeightSync
from sparrow_server.engine.reference.peft_adapters import PeftAdapterSlots
from sparrow_server.engine.reference.attention import ForwardContext
from sparrow_server.engine.reference.kv_cache import PagedKVCache, PageTable
from sparrow_server.engine.reference.memory import ReferenceMemory
from sparrow_server.engine.reference.runner import ModelRunner
from sparrow_server.engine.reference.sampler import SampledToken, make_generator, prompt_logprobs, sample_token
from sparrow_server.engine.reference.weight_update import ReferenceWeightSync
from sparrow_server.sparsity.schedule import (
    DEFAULT_PAGE_SIZE, Schedule, ScheduleError, attended_pages, dense_schedule, kv_budget_tokens,
)
from sparrow_server.sparsity.wire import check_page_size

log = logging.getLogger(__name__)

DEFAULT_KV_POOL_TOKENS = 65536
DEFAULT_MAX_BATCH_SIZE = 32
ENGINE_NAME = "reference"
STOP_WINDOW_SLACK = 4  # extra tokens decoded past the longest stop string (tokens of 0 whole characters)


@dataclass
class _Sequence:
    """Mutable state of one live request; touched only by the loop thread after admission."""

    request: GenerationRequest
    schedule: Schedule
    adapter: str | None
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator
    reserved_pages: int
    table: PageTable = field(default_factory=PageTable)
    output: list[int] = field(default_factory=list)
    weight_version: str = DEFAULT_WEIGHT_VERSION
    step_pages: int = 0  # this decode step's attended pages at a sparse layer (``_plan_row``)
    step_budget: int = 0  # ... and its kv_budget_tokens

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def prompt_len(self) -> int:
        return len(self.request.input_ids)


class ReferenceEngine(Engine):
    """PyTorch + transformers engine with the core library's sparse decode semantics."""

    def __init__(self, model: Any, tokenizer: Any | None = None, model_name: str = "model",
                 kv_pool_tokens: int = DEFAULT_KV_POOL_TOKENS, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 page_size: int = DEFAULT_PAGE_SIZE, weight_version: str = DEFAULT_WEIGHT_VERSION):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_batch_size = max_batch_size
        self.weight_version = weight_version
        self.runner = ModelRunner(model)
        self.peft_adapters = PeftAdapterSlots()
        config = model.config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.context_length = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self.eos_token_ids = _eos_ids(model)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(model.parameters()).dtype
        pages = -(-kv_pool_tokens // page_size) + 1  # + the null page
        self.cache = PagedKVCache(config.num_hidden_layers, pages, page_size, config.num_key_value_heads,
                                  head_dim, dtype, self.runner.device)
        self._cond = threading.Condition()
        self._step_lock = threading.Lock()  # held during each step; model changes take it too
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._running: list[_Sequence] = []
        self._live: dict[str, _Sequence] = {}
        self._abort_rids: set[str] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0
        self.weight_sync = ReferenceWeightSync(self)  # weight updates, pause/continue; gates the loop
        self.memory = ReferenceMemory(self)  # flush, release/resume of the KV pool, weights checker

    # ----- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self.start_thread()

    def start_thread(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="sparrow-reference-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        with self._cond:
            self._abort_rids.update(self._live)
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None

    def adapter_port(self) -> AdapterPort:
        return self

    def weights(self) -> WeightSync:
        return self.weight_sync

    def memory_control(self) -> MemoryControl:
        return self.memory

    def local_model(self) -> LocalModel:
        return LocalModel(lambda: self.runner.model, self._step_lock)

    def max_running_requests(self) -> int:
        return self.max_batch_size

    def loaded_adapters(self) -> tuple[LoadedAdapter, ...]:
        return self.peft_adapters.loaded()

    def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA directory as adapter ``name`` (between steps)."""
        with self._step_lock:
            self.runner.model = self.peft_adapters.attach(self.runner.model, name, path)

    def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name`` (between steps). The caller ensures no request still uses it."""
        with self._step_lock:
            self.runner.model = self.peft_adapters.detach(self.runner.model, name)

    # ----- interface ---------------------------------------------------------------------
    def adapters(self) -> tuple[str, ...]:
        return self.peft_adapters.names()

    def resolve_adapter(self, name: str | None) -> str | None:
        return self.peft_adapters.resolve(name)

    def info(self) -> EngineInfo:
        return EngineInfo(
            engine=ENGINE_NAME, model_name=self.model_name, vocab_size=self.vocab_size,
            context_length=self.context_length, weight_version=self.weight_version,
            page_size=self.cache.page_size, eos_token_ids=self.eos_token_ids, device=str(self.runner.device),
        )

    def health(self) -> EngineHealth:
        with self._cond:
            queued, live = len(self._waiting), len(self._live)
        alive = self._thread is not None and self._thread.is_alive()
        return EngineHealth(ok=alive, live_requests=live, queued_requests=queued, free_pages=self.cache.free_pages,
                            total_pages=self.cache.usable_pages, detail="" if alive else "engine loop not running")

    def live_requests(self) -> tuple[str, ...]:
        with self._cond:
            return tuple(self._live)

    def validate(self, request: GenerationRequest) -> None:
        for i, t in enumerate(request.input_ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise InvalidRequestError(f"input_ids[{i}]", t, f"outside the vocabulary [0, {self.vocab_size})")
        prompt, new = len(request.input_ids), request.sampling.max_new_tokens
        if prompt + new > self.context_length:
            raise ContextLengthError(prompt, new, self.context_length)
        if self.cache.pages_for(prompt + new) > self.cache.usable_pages:
            raise ContextLengthError(prompt, new, self.cache.usable_pages * self.cache.page_size, "KV pool capacity")
        schedule = request.schedule or dense_schedule()
        try:
            check_page_size(schedule, self.cache.page_size)
        except ScheduleError as exc:  # a field of this request
            raise InvalidRequestError("schedule.page_size", exc.value, exc.reason) from None
        if request.sampling.stop and self.tokenizer is None:
            raise InvalidRequestError("sampling_params.stop", list(request.sampling.stop),
                                      "stop strings need a tokenizer; this model has none (use stop_token_ids)")
        for token, _ in request.sampling.logit_bias:
            if token >= self.vocab_size:
                raise InvalidRequestError(f"sampling_params.logit_bias.{token}", token,
                                          f"outside the vocabulary [0, {self.vocab_size})")
        if request.top_logprobs > self.vocab_size:
            raise InvalidRequestError("top_logprobs", request.top_logprobs, f"exceeds the vocabulary ({self.vocab_size})")
        self.resolve_adapter(request.adapter)
        if request.rid in self.live_requests():
            raise DuplicateRequestError(f"rid {request.rid!r} is already live")

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.validate(request)
        seq = _Sequence(
            request=request, schedule=request.schedule or dense_schedule(),
            adapter=self.resolve_adapter(request.adapter), queue=asyncio.Queue(), loop=asyncio.get_running_loop(),
            generator=make_generator(request.sampling.seed, self.runner.device),
            reserved_pages=self.cache.pages_for(len(request.input_ids) + request.sampling.max_new_tokens),
            weight_version=self.weight_version,
        )
        with self._cond:
            if request.rid in self._live:
                raise DuplicateRequestError(f"rid {request.rid!r} is already live")
            self._live[request.rid] = seq
            self._waiting.append(seq)
            self._cond.notify_all()
        finished = False
        try:
            while True:
                chunk = await seq.queue.get()
                finished = chunk.finish is not None
                yield chunk
                if finished:
                    return
        finally:
            if not finished:
                self._request_abort(request.rid)

    async def abort(self, rid: str) -> bool:
        return self._request_abort(rid)

    def _request_abort(self, rid: str) -> bool:
        with self._cond:
            if rid not in self._live:
                return False
            self._abort_rids.add(rid)
            self._cond.notify_all()
            return True

    # ----- the loop (background thread) ----------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._abort_rids or self._stopping or self.weight_sync.has_work()):
                    self._cond.wait()
                if self._stopping and not self._live:
                    return
                aborts, self._abort_rids = self._abort_rids, set()
            with self._step_lock:
                self._apply_aborts(aborts)
                self._admit()
                if self._running and self.weight_sync.stepping:
                    self._decode_isolated(list(self._running))

    def _apply_aborts(self, rids: set[str]) -> None:
        for seq in [s for s in [*self._waiting, *self._running] if s.rid in rids]:
            self._finish(seq, FinishReason("abort", message="aborted"), (), ())

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch_size and self.weight_sync.admitting \
                and not self.cache.released:
            seq = self._waiting[0]
            if self.cache.free_pages - self._outstanding_reservations() < seq.reserved_pages:
                return  # wait for pages (FIFO: no overtaking, so large requests are not starved)
            with self._cond:
                self._waiting.popleft()
            self._running.append(seq)
            if seq.output:  # retracted by a pause: recompute its KV; its tokens and weight version stay
                self._guarded([seq], lambda seqs: self.weight_sync.resume_retracted(seqs[0]))
            else:  # stamped at admission: a request queued across an update runs on the new weights
                seq.weight_version = self.weight_version
                self._guarded([seq], lambda seqs: self._prefill(seqs[0]))

    def _outstanding_reservations(self) -> int:
        return sum(s.reserved_pages - len(s.table.pages) for s in self._running)

    def _guarded(self, seqs: list[_Sequence], step) -> None:
        """Run a step; on an exception end those requests with an error and keep serving."""
        try:
            step(seqs)
        except Exception as exc:  # one bad batch must not take the engine down
            log.exception("engine step failed")
            for seq in list(seqs):
                self._fail(seq, exc)

    def _fail(self, seq: _Sequence, exc: Exception) -> None:
        if seq.rid in self._live:
            self._finish(seq, FinishReason("error", message=f"{type(exc).__name__}: {exc}"), (), ())

    def _prefill(self, seq: _Sequence) -> None:
        prompt = list(seq.request.input_ids)
        self.cache.allocate(seq.table, len(prompt))
        ctx = ForwardContext(self.cache, [seq.table], torch.tensor([len(prompt)], device=self.runner.device),
                             is_prefill=True)
        start = seq.request.logprob_start_len
        logits = self.runner.prefill(prompt, seq.adapter, ctx, keep=1 if start is None else max(1, len(prompt) - start))
        seq.table.length = len(prompt)
        scored = {}
        if start is not None:
            prompt_lps = prompt_logprobs(logits[:-1], prompt[start:], seq.request.top_logprobs)
            scored = {"prompt_logprobs": prompt_lps.logprobs, "prompt_top_logprobs": prompt_lps.top_logprobs}
        if seq.request.sampling.max_new_tokens == 0:  # scoring only (SGLang's prefill-only request)
            self._finish(seq, FinishReason("length", length=0), (), (), extra=scored)
            return
        sampled = self._sample(seq, logits[-1])
        self._emit(seq, sampled, None, None, scored)

    def _decode_isolated(self, seqs: list[_Sequence]) -> None:
        """One decode step in which no request can hurt another: a failure in one request's own work
        (its budget, sampling, stop checks) ends that request alone; a failure in the shared forward
        retries the step with each request alone (writing a token's K/V again is idempotent), so only
        the request that fails by itself ends. Neighbours get exactly the tokens they would alone."""
        seqs = [seq for seq in seqs if self._alone(seq, self._plan_row)]
        if not seqs:
            return
        try:
            logits, ctx = self._forward(seqs)
        except Exception as exc:
            log.exception("decode step of %d request(s) failed", len(seqs))
            if len(seqs) == 1:  # alone already: it is the faulty request
                self._fail(seqs[0], exc)
                return
            for seq in seqs:
                self._decode_isolated([seq])
            return
        for i, seq in enumerate(seqs):
            self._alone(seq, lambda s, i=i: self._sample_row(s, logits[i], ctx, i))

    def _alone(self, seq: _Sequence, work) -> bool:
        """Run one request's own part of a step; on an exception end that request with an error."""
        try:
            work(seq)
            return True
        except Exception as exc:
            log.exception("request %s failed in its own part of a step", seq.rid)
            self._fail(seq, exc)
            return False

    def _plan_row(self, seq: _Sequence) -> None:
        """Evaluate the request's schedule at this step's length (before the shared forward)."""
        length = seq.table.length + 1
        seq.step_pages = attended_pages(seq.schedule, length, seq.prompt_len)
        seq.step_budget = kv_budget_tokens(seq.schedule, length, seq.prompt_len)

    def _forward(self, seqs: list[_Sequence]) -> tuple[torch.Tensor, ForwardContext]:
        """The shared part of a decode step: one forward for every request (K/V written, logits out)."""
        for seq in seqs:
            self.cache.allocate(seq.table, seq.table.length + 1)
        lengths = [s.table.length + 1 for s in seqs]
        ctx = ForwardContext(
            self.cache, [s.table for s in seqs], torch.tensor(lengths, device=self.runner.device), is_prefill=False,
            schedules=[s.schedule for s in seqs], prompt_lens=[s.prompt_len for s in seqs],
            budget_pages=[s.step_pages for s in seqs],
            record=[s.request.return_selected_pages for s in seqs], selections=[{} for _ in seqs],
        )
        logits = self.runner.decode([s.output[-1] for s in seqs], [s.adapter for s in seqs], ctx)
        self.steps += 1
        return logits, ctx

    def _sample_row(self, seq: _Sequence, logits: torch.Tensor, ctx: ForwardContext, i: int) -> None:
        """One request's own part after the forward: its token, budget and recorded pages."""
        seq.table.length += 1
        sampled = self._sample(seq, logits)
        pages = _selection(ctx.selections[i], len(self.cache.k)) if ctx.record[i] else None
        self._emit(seq, sampled, seq.step_budget, pages)

    def _sample(self, seq: _Sequence, logits: torch.Tensor) -> SampledToken:
        params = seq.request.sampling
        return sample_token(logits, params, seq.generator, seq.request.top_logprobs, seq.output,
                            (*params.stop_token_ids, *self.eos_token_ids))

    def _emit(self, seq: _Sequence, tok: SampledToken, budget: int | None, pages: PageSelection | None,
              prompt_fields: dict | None = None) -> None:
        seq.output.append(tok.token_id)
        finish = self._finish_reason(seq, tok.token_id)
        chunk_fields = dict(
            token_ids=(tok.token_id,), logprobs=(tok.logprob,),
            top_logprobs=(tok.top_logprobs,) if tok.top_logprobs is not None else None,
            kv_budget_tokens=(budget,), selected_pages=(pages,) if seq.request.return_selected_pages else None,
            **(prompt_fields or {}),
        )
        if finish is None:
            self._send(seq, self._chunk(seq, **chunk_fields))
        else:
            self._finish(seq, finish, **{k: chunk_fields[k] for k in ("token_ids", "logprobs")},
                         extra={k: v for k, v in chunk_fields.items() if k not in ("token_ids", "logprobs")})

    def _finish_reason(self, seq: _Sequence, token: int) -> FinishReason | None:
        params = seq.request.sampling
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return FinishReason("stop", matched=token)
        matched = self._matched_stop_string(seq) if len(seq.output) >= params.min_new_tokens else None
        if matched is not None:
            return FinishReason("stop", matched=matched)
        if len(seq.output) >= params.max_new_tokens:
            return FinishReason("length", length=params.max_new_tokens)
        return None

    def _matched_stop_string(self, seq: _Sequence) -> str | None:
        """A stop string that the newest token completed. Checked every step, so only a window of the
        last tokens (longer than any stop string) is decoded."""
        stops = seq.request.sampling.stop
        if not stops or self.tokenizer is None:
            return None
        window = max(len(s) for s in stops) + STOP_WINDOW_SLACK
        tail = self.tokenizer.decode(seq.output[-window:], skip_special_tokens=False)
        return next((s for s in stops if s in tail), None)

    def _finish(self, seq: _Sequence, reason: FinishReason, token_ids, logprobs, extra: dict | None = None) -> None:
        """Send the last chunk, free the pages and forget the request."""
        extra = extra or {}
        if seq in self._running:
            self._running.remove(seq)
        with self._cond:
            if seq in self._waiting:
                self._waiting.remove(seq)
            self._live.pop(seq.rid, None)
        self.cache.free(seq.table)
        self._send(seq, self._chunk(seq, token_ids=tuple(token_ids), logprobs=tuple(logprobs), finish=reason, **extra))

    def _chunk(self, seq: _Sequence, **fields) -> GenerationChunk:
        return GenerationChunk(rid=seq.rid, prompt_tokens=seq.prompt_len, completion_tokens=len(seq.output),
                               adapter=seq.adapter, weight_version=seq.weight_version, **fields)

    @staticmethod
    def _send(seq: _Sequence, chunk: GenerationChunk) -> None:
        try:
            seq.loop.call_soon_threadsafe(seq.queue.put_nowait, chunk)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            pass


def _selection(per_layer: dict[int, Any], num_layers: int) -> PageSelection:
    return tuple(per_layer.get(layer) for layer in range(num_layers))


def _eos_ids(model: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    return tuple(ids)
