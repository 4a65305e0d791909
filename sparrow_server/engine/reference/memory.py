"""``engine.memory`` of the reference engine: flush the KV pool, release and rebuild it, and
SGLang's weights checker on the serving parameters. Everything runs between loop steps (the
scheduler's ``step_lock``) and only on an idle engine, as SGLang requires."""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch

from sparrow_server.engine.memory import KV_CACHE, MemoryBusyError, MemoryReport, memory_tags
from sparrow_server.engine.reference.kv_cache import PagedKVCache
from sparrow_server.engine.reference.runner import ModelRunner
from sparrow_server.engine.reference.scheduler import Scheduler
from sparrow_server.engine.reference.weight_update import dense_parameters, flush_kv_cache


class ReferenceMemory:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, cache: PagedKVCache):
        self.scheduler = scheduler
        self.runner = runner
        self.cache = cache
        self._snapshot: dict[str, torch.Tensor] | None = None

    def flush_cache(self) -> bool:
        with self.scheduler.step_lock:
            if not self.scheduler.idle():
                return False
            if not self.cache.released:
                flush_kv_cache(self.cache)
            return True

    def release_memory(self, tags: Sequence[str]) -> MemoryReport:
        """Free the KV pool and landmarks (tag ``kv_cache``); new requests wait until resumed.
        Weights stay in memory: this engine has no memory saver."""
        tags = memory_tags(tags)
        with self.scheduler.step_lock:
            if not self.scheduler.idle():
                raise MemoryBusyError("release_memory_occupation needs an idle server: requests are live")
            if KV_CACHE in tags:
                self.cache.release()
        return _report(tags)

    def resume_memory(self, tags: Sequence[str]) -> MemoryReport:
        tags = memory_tags(tags)
        with self.scheduler.step_lock:
            if KV_CACHE in tags:
                self.cache.restore()
        self.scheduler.wake()  # queued requests may run now
        return _report(tags)

    def check_weights(self, action: str) -> dict[str, Any] | None:
        """SGLang 0.5.17's ``WeightChecker`` actions on the base parameters (LoRA tensors left out)."""
        with self.scheduler.step_lock:
            params = dense_parameters(self.runner.model)
            if action == "checksum":
                return _checksum(params)
            if action == "snapshot":
                self._snapshot = {name: t.detach().clone() for name, t in params.items()}
            elif action == "compare":
                _compare(self._snapshot, params)
            elif action == "reset_tensors":
                with torch.no_grad():
                    for t in params.values():
                        t.copy_(torch.randn_like(t))
            return None


def _report(tags: tuple[str, ...]) -> MemoryReport:
    return MemoryReport(changed=tuple(t for t in tags if t == KV_CACHE), kept=tuple(t for t in tags if t != KV_CACHE))


def _hash(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def _checksum(params: dict[str, torch.Tensor]) -> dict[str, Any]:
    checksums = {name: _hash(t) for name, t in params.items()}
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return {"checksums": checksums, "per_gpu_checksum": h.hexdigest(),
            "parallelism_info": {"tp_rank": 0, "tp_size": 1, "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": 1,
                                 "rank": 0, "size": 1}}


def _compare(snapshot: dict[str, torch.Tensor] | None, params: dict[str, torch.Tensor]) -> None:
    if snapshot is None:
        raise ValueError("compare needs a snapshot first (action snapshot)")
    differ = [name for name, t in params.items() if name not in snapshot or not torch.equal(snapshot[name], t)]
    if differ:
        raise ValueError(f"{len(differ)} tensors differ from the snapshot, e.g. {', '.join(differ[:3])}")
