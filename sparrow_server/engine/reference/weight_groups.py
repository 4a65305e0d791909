"""``WeightGroups`` of the reference engine: weight updates broadcast by a trainer over gloo (CPU).

``/init_weights_update_group`` joins the trainer's group as ``rank_offset`` (backend ``gloo`` only: NCCL
needs GPUs). ``/update_weights_from_distributed`` checks the metadata against the served model (every
name a base parameter, its shape the parameter's, its dtype a floating-point one), receives the
broadcasts into fresh tensors on a thread while the old weights keep serving, then hands them to
``ReferenceWeightSync.update_weights_from_tensors``, which drains, swaps between decode steps, flushes
and sets ``weight_version`` as an update from disk does. Nothing is copied until every tensor arrived.

Failures: group operations run on threads with a deadline (``timeout_s``; the gloo group's own timeout
is the same). When an update cannot receive the whole broadcast (bad metadata, timeout, the trainer
died) the server destroys the group, because the trainer's pending and later collectives could no
longer be matched (a gloo group that failed mid-collective is not reusable): the trainer's blocked
broadcasts fail at once and it must call ``/init_weights_update_group`` again. A group a deadline gave up
on is closed when its thread returns; until then its name is "closing" and cannot be opened again.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Iterator

import torch

from sparrow_server.engine.reference.process_group import (
    GLOO,
    DeadlineExceeded,
    TensorSpec,
    call_with_deadline,
    close_group,
    open_group,
    receive_tensors,
)
from sparrow_server.engine.reference.weight_update import ReferenceWeightSync, SwapOptions, dense_parameters
from sparrow_server.engine.weight_groups import (
    DISTRIBUTED_LOAD_FORMATS,
    FLATTENED_BUCKET,
    DistributedWeightUpdate,
    WeightGroupError,
    WeightGroupSpec,
)
from sparrow_server.engine.weights import WeightSyncConflictError, WeightUpdateResult

log = logging.getLogger(__name__)

OPENED = "Succeeded to initialize custom process group."  # SGLang's messages
DESTROYED = "Succeeded to destroy custom process group."
NO_SUCH_GROUP = "The group to be destroyed does not exist."
REINIT = "the server closed the group: call /init_weights_update_group again"
SHUTDOWN_WAIT_S = 60.0  # most a shutdown waits for abandoned group threads


def check_backend(backend: str) -> None:
    if backend != GLOO:
        raise WeightGroupError(
            f"backend = {backend!r}: the reference engine runs on CPU and joins weight-update groups over gloo; "
            "NCCL needs GPUs (serve --engine sglang). Open the group with backend 'gloo' on both sides",
            kind="not_supported", field="backend", value=backend)


def floating_dtype(name: Any) -> torch.dtype | None:
    """``getattr(torch, name)`` as SGLang resolves a dtype name, when it is a floating-point dtype."""
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None


def _bad(field: str, value: Any, reason: str) -> WeightGroupError:
    return WeightGroupError(f"{field} = {value!r}: {reason}", kind="weight_load_failed", field=field, value=value)


def receive_plan(update: DistributedWeightUpdate, shapes: dict[str, tuple[int, ...]]) -> tuple[TensorSpec, ...]:
    """What to receive, in broadcast order; raises ``WeightGroupError`` naming the first bad entry.
    ``shapes``: the served model's base parameters (checkpoint names)."""
    if update.load_format not in DISTRIBUTED_LOAD_FORMATS:
        raise _bad("load_format", update.load_format, f"this engine receives one broadcast per tensor (omit it) "
                                                      f"or {FLATTENED_BUCKET!r}")
    count = len(update.names)
    if not count:
        raise _bad("names", list(update.names), "must name at least one tensor")
    for field in ("dtypes", "shapes"):
        values = getattr(update, field)
        if len(values) != count:
            raise _bad(field, [list(v) if isinstance(v, tuple) else v for v in values],
                       f"has {len(values)} entries for {count} names: one per name")
    specs, seen = [], set()
    for i, (name, dtype_name, shape) in enumerate(zip(update.names, update.dtypes, update.shapes)):
        if name not in shapes:
            raise _bad(f"names[{i}]", name, "is not a parameter of the served model (checkpoint names, e.g. "
                                            "model.layers.0.self_attn.q_proj.weight)")
        if name in seen:
            raise _bad(f"names[{i}]", name, "is named twice")
        seen.add(name)
        dtype = floating_dtype(dtype_name)
        if dtype is None:
            raise _bad(f"dtypes[{i}]", dtype_name, "is not a floating-point torch dtype (bfloat16, float16, float32)")
        if tuple(shape) != shapes[name]:
            raise _bad(f"shapes[{i}]", list(shape), f"{name} has shape {list(shapes[name])} in the served model")
        specs.append(TensorSpec(name, dtype, tuple(shape)))
    return tuple(specs)


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    """Log a failed group operation (its answer goes to the caller; the operator sees it too)."""
    try:
        yield
    except WeightGroupError as exc:
        log.warning("%s failed: %s", what, exc)
        raise


def _first_line(exc: BaseException) -> str:
    """torch.distributed errors carry C++ stack traces; the first line says what happened."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class ReferenceWeightGroups:
    """The open groups by name. Group operations are serialised by an asyncio lock; the swap that
    follows a receive is ``ReferenceWeightSync``'s (its own lock)."""

    def __init__(self, weight_sync: ReferenceWeightSync, timeout_s: float):
        self.sync = weight_sync
        self.timeout_s = timeout_s
        self._groups: dict[str, Any] = {}
        self._closing: dict[str, asyncio.Event] = {}  # given up on by a deadline; set when their thread returns
        self._lock: asyncio.Lock | None = None

    def group_names(self) -> tuple[str, ...]:
        return tuple(self._groups)

    def closing_names(self) -> tuple[str, ...]:
        """Groups a deadline gave up on whose thread has not returned yet (their names cannot be opened)."""
        return tuple(self._closing)

    async def init_group(self, spec: WeightGroupSpec) -> str:
        with _logged("joining weight-update group"):
            return await self._init_group(spec)

    async def update_from_group(self, update: DistributedWeightUpdate) -> WeightUpdateResult:
        with _logged("weight update from a group"):
            tensors, started = await self._receive_update(update)
        options = SwapOptions(weight_version=update.weight_version, flush_cache=update.flush_cache,
                              abort_all_requests=update.abort_all_requests)
        return await self.sync.update_weights_from_tensors(tensors, options, started,
                                                            f"weight-update group {update.group_name!r}")

    async def _init_group(self, spec: WeightGroupSpec) -> str:
        check_backend(spec.backend)
        name = spec.group_name
        async with self._locked():
            self._check_free(name)
            try:
                group = await call_with_deadline(
                    lambda: open_group(spec.master_address, spec.master_port, spec.rank, spec.world_size, name,
                                       self.timeout_s),
                    self.timeout_s, f"joining weight-update group {name!r}", on_late=self._on_late(name))
            except DeadlineExceeded:
                self._closing[name] = asyncio.Event()  # until the thread returns (_on_late)
                raise WeightGroupError(
                    f"Failed to initialize custom process group: not every one of the {spec.world_size} ranks joined "
                    f"at {spec.master_address}:{spec.master_port} within {self.timeout_s:g} s (is the trainer "
                    "listening there as rank 0, and is world_size right?)") from None
            except Exception as exc:
                raise WeightGroupError(f"Failed to initialize custom process group: {_first_line(exc)} "
                                       f"(master {spec.master_address}:{spec.master_port}, rank {spec.rank} of "
                                       f"{spec.world_size})") from None
            self._groups[name] = group
        log.info("joined weight-update group %r as rank %d of %d", name, spec.rank, spec.world_size)
        return OPENED

    async def _receive_update(self, update: DistributedWeightUpdate) -> tuple[dict[str, torch.Tensor], float]:
        """The tensors of ``update``, received and checked, and when receiving started."""
        name = update.group_name
        async with self._locked():
            started = time.monotonic()
            try:
                specs = receive_plan(update, self._served_shapes())
            except WeightGroupError as exc:
                raise await self._fail(name, exc) from None
            group = self._groups.get(name)
            if group is None:
                raise WeightGroupError(f"group_name = {name!r}: no such weight-update group is open here; call "
                                       "/init_weights_update_group first", kind="unknown_group", field="group_name",
                                       value=name)
            return await self._receive(name, group, specs, update.load_format == FLATTENED_BUCKET), started

    async def destroy_group(self, group_name: str) -> str:
        async with self._locked():
            if group_name not in self._groups:
                raise WeightGroupError(NO_SUCH_GROUP, kind="unknown_group", field="group_name", value=group_name)
            await self._close(group_name)
        return DESTROYED

    async def close_all(self) -> None:
        """Close the open groups, and give threads a deadline gave up on time to end (their torch timeouts
        end them within about twice ``timeout_s``; a process should not exit while one is inside
        torch.distributed)."""
        async with self._locked():
            for name in list(self._groups):
                await self._close(name)
            pending = [event.wait() for event in self._closing.values()]
            if pending:
                try:
                    await asyncio.wait_for(asyncio.gather(*pending), min(2 * self.timeout_s, SHUTDOWN_WAIT_S))
                except asyncio.TimeoutError:
                    log.warning("weight-update group threads still running at shutdown: %s", sorted(self._closing))

    # ----- internals ------------------------------------------------------------------------------
    def _locked(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _check_free(self, name: str) -> None:
        if name in self._groups:
            raise WeightSyncConflictError(f"a weight-update group named {name!r} is already open: "
                                          "/destroy_weights_update_group it first")
        if name in self._closing:
            raise WeightSyncConflictError(f"the weight-update group {name!r} is still closing after a timeout; "
                                          "try again in a few seconds")

    def _served_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in dense_parameters(self.sync.runner.model).items()}

    async def _receive(self, name: str, group: Any, specs: tuple[TensorSpec, ...], flattened: bool):
        what = f"{len(specs)} tensor{'s' if len(specs) != 1 else ''}"
        try:
            return await call_with_deadline(lambda: receive_tensors(group, specs, flattened), self.timeout_s,
                                            f"receiving {what} on weight-update group {name!r}",
                                            on_late=self._on_late(name, group))
        except DeadlineExceeded:
            self._groups.pop(name, None)  # closed by _on_late when the receive returns (no two calls on one group)
            self._closing[name] = asyncio.Event()
            raise WeightGroupError(f"Failed to update parameter online: the trainer did not broadcast the {what} "
                                   f"within {self.timeout_s:g} s; the old weights keep serving and {REINIT}",
                                   group_destroyed=True) from None
        except Exception as exc:
            raise await self._fail(name, WeightGroupError(
                f"Failed to update parameter online: receiving {what} failed ({_first_line(exc)}); the old weights "
                "keep serving")) from None

    async def _fail(self, name: str, error: WeightGroupError) -> WeightGroupError:
        """Destroy the group (if open) after a failed update; the error says so."""
        if name not in self._groups:
            return error
        await self._close(name)
        return WeightGroupError(f"{error}; {REINIT}", kind=error.kind, field=error.field, value=error.value,
                                group_destroyed=True)

    async def _close(self, name: str) -> None:
        group = self._groups.pop(name)
        try:
            await call_with_deadline(lambda: close_group(group), self.timeout_s, f"closing weight-update group {name!r}")
        except Exception:
            log.exception("closing weight-update group %r failed; it is forgotten", name)

    def _on_late(self, name: str, group: Any = None):
        """What a thread a deadline gave up on does when it returns: close the group it holds (opened
        late, or the one it received on), then free the name (``_closing``, set at the deadline)."""
        loop = asyncio.get_running_loop()

        def late(result: Any, error: BaseException | None) -> None:
            held = group if group is not None else (result if error is None else None)
            if held is not None:
                try:
                    close_group(held)
                except Exception:
                    log.exception("closing weight-update group %r after its deadline failed", name)
            try:
                loop.call_soon_threadsafe(self._freed, name)
            except RuntimeError:  # the loop is gone (shutdown)
                pass

        return late

    def _freed(self, name: str) -> None:
        event = self._closing.pop(name, None)
        if event is not None:
            event.set()


__all__ = ["ReferenceWeightGroups", "receive_plan", "check_backend", "floating_dtype"]
