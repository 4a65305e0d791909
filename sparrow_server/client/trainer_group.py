"""The trainer's side of a weight-update process group: rank 0 of the group that SGLang 0.5.17's
``/init_weights_update_group`` makes each server join.

``open_trainer_group`` is SGLang's ``init_custom_process_group`` (``sglang/srt/utils/common.py``, also
copied by slime and OpenRLHF) written with ``torch.distributed`` only: a ``tcp://`` rendezvous at
``address:port`` (rank 0 hosts the TCPStore), a store prefixed with the group name, then
``_new_process_group_helper``. No default process group is needed, so a trainer that already has its
own (FSDP, DDP) keeps it. The servers run SGLang's function, so the two sides meet only if this one
does exactly what it does; that is why it is written out here rather than shared with the reference
engine's (gloo-only, server-side) copy.

torch is imported inside the functions: ``import sparrow_server.client`` stays light.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

BACKENDS = ("gloo", "nccl")


def tcp_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"tcp://{host}:{port}"


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend = {backend!r}: must be one of {', '.join(BACKENDS)}")
    return backend


def open_trainer_group(address: str, port: int, world_size: int, group_name: str, backend: str,
                       timeout_s: float) -> Any:
    """Join ``group_name`` as rank 0 of ``world_size``; blocks until every rank joined (or raises after
    about ``timeout_s``). For ``nccl``, call ``torch.cuda.set_device`` first: NCCL binds the group to the
    current device (SGLang's servers do not pass ``device_id`` either)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    check_backend(backend)
    if world_size < 2:
        raise ValueError(f"world_size = {world_size}: the trainer and at least one server")
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(rendezvous(tcp_url(address, port), 0, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), PrefixStore(group_name, store),
                                         group_name=group_name, backend_options=None, timeout=timeout)
    _world.pg_group_ranks[group] = {r: r for r in range(world_size)}
    return group


def close_trainer_group(group: Any) -> None:
    import torch.distributed as dist

    dist.destroy_process_group(group)


def broadcast_all(group: Any, tensors: list[Any]) -> None:
    """Broadcast ``tensors`` from rank 0, in order (what each server's receive loop matches one by one)."""
    import torch.distributed as dist

    for handle in [dist.broadcast(t, src=0, group=group, async_op=True) for t in tensors]:
        handle.wait()


__all__ = ["BACKENDS", "open_trainer_group", "close_trainer_group", "broadcast_all", "check_backend", "tcp_url"]
