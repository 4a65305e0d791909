"""Weights pushed by a trainer over a process group: the engine-agnostic protocol behind SGLang's
``/init_weights_update_group``, ``/update_weights_from_distributed`` and ``/destroy_weights_update_group``.

A disaggregated trainer (slime, OpenRLHF-style loops) opens a group with every rollout server, itself
as rank 0 and each server at ``rank_offset``, then broadcasts each tensor from rank 0 while the server
receives. An engine that can join such groups returns a ``WeightGroups`` from ``engine.weight_groups()``;
the reference engine implements it over gloo (``engine.reference.weight_groups``), SGLang serves the
routes itself (NCCL).

The contract (docs/weight-updates.md#distributed-trainers-gloo-on-the-reference-engine):
- an update receives into fresh tensors first, then swaps them in between decode steps as an update
  from disk does (drain, flush, ``weight_version``); until the swap the old weights keep serving;
- a bad name, dtype or shape refuses the whole update (HTTP 400 naming it) and nothing changes;
- every group operation has a timeout; when a receive fails (timeout, the trainer died, bad metadata)
  the server destroys the group, since the trainer's collectives can no longer be matched: the trainer
  must open it again with ``/init_weights_update_group``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sparrow_server.engine.errors import EngineError, InvalidRequestError
from sparrow_server.engine.weights import WeightUpdateResult

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's
SGLANG_DEFAULT_BACKEND = "nccl"  # SGLang's default, which a CPU engine cannot use
FLATTENED_BUCKET = "flattened_bucket"  # SGLang's load_format: one uint8 broadcast holding every tensor
DISTRIBUTED_LOAD_FORMATS = (None, FLATTENED_BUCKET)
DEFAULT_GROUP_TIMEOUT_S = 300.0
MAX_PORT = 65535


class WeightGroupError(EngineError):
    """A group operation failed (HTTP 400). ``kind`` is the error type the HTTP body reports;
    ``field``/``value`` name the request field when one is at fault; ``group_destroyed``: the server
    closed the group, the trainer must call ``/init_weights_update_group`` again."""

    def __init__(self, message: str, kind: str = "weight_group_failed", field: str | None = None,
                 value: Any = None, group_destroyed: bool = False):
        self.kind = kind
        self.field = field
        self.value = value
        self.group_destroyed = group_destroyed
        super().__init__(message)


@dataclass(frozen=True)
class WeightGroupSpec:
    """``POST /init_weights_update_group`` (SGLang's ``InitWeightsUpdateGroupReqInput``). The trainer is
    rank 0; this server (one rank, tp 1) joins as ``rank_offset``."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = SGLANG_DEFAULT_BACKEND

    def __post_init__(self) -> None:
        if not self.master_address:
            raise InvalidRequestError("master_address", self.master_address, "must be a host name or address")
        if not 1 <= self.master_port <= MAX_PORT:
            raise InvalidRequestError("master_port", self.master_port, f"must be a TCP port in [1, {MAX_PORT}]")
        if self.world_size < 2:
            raise InvalidRequestError("world_size", self.world_size, "must be at least 2 (the trainer and this server)")
        if not 1 <= self.rank_offset < self.world_size:
            raise InvalidRequestError("rank_offset", self.rank_offset,
                                      f"must be in [1, world_size - 1 = {self.world_size - 1}]: rank 0 is the trainer")
        _check_group_name(self.group_name)

    @property
    def rank(self) -> int:
        return self.rank_offset  # + tp_rank, which is 0: one process


@dataclass(frozen=True)
class DistributedWeightUpdate:
    """``POST /update_weights_from_distributed`` (SGLang's ``UpdateWeightsFromDistributedReqInput``):
    the trainer broadcasts ``names[i]`` as a tensor of ``dtypes[i]`` (``"bfloat16"``...) and ``shapes[i]``,
    in this order. ``weight_version`` None = ``next_weight_version`` (as an update from disk)."""

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    group_name: str = DEFAULT_GROUP_NAME
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None

    def __post_init__(self) -> None:
        _check_group_name(self.group_name)
        if self.weight_version is not None and not self.weight_version:
            raise InvalidRequestError("weight_version", self.weight_version, "must be a non-empty string")


def _check_group_name(name: str) -> None:
    if not name:
        raise InvalidRequestError("group_name", name, "must be a non-empty name")


@runtime_checkable
class WeightGroups(Protocol):
    """What the group routes call; safe to call from the service's event loop. Blocking
    ``torch.distributed`` calls run on threads."""

    async def init_group(self, spec: WeightGroupSpec) -> str:
        """Join the group (returns SGLang's message); raises ``WeightGroupError`` (failed, timed out, or
        a backend this engine cannot run) or ``WeightSyncConflictError`` (a group of that name is open)."""

    async def update_from_group(self, update: DistributedWeightUpdate) -> WeightUpdateResult:
        """Receive the tensors, then swap them in; raises ``WeightGroupError`` (the old weights keep
        serving) or ``WeightSyncConflictError``."""

    async def destroy_group(self, group_name: str) -> str:
        """Leave and close the group; raises ``WeightGroupError`` when no such group is open."""

    def group_names(self) -> tuple[str, ...]: ...


__all__ = [
    "WeightGroups", "WeightGroupSpec", "DistributedWeightUpdate", "WeightGroupError", "DEFAULT_GROUP_NAME",
    "SGLANG_DEFAULT_BACKEND", "FLATTENED_BUCKET", "DISTRIBUTED_LOAD_FORMATS", "DEFAULT_GROUP_TIMEOUT_S",
]
