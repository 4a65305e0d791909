"""The reference engine: continuous batching over a paged KV cache on one background thread.

The engine is its scheduler (queues, live set, gate, step lock: ``scheduler.py``), a model runner,
the KV cache and the loop. Each loop iteration processes aborts, admits waiting requests whose
pages fit (reserving ``prompt + max_new_tokens`` tokens so an admitted request never runs out),
prefills them one by one (dense), then runs one decode step for every running request together.
Chunks go back to each request's asyncio queue on the caller's event loop.
"""
from __future__ import annotations

import asyncio
import logging
import threading
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
    HELD_MEMORY_RELEASED,
    HELD_PAUSED,
    InvalidRequestError,
    PageSelection,
)
from sparrow_server.engine.memory import MemoryControl
from sparrow_server.engine.ports import AdapterPort, LoadedAdapter, LocalModel
from sparrow_server.engine.weight_groups import DEFAULT_GROUP_TIMEOUT_S, WeightGroups
from sparrow_server.engine.weights import WeightSync
from sparrow_server.engine.reference.peft_adapters import PeftAdapterSlots
from sparrow_server.engine.reference.attention import ForwardContext
from sparrow_server.engine.reference.kv_cache import PagedKVCache
from sparrow_server.engine.reference.live_request import LiveRequest
from sparrow_server.engine.reference.memory import ReferenceMemory
from sparrow_server.engine.reference.runner import ModelRunner
from sparrow_server.engine.reference.scheduler import Scheduler
from sparrow_server.engine.reference.sampler import SampledToken, make_generator, prompt_logprobs, sample_token
from sparrow_server.engine.reference.weight_groups import ReferenceWeightGroups
from sparrow_server.engine.reference.weight_update import ReferenceWeightSync
from sparrow_server.sparsity.schedule import (
    DEFAULT_PAGE_SIZE, ScheduleError, attended_pages, dense_schedule, kv_budget_tokens,
)
from sparrow_server.sparsity.wire import check_page_size

log = logging.getLogger(__name__)

DEFAULT_KV_POOL_TOKENS = 65536
DEFAULT_MAX_BATCH_SIZE = 32
ENGINE_NAME = "reference"
STOP_WINDOW_SLACK = 4  # extra tokens decoded past the longest stop string (tokens of 0 whole characters)


class ReferenceEngine(Engine):
    """PyTorch + transformers engine with the core library's sparse decode semantics."""

    def __init__(self, model: Any, tokenizer: Any | None = None, model_name: str = "model",
                 kv_pool_tokens: int = DEFAULT_KV_POOL_TOKENS, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 page_size: int = DEFAULT_PAGE_SIZE, weight_version: str = DEFAULT_WEIGHT_VERSION,
                 weight_group_timeout_s: float = DEFAULT_GROUP_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_batch_size = max_batch_size
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
        self.scheduler = Scheduler(self.cache, max_batch_size)
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode forwards
        self.loop_steps = 0  # loop iterations that did work (admission, prefill, decode or aborts): progress
        # weight updates, pause/continue (sets the scheduler's gate); owns the weight version
        self.weight_sync = ReferenceWeightSync(self.scheduler, self.runner, self.cache, weight_version)
        self.weight_group_port = ReferenceWeightGroups(self.weight_sync, weight_group_timeout_s)  # trainer broadcasts
        self.memory = ReferenceMemory(self.scheduler, self.runner, self.cache)  # flush, release/resume, checker

    @property
    def weight_version(self) -> str:
        return self.weight_sync.weight_version

    # ----- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        self.start_thread()

    def start_thread(self) -> None:
        if self._thread is None:
            self.scheduler.start()
            self._thread = threading.Thread(target=self._loop, name="sparrow-reference-engine", daemon=True)
            self._thread.start()

    async def shutdown(self) -> None:
        await self.weight_group_port.close_all()
        self.scheduler.stop()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None

    def adapter_port(self) -> AdapterPort:
        return self

    def weights(self) -> WeightSync:
        return self.weight_sync

    def weight_groups(self) -> WeightGroups:
        return self.weight_group_port

    def memory_control(self) -> MemoryControl:
        return self.memory

    def local_model(self) -> LocalModel:
        return LocalModel(lambda: self.runner.model, self.scheduler.step_lock)

    def max_running_requests(self) -> int:
        return self.max_batch_size

    def loaded_adapters(self) -> tuple[LoadedAdapter, ...]:
        return self.peft_adapters.loaded()

    def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA directory as adapter ``name`` (between steps)."""
        with self.scheduler.step_lock:
            self.runner.model = self.peft_adapters.attach(self.runner.model, name, path)

    def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name`` (between steps). The caller ensures no request still uses it."""
        with self.scheduler.step_lock:
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
        counts = self.scheduler.counts()
        alive = self._thread is not None and self._thread.is_alive()
        released, paused = self.cache.released, self.weight_sync.mode
        held = HELD_MEMORY_RELEASED if released else HELD_PAUSED if paused is not None else None
        detail = "; ".join(text for cond, text in (
            (not alive, "engine loop not running"),
            (released, "KV cache released: requests wait for /resume_memory_occupation"),
            (paused is not None, f"generation paused ({paused}): requests wait for /continue_generation"),
        ) if cond)
        return EngineHealth(ok=alive, live_requests=counts.live, queued_requests=counts.waiting,
                            free_pages=0 if released else self.cache.free_pages, total_pages=self.cache.usable_pages,
                            detail=detail, held=held, progress=self.loop_steps)

    def live_requests(self) -> tuple[str, ...]:
        return tuple(r.rid for r in self.scheduler.live())

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
        if self.scheduler.is_live(request.rid):
            raise DuplicateRequestError(f"rid {request.rid!r} is already live")

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.validate(request)
        seq = LiveRequest(
            request=request, schedule=request.schedule or dense_schedule(),
            adapter=self.resolve_adapter(request.adapter), queue=asyncio.Queue(), loop=asyncio.get_running_loop(),
            generator=make_generator(request.sampling.seed, self.runner.device),
            reserved_pages=self.cache.pages_for(len(request.input_ids) + request.sampling.max_new_tokens),
            weight_version=self.weight_version,
        )
        self.scheduler.enqueue(seq)
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
                self.scheduler.request_abort(request.rid)

    async def abort(self, rid: str) -> bool:
        return self.scheduler.request_abort(rid)

    # ----- the loop (background thread) ----------------------------------------------------
    def _loop(self) -> None:
        while (aborts := self.scheduler.next_step()) is not None:
            with self.scheduler.step_lock.step():
                self.scheduler.apply_aborts(aborts)
                for seq in self.scheduler.admit():
                    if seq.output:  # retracted by a pause: recompute its KV; its tokens and weight version stay
                        self._guarded([seq], lambda seqs: self._recompute(seqs[0]))
                    else:  # stamped at admission: a request queued across an update runs on the new weights
                        seq.weight_version = self.weight_version
                        self._guarded([seq], lambda seqs: self._prefill(seqs[0]))
                batch = self.scheduler.decode_batch()
                if batch:
                    self._decode_isolated(batch)
            self.loop_steps += 1

    def _guarded(self, seqs: list[LiveRequest], step) -> None:
        """Run a step; on an exception end those requests with an error and keep serving."""
        try:
            step(seqs)
        except Exception as exc:  # one bad batch must not take the engine down
            log.exception("engine step failed")
            for seq in list(seqs):
                self._fail(seq, exc)

    def _fail(self, seq: LiveRequest, exc: Exception) -> None:
        if self.scheduler.is_live(seq.rid):
            self.scheduler.finish(seq, FinishReason("error", message=f"{type(exc).__name__}: {exc}"), (), ())

    def _prefill(self, seq: LiveRequest) -> None:
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
            self.scheduler.finish(seq, FinishReason("length", length=0), extra=scored)
            return
        sampled = self._sample(seq, logits[-1])
        self._emit(seq, sampled, None, None, scored)

    def _recompute(self, seq: LiveRequest) -> None:
        """Recompute the KV of a retracted request (prompt + all its tokens but the last, which the
        next decode step feeds); its tokens and weight version stay."""
        tokens = list(seq.request.input_ids) + seq.output[:-1]
        self.cache.allocate(seq.table, len(tokens))
        ctx = ForwardContext(self.cache, [seq.table], torch.tensor([len(tokens)], device=self.runner.device),
                             is_prefill=True)
        self.runner.prefill(tokens, seq.adapter, ctx)  # logits unused: the next token is already sampled
        seq.table.length = len(tokens)

    def _decode_isolated(self, seqs: list[LiveRequest]) -> None:
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

    def _alone(self, seq: LiveRequest, work) -> bool:
        """Run one request's own part of a step; on an exception end that request with an error."""
        try:
            work(seq)
            return True
        except Exception as exc:
            log.exception("request %s failed in its own part of a step", seq.rid)
            self._fail(seq, exc)
            return False

    def _plan_row(self, seq: LiveRequest) -> None:
        """Evaluate the request's schedule at this step's length (before the shared forward)."""
        length = seq.table.length + 1
        seq.step_pages = attended_pages(seq.schedule, length, seq.prompt_len)
        seq.step_budget = kv_budget_tokens(seq.schedule, length, seq.prompt_len)

    def _forward(self, seqs: list[LiveRequest]) -> tuple[torch.Tensor, ForwardContext]:
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

    def _sample_row(self, seq: LiveRequest, logits: torch.Tensor, ctx: ForwardContext, i: int) -> None:
        """One request's own part after the forward: its token, budget and recorded pages."""
        seq.table.length += 1
        sampled = self._sample(seq, logits)
        pages = _selection(ctx.selections[i], len(self.cache.k)) if ctx.record[i] else None
        self._emit(seq, sampled, seq.step_budget, pages)

    def _sample(self, seq: LiveRequest, logits: torch.Tensor) -> SampledToken:
        params = seq.request.sampling
        return sample_token(logits, params, seq.generator, seq.request.top_logprobs, seq.output,
                            (*params.stop_token_ids, *self.eos_token_ids))

    def _emit(self, seq: LiveRequest, tok: SampledToken, budget: int | None, pages: PageSelection | None,
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
            seq.send(seq.chunk(**chunk_fields))
        else:
            self.scheduler.finish(seq, finish, **{k: chunk_fields[k] for k in ("token_ids", "logprobs")},
                         extra={k: v for k, v in chunk_fields.items() if k not in ("token_ids", "logprobs")})

    def _finish_reason(self, seq: LiveRequest, token: int) -> FinishReason | None:
        params = seq.request.sampling
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return FinishReason("stop", matched=token)
        matched = self._matched_stop_string(seq) if len(seq.output) >= params.min_new_tokens else None
        if matched is not None:
            return FinishReason("stop", matched=matched)
        if len(seq.output) >= params.max_new_tokens:
            return FinishReason("length", length=params.max_new_tokens)
        return None

    def _matched_stop_string(self, seq: LiveRequest) -> str | None:
        """A stop string that the newest token completed. Checked every step, so only a window of the
        last tokens (longer than any stop string) is decoded."""
        stops = seq.request.sampling.stop
        if not stops or self.tokenizer is None:
            return None
        window = max(len(s) for s in stops) + STOP_WINDOW_SLACK
        tail = self.tokenizer.decode(seq.output[-window:], skip_special_tokens=False)
        return next((s for s in stops if s in tail), None)


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
