"""Weight updates and pause/continue for the reference engine (``engine.weight_sync``).

The batch loop (``ReferenceEngine._loop``) asks this object, between steps, whether it may admit
requests (``admitting``) and run decode steps (``stepping``). An update:
1. loads the new checkpoint into a fresh model and checks it has the serving model's config and
   parameter names and shapes (old weights keep serving meanwhile; any problem -> ``WeightLoadError``);
2. stops admission, aborts live requests if asked, waits until no request holds KV;
3. with the loop stopped (step lock held): copies the new tensors into the serving parameters
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from sparrow_server.engine.base import FinishReason
from sparrow_server.engine.checkpoint_preflight import config_mismatch, config_view, shapes_mismatch
from sparrow_server.engine.reference.attention import ForwardContext
from sparrow_server.engine.reference.kv_cache import PagedKVCache
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

if TYPE_CHECKING:
    from sparrow_server.engine.reference.engine import ReferenceEngine

log = logging.getLogger(__name__)

POLL_S = 0.005  # how often a waiting control call looks at the loop's state


# ----- loading and checking (no engine state) ---------------------------------------------------
def load_candidate(model_path: str, load_format: str | None, dtype: torch.dtype, device: Any) -> Any:
    """The checkpoint at ``model_path`` (HF directory or ``.gguf``) as a fresh eval-mode model."""
    check_load_format(load_format)
    path = Path(model_path).expanduser()
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
def copy_weights(serving: Any, candidate: Any) -> None:
    """Copy every base parameter of ``candidate`` into ``serving`` (names and shapes already checked)."""
    have, want = dense_parameters(serving), dense_parameters(candidate)
    assert have.keys() == want.keys(), "architecture_mismatch must run first"
    for name, tensor in have.items():
        tensor.copy_(want[name])


def flush_kv_cache(cache: PagedKVCache) -> None:
    """Zero the K/V pool and the landmark side cache: a page handed out after an update can
    never carry K/V or a landmark computed with the old weights. Every page must be free."""
    assert cache.free_pages == cache.usable_pages, "flush with pages in use"
    cache.k.zero_()
    cache.v.zero_()
    cache.landmarks.zero_()


# ----- the engine's controller ------------------------------------------------------------------
class ReferenceWeightSync:
    """``WeightSync`` of a ``ReferenceEngine``. Gate fields change under the engine's condition
    and are read by the loop thread; control calls are serialised by an asyncio lock."""

    def __init__(self, engine: "ReferenceEngine"):
        self.engine = engine
        self.mode: str | None = None  # pause mode, None = generating
        self.updating = False
        self._control: asyncio.Lock | None = None

    # ----- read by the loop thread ------------------------------------------------------------
    @property
    def admitting(self) -> bool:
        return self.mode is None and not self.updating

    @property
    def stepping(self) -> bool:
        return self.mode != PAUSE_IN_PLACE

    def has_work(self) -> bool:
        """Whether the loop has a step to run (called under the engine's condition)."""
        e = self.engine
        return bool((e._waiting and self.admitting and not e.cache.released) or (e._running and self.stepping))

    def resume_retracted(self, seq: Any) -> None:
        """Recompute the KV of a retracted request (prompt + all its tokens but the last, which the
        next decode step feeds); its tokens and weight version stay."""
        e = self.engine
        tokens = list(seq.request.input_ids) + seq.output[:-1]
        e.cache.allocate(seq.table, len(tokens))
        ctx = ForwardContext(e.cache, [seq.table], torch.tensor([len(tokens)], device=e.runner.device), is_prefill=True)
        e.runner.prefill(tokens, seq.adapter, ctx)  # logits unused: the next token is already sampled
        seq.table.length = len(tokens)

    # ----- WeightSync ---------------------------------------------------------------------------
    @property
    def weight_version(self) -> str:
        return self.engine.weight_version

    def pause_state(self) -> PauseState:
        e = self.engine
        with e._cond:
            return PauseState(self.mode, len(e._running), len(e._waiting))

    async def pause_generation(self, mode: str = DEFAULT_PAUSE_MODE) -> PauseState:
        check_pause_mode(mode)
        async with self._lock():
            self._set(mode=mode)
            aborted = self._abort_live() if mode == PAUSE_ABORT else ()
            await self._in_loop_pause(self._retract if mode == PAUSE_RETRACT else None)
            await self._until(lambda: not (set(aborted) & set(self.engine._live)))
        return self.pause_state()

    async def continue_generation(self) -> PauseState:
        async with self._lock():
            self._set(mode=None)
        return self.pause_state()

    async def update_weights_from_disk(self, update: WeightUpdate) -> WeightUpdateResult:
        e = self.engine
        async with self._lock():
            started = time.monotonic()
            candidate = await self._in_thread(load_candidate, update.model_path, update.load_format,
                                              next(e.runner.model.parameters()).dtype, e.runner.device)
            problem = architecture_mismatch(e.runner.model, candidate)
            if problem:
                raise WeightLoadError("model_path", update.model_path, problem)
            loaded = time.monotonic()
            self._set(updating=True)
            swap = None
            try:
                if self.mode == PAUSE_IN_PLACE and e._running and not update.abort_all_requests:
                    raise WeightSyncConflictError(
                        f"generation is paused in_place with {len(e._running)} running requests whose KV comes from "
                        "the old weights: continue_generation first, pause with mode abort or retract, "
                        "or set abort_all_requests")
                aborted = self._abort_live() if update.abort_all_requests else ()
                while swap is None:  # an admission racing the gate can add one last request
                    await self._until(lambda: not e._running and not (set(aborted) & set(e._live)))
                    drained = time.monotonic()
                    swap = await self._in_thread(self._swap_if_idle, candidate, update)
            finally:
                hold = swap is not None and update.keep_pause and self.mode is None
                self._set(updating=False, mode=PAUSE_IN_PLACE if hold else self.mode)
            version, previous, paused, stale, swap_s = swap
            log.info("weights updated from %s: %s -> %s", update.model_path, previous, version)
            return WeightUpdateResult(weight_version=version, previous_weight_version=previous,
                                      num_aborted_requests=len(aborted) + stale, num_paused_requests=paused,
                                      load_s=loaded - started, drain_s=drained - loaded, swap_s=swap_s)

    # ----- internals ------------------------------------------------------------------------------
    def _lock(self) -> asyncio.Lock:
        if self._control is None:
            self._control = asyncio.Lock()
        return self._control

    def _set(self, **fields: Any) -> None:
        with self.engine._cond:
            for name, value in fields.items():
                setattr(self, name, value)
            self.engine._cond.notify_all()

    def _abort_live(self) -> tuple[str, ...]:
        rids = self.engine.live_requests()
        for rid in rids:
            self.engine._request_abort(rid)
        return rids

    async def _in_thread(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def _until(self, predicate: Callable[[], bool]) -> None:
        while True:
            with self.engine._cond:
                if predicate():
                    return
            await asyncio.sleep(POLL_S)

    async def _in_loop_pause(self, action: Callable[[], None] | None) -> None:
        """Wait for the step in progress to end (later steps see the new gate), then run ``action``."""
        def between_steps() -> None:
            with self.engine._step_lock:
                if action is not None:
                    action()

        await self._in_thread(between_steps)

    def _retract(self) -> None:
        """Free the running requests' KV and put them back in front of the queue (step lock held)."""
        e = self.engine
        running, e._running = e._running, []
        for seq in running:
            e.cache.free(seq.table)
        with e._cond:
            e._waiting.extendleft(reversed(running))

    def _swap_if_idle(self, candidate: Any, update: WeightUpdate):
        """Swap the weights in if no request holds KV (else None: drain again)."""
        e = self.engine
        with e._step_lock:
            if e._running:
                return None
            started = time.monotonic()
            copy_weights(e.runner.model, candidate)
            if update.flush_cache:
                flush_kv_cache(e.cache)
            previous = e.weight_version
            e.weight_version = update.weight_version or next_weight_version(previous)
            with e._cond:  # retracted requests hold old-weight tokens: continuing them would mix versions
                retracted = [s for s in e._waiting if s.output]
            for seq in retracted:
                e._finish(seq, FinishReason("abort", message=(
                    f"weights updated to {e.weight_version} while this request was retracted; its tokens come "
                    f"from {seq.weight_version}: resubmit it")), (), ())
            return e.weight_version, previous, len(retracted), len(retracted), time.monotonic() - started


__all__ = [
    "ReferenceWeightSync", "load_candidate", "architecture_mismatch", "copy_weights", "dense_parameters",
    "flush_kv_cache",
]
