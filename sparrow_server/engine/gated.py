"""The engine the service runs: the configured engine behind the adapter version gate."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import AsyncIterator

from sparrow_server.engine.adapter_versions import AdapterManager
from sparrow_server.engine.base import Engine, EngineHealth, EngineInfo, GenerationChunk, GenerationRequest
from sparrow_server.engine.memory import MemoryControl
from sparrow_server.engine.ports import AdapterPort, DenseScoring, LocalModel
from sparrow_server.engine.weight_groups import WeightGroups
from sparrow_server.engine.weights import WeightSync
from sparrow_server.sparsity.schedule import Schedule


class GatedEngine(Engine):
    """An engine whose requests resolve their adapter (alias -> version) once, at admission, through
    ``AdapterManager.acquire``, run on that version, and release it when they end. Everything else
    is delegated to the wrapped engine, method by method."""

    def __init__(self, engine: Engine, manager: AdapterManager):
        self._engine = engine
        self.adapter_manager = manager

    @property
    def default_schedule_fixed_at_start(self) -> bool:  # type: ignore[override]
        return self._engine.default_schedule_fixed_at_start

    # ----- what the gate changes -----------------------------------------------------------
    def adapters(self) -> tuple[str, ...]:
        return self.adapter_manager.names()

    def resolve_adapter(self, name: str | None) -> str | None:
        return self.adapter_manager.resolve(name)

    def validate(self, request: GenerationRequest) -> None:
        self._engine.validate(dataclasses.replace(request, adapter=self.adapter_manager.resolve(request.adapter)))

    async def submit(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        version = self.adapter_manager.acquire(request.adapter)
        try:
            async with contextlib.aclosing(self._engine.submit(dataclasses.replace(request, adapter=version))) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            self.adapter_manager.release(version)

    # ----- delegated -----------------------------------------------------------------------
    async def start(self) -> None:
        await self._engine.start()

    async def shutdown(self) -> None:
        await self._engine.shutdown()

    async def abort(self, rid: str) -> bool:
        return await self._engine.abort(rid)

    def live_requests(self) -> tuple[str, ...]:
        return self._engine.live_requests()

    def health(self) -> EngineHealth:
        return self._engine.health()

    def info(self) -> EngineInfo:
        return self._engine.info()

    def check_schedule(self, schedule: Schedule) -> None:
        self._engine.check_schedule(schedule)

    def adapter_port(self) -> AdapterPort | None:
        return self._engine.adapter_port()

    def weights(self) -> WeightSync | None:
        return self._engine.weights()

    def weight_groups(self) -> WeightGroups | None:
        return self._engine.weight_groups()

    def memory_control(self) -> MemoryControl | None:
        return self._engine.memory_control()

    def local_model(self) -> LocalModel | None:
        return self._engine.local_model()

    def dense_scoring(self) -> DenseScoring | None:
        return self._engine.dense_scoring()

    def max_running_requests(self) -> int | None:
        return self._engine.max_running_requests()


__all__ = ["GatedEngine"]
