"""Weight updates and pause/continue for the reference engine (``engine.weight_sync``).

This object drives the scheduler's gate (may it admit requests, ``admitting``; may it run decode
steps, ``stepping``) and works on the queues only through the scheduler's verbs. An update:
1. loads the new checkpoint into a fresh model and checks it has the serving model's config and
   parameter names and shapes (old weights keep serving meanwhile; any problem -> ``WeightLoadError``),
   or takes the tensors a trainer broadcast (``weight_groups.py``: received and checked the same way);
2. stops admission, aborts live requests if asked, waits until no request holds KV;
3. between steps (the scheduler's step lock held): copies the new tensors into the serving parameters
   (shapes checked, so the copy cannot fail half-way; LoRA adapters stay attached), zeroes the KV
   pool and the landmark side cache, sets ``weight_version``, aborts retracted requests (their
   tokens come from the old weights);
4. reopens admission (unless paused).
Requests are stamped with the weight version when admitted, so a request queued during an update
runs, and is labelled, on the new weights.

Pause modes: ``abort`` aborts every live request; ``retract`` frees the running requests' KV and
requeues them in front, keeping their tokens (on continue their KV is recomputed from prompt +
tokens by a dense prefill, as SGLang does); ``in_place`` freezes the loop (KV kept). In every mode
new requests queue until ``continue_generation``. An update while paused ``in_place`` with running
requests is refused (their old-weight KV would continue on new weights) unless
``abort_all_requests``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from sparrow_server.engine.base import FinishReason
from sparrow_server.engine.checkpoint_preflight import config_mismatch, config_view, shapes_mismatch
from sparrow_server.engine.reference.kv_cache import PagedKVCache
from sparrow_server.engine.reference.runner import ModelRunner
from sparrow_server.engine.reference.scheduler import Scheduler
from sparrow_server.engine.weights import (
    DEFAULT_PAUSE_MODE,
    PAUSE_ABORT,
    PAUSE_IN_PLACE,
    PAUSE_RETRACT,
    PauseState,
    WeightLoadError,
    WeightSyncConflictError,
    WeightUpdate,
    WeightUpdateResult,
    check_load_format,
    check_pause_mode,
    next_weight_version,
)
from sparrow_server.models import user_path

log = logging.getLogger(__name__)

POLL_S = 0.005  # how often a waiting control call looks at the loop's state


# ----- loading and checking (no engine state) ---------------------------------------------------
def load_candidate(model_path: str, load_format: str | None, dtype: torch.dtype, device: Any) -> Any:
    """The checkpoint at ``model_path`` (HF directory or ``.gguf``) as a fresh eval-mode model."""
    check_load_format(load_format)
    try:
        path = user_path(model_path)
    except ValueError as exc:
        raise WeightLoadError("model_path", model_path, str(exc)) from None
    if not path.exists():
        raise WeightLoadError("model_path", model_path, "no such file or directory")
    if path.suffix != ".gguf" and not (path / "config.json").is_file():
        raise WeightLoadError("model_path", model_path, "is not an HF checkpoint directory (no config.json)")
    from transformers import AutoModelForCausalLM

    from sparrow_server.models import converted_gguf_dir

    kwargs = {"use_safetensors": load_format == "safetensors"} if load_format in ("safetensors", "pt") else {}
    try:
        directory = converted_gguf_dir(path) if path.suffix == ".gguf" else path
        model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype, **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise WeightLoadError("model_path", model_path, f"cannot load a checkpoint: {exc}") from exc
    return model.to(device).eval()


def dense_parameters(model: Any) -> dict[str, torch.Tensor]:
    """Parameters of the base model by their checkpoint names (peft LoRA wrappers looked through:
    ``q_proj.base_layer.weight`` -> ``q_proj.weight``; LoRA tensors left out)."""
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    out = {}
    for name, tensor in base.named_parameters():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def architecture_mismatch(serving: Any, candidate: Any) -> str | None:
    """Why ``candidate`` cannot replace ``serving``'s weights in place, or None when it can
    (same rules as the checkpoint preflight, on loaded models)."""
    reason = config_mismatch(config_view(serving.config.to_dict()), config_view(candidate.config.to_dict()))
    if reason:
        return reason
    shapes = {name: tuple(t.shape) for name, t in dense_parameters(serving).items()}
    return shapes_mismatch(shapes, {name: tuple(t.shape) for name, t in dense_parameters(candidate).items()}, "parameters")


@torch.no_grad()
def copy_weights(serving: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Copy ``tensors`` (base parameter name -> new value, all of them or a subset) into ``serving``'s
    parameters, casting to their dtype and device. Names and shapes are checked first, so the copy
    cannot fail half-way."""
    have = dense_parameters(serving)
    for name, tensor in tensors.items():
        assert name in have and have[name].shape == tensor.shape, f"{name}: check names and shapes first"
    for name, tensor in tensors.items():
        have[name].copy_(tensor)


def flush_kv_cache(cache: PagedKVCache) -> None:
    """Zero the K/V pool and the landmark side cache: a page handed out after an update can
    never carry K/V or a landmark computed with the old weights. Every page must be free."""
    assert cache.free_pages == cache.usable_pages, "flush with pages in use"
    cache.k.zero_()
    cache.v.zero_()
    cache.landmarks.zero_()


@dataclass(frozen=True)
class SwapOptions:
    """How an update swaps its tensors in, whatever brought them (disk, a process group)."""

    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    keep_pause: bool = False

    @classmethod
    def of(cls, update: WeightUpdate) -> "SwapOptions":
        return cls(weight_version=update.weight_version, flush_cache=update.flush_cache,
                   abort_all_requests=update.abort_all_requests, keep_pause=update.keep_pause)


# ----- the engine's controller ------------------------------------------------------------------
class ReferenceWeightSync:
    """``WeightSync`` of a ``ReferenceEngine``; owns its weight version. Control calls are
    serialised by an asyncio lock; the gate they set is the scheduler's."""

    def __init__(self, scheduler: Scheduler, runner: ModelRunner, cache: PagedKVCache, weight_version: str):
        self.scheduler = scheduler
        self.runner = runner
        self.cache = cache
        self.weight_version = weight_version
        self.mode: str | None = None  # pause mode, None = generating
        self.updating = False
        self._control: asyncio.Lock | None = None

    @property
    def admitting(self) -> bool:
        return self.mode is None and not self.updating

    @property
    def stepping(self) -> bool:
        return self.mode != PAUSE_IN_PLACE

    # ----- WeightSync ---------------------------------------------------------------------------
    def pause_state(self) -> PauseState:
        counts = self.scheduler.counts()
        return PauseState(self.mode, counts.running, counts.waiting)

    async def pause_generation(self, mode: str = DEFAULT_PAUSE_MODE) -> PauseState:
        check_pause_mode(mode)
        async with self._lock():
            self._set(mode=mode)
            aborted = self.scheduler.abort_all() if mode == PAUSE_ABORT else ()
            await self._in_loop_pause(self.scheduler.retract if mode == PAUSE_RETRACT else None)
            await self._until(lambda: not self.scheduler.any_live(aborted))
        return self.pause_state()

    async def continue_generation(self) -> PauseState:
        async with self._lock():
            self._set(mode=None)
        return self.pause_state()

    async def update_weights_from_disk(self, update: WeightUpdate) -> WeightUpdateResult:
        async with self._lock():
            started = time.monotonic()
            candidate = await self._in_thread(load_candidate, update.model_path, update.load_format,
                                              next(self.runner.model.parameters()).dtype, self.runner.device)
            problem = architecture_mismatch(self.runner.model, candidate)
            if problem:
                raise WeightLoadError("model_path", update.model_path, problem)
            return await self._swap_in(dense_parameters(candidate), SwapOptions.of(update), started,
                                       update.model_path)

    async def update_weights_from_tensors(self, tensors: dict[str, torch.Tensor], options: SwapOptions,
                                          started: float, source: str) -> WeightUpdateResult:
        """Swap in ``tensors`` (base parameter name -> value, names and shapes checked by the caller),
        received since ``started`` (``time.monotonic()``) from ``source``, as an update from disk does."""
        async with self._lock():
            return await self._swap_in(tensors, options, started, source)

    # ----- internals ------------------------------------------------------------------------------
    async def _swap_in(self, tensors: dict[str, torch.Tensor], options: SwapOptions, started: float,
                       source: str) -> WeightUpdateResult:
        """Steps 2-4 of an update (the control lock held): drain, swap, flush, version, reopen."""
        loaded = time.monotonic()
        self._set(updating=True)
        swap = None
        try:
            running = self.scheduler.counts().running
            if self.mode == PAUSE_IN_PLACE and running and not options.abort_all_requests:
                raise WeightSyncConflictError(
                    f"generation is paused in_place with {running} running requests whose KV comes from "
                    "the old weights: continue_generation first, pause with mode abort or retract, "
                    "or set abort_all_requests")
            aborted = self.scheduler.abort_all() if options.abort_all_requests else ()
            while swap is None:  # re-checked between steps (the gate closed before the drain: one pass)
                await self._until(lambda: not self.scheduler.any_running() and not self.scheduler.any_live(aborted))
                drained = time.monotonic()
                swap = await self._in_thread(self._swap_if_idle, tensors, options)
        finally:
            hold = swap is not None and options.keep_pause and self.mode is None
            self._set(updating=False, mode=PAUSE_IN_PLACE if hold else self.mode)
        version, previous, paused, stale, swap_s = swap
        log.info("weights updated from %s: %s -> %s", source, previous, version)
        return WeightUpdateResult(weight_version=version, previous_weight_version=previous,
                                  num_aborted_requests=len(aborted) + stale, num_paused_requests=paused,
                                  load_s=loaded - started, drain_s=drained - loaded, swap_s=swap_s)

    def _lock(self) -> asyncio.Lock:
        if self._control is None:
            self._control = asyncio.Lock()
        return self._control

    def _set(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)
        self.scheduler.set_gate(admitting=self.admitting, stepping=self.stepping)

    async def _in_thread(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await asyncio.sleep(POLL_S)

    async def _in_loop_pause(self, action: Callable[[], None] | None) -> None:
        """Wait for the step in progress to end (later steps see the new gate), then run ``action``."""
        reservation = self.scheduler.step_lock.reserve()  # now: no step starts after the one in progress

        def between_steps() -> None:
            with reservation:
                if action is not None:
                    action()

        await self._in_thread(between_steps)

    def _swap_if_idle(self, tensors: dict[str, torch.Tensor], options: SwapOptions):
        """Swap the weights in if no request holds KV (else None: drain again)."""
        with self.scheduler.step_lock:
            if self.scheduler.any_running():
                return None
            started = time.monotonic()
            copy_weights(self.runner.model, tensors)
            if options.flush_cache:
                flush_kv_cache(self.cache)
            previous = self.weight_version
            self.weight_version = options.weight_version or next_weight_version(previous)
            retracted = self.scheduler.retracted()  # old-weight tokens: continuing them would mix versions
            for seq in retracted:
                self.scheduler.finish(seq, FinishReason("abort", message=(
                    f"weights updated to {self.weight_version} while this request was retracted; its tokens come "
                    f"from {seq.weight_version}: resubmit it")))
            return self.weight_version, previous, len(retracted), len(retracted), time.monotonic() - started


__all__ = [
    "ReferenceWeightSync", SwapOptions, "load_candidate", "architecture_mismatch", "copy_weights", "dense_parameters",
    "flush_kv_cache",
]
