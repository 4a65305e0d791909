"""One request the reference engine has accepted and not yet finished: its state and its way back
to the caller (an asyncio queue on the caller's event loop)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from sparrow_server.engine.base import DEFAULT_WEIGHT_VERSION, GenerationChunk, GenerationRequest
from sparrow_server.engine.reference.kv_cache import PageTable
from sparrow_server.sparsity.schedule import Schedule


@dataclass(eq=False)  # identity: the queues find and remove this very request
class LiveRequest:
    """Mutable state of one live request; after admission only the thread holding the step lock
    touches it (the loop, or a caller between steps)."""

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
    step_pages: int = 0  # this decode step's attended pages at a sparse layer (the engine's ``_plan_row``)
    step_budget: int = 0  # ... and its kv_budget_tokens

    @property
    def rid(self) -> str:
        return self.request.rid

    @property
    def prompt_len(self) -> int:
        return len(self.request.input_ids)

    def chunk(self, **fields) -> GenerationChunk:
        return GenerationChunk(rid=self.rid, prompt_tokens=self.prompt_len, completion_tokens=len(self.output),
                               adapter=self.adapter, weight_version=self.weight_version, **fields)

    def send(self, chunk: GenerationChunk) -> None:
        """Hand ``chunk`` to the caller's event loop (from any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, chunk)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            pass


__all__ = ["LiveRequest"]
