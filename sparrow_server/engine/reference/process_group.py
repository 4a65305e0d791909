"""gloo process groups shared with a trainer, and the blocking calls on them run on threads with deadlines.

``open_group`` joins the group the way SGLang's ``init_custom_process_group`` does (and slime's,
OpenRLHF's): a ``tcp://`` rendezvous at the trainer's store, a store prefixed with the group name and
``_new_process_group_helper``, so a trainer using any of those helpers (or this one) meets it. No
default process group is needed. ``receive_tensors`` matches the trainer's
``torch.distributed.broadcast(tensor, src=0, group=group)`` calls, in order.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch

GLOO = "gloo"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a broadcast: its name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize


class DeadlineExceeded(Exception):
    """A blocking call did not return within its deadline; it was left to finish on its thread."""


def tcp_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"tcp://{host}:{port}"


def open_group(address: str, port: int, rank: int, world_size: int, group_name: str, timeout_s: float) -> Any:
    """Join ``group_name`` as ``rank`` (blocks until every rank joined, or raises after about ``timeout_s``)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(tcp_url(address, port), rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(GLOO), PrefixStore(group_name, store),
                                         group_name=group_name, backend_options=None, timeout=timeout)
    _world.pg_group_ranks[group] = {r: r for r in range(world_size)}
    return group


def close_group(group: Any) -> None:
    """Destroy the group: its connections close, so a trainer blocked in a collective on it fails at once."""
    import torch.distributed as dist

    dist.destroy_process_group(group)


def receive_tensors(group: Any, specs: tuple[TensorSpec, ...], flattened: bool) -> dict[str, torch.Tensor]:
    """Receive the trainer's broadcasts into fresh CPU tensors: one per spec, or (``flattened``, SGLang's
    ``flattened_bucket``) one uint8 tensor holding them all, back to back in spec order."""
    import torch.distributed as dist

    if not flattened:
        out = {}
        for spec in specs:
            out[spec.name] = torch.empty(spec.shape, dtype=spec.dtype)
            dist.broadcast(out[spec.name], src=0, group=group)
        return out
    flat = torch.empty(sum(spec.nbytes for spec in specs), dtype=torch.uint8)
    dist.broadcast(flat, src=0, group=group)
    out, start = {}, 0
    for spec in specs:  # clone: a slice's offset need not be aligned for its dtype
        out[spec.name] = flat[start:start + spec.nbytes].clone().view(spec.dtype).reshape(spec.shape)
        start += spec.nbytes
    return out


class _Handoff:
    """Who gets a thread's outcome: the awaiting coroutine, or (after its deadline) ``on_late``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.delivered = False


async def call_with_deadline(fn: Callable[[], Any], timeout_s: float, name: str,
                             on_late: Callable[[Any, BaseException | None], None] | None = None) -> Any:
    """``fn()`` on a new daemon thread (the event loop keeps serving; a call that hangs holds no pool
    worker). Raises ``DeadlineExceeded`` after ``timeout_s``; the thread then runs on, and ``on_late``
    gets its result or exception when it ends (to close a group that opened too late, say)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    handoff = _Handoff()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        result, error = None, None
        try:
            result = fn()
        except BaseException as exc:  # handed to the caller
            error = exc
        with handoff.lock:
            late = handoff.abandoned
            handoff.delivered = not late
        if late:
            if on_late is not None:
                on_late(result, error)
            return
        loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
        with handoff.lock:
            handoff.abandoned = not handoff.delivered
        cancelled = isinstance(exc, asyncio.CancelledError)
        if handoff.abandoned:
            if cancelled:
                raise
            raise DeadlineExceeded(f"{name} did not finish within {timeout_s:g} s") from None
        if not cancelled:  # it finished just in time: its outcome is on its way
            return await future
        if on_late is not None:  # cancelled while the outcome was on its way: hand it over when it lands
            future.add_done_callback(lambda f: on_late(None if f.exception() else f.result(), f.exception()))
        raise


__all__ = ["TensorSpec", "DeadlineExceeded", "open_group", "close_group", "receive_tensors", "call_with_deadline",
           "tcp_url", "GLOO"]
