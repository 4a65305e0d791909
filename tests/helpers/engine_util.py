"""Running reference-engine requests from synchronous tests."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sparrow_server.engine.base import FinishReason, GenerationRequest


@dataclass
class Collected:
    tokens: list[int]
    logprobs: list[float]
    selections: list[Any]
    budgets: list[int | None]
    top: list[Any]
    finish: FinishReason
    adapter: str | None


async def collect(engine, request: GenerationRequest) -> Collected:
    tokens, logprobs, selections, budgets, top = [], [], [], [], []
    last = None
    async for chunk in engine.submit(request):
        tokens += chunk.token_ids
        logprobs += chunk.logprobs
        selections += chunk.selected_pages or []
        budgets += chunk.kv_budget_tokens
        top += chunk.top_logprobs or []
        last = chunk
    return Collected(tokens, logprobs, selections, budgets, top, last.finish, last.adapter)


def run_requests(engine, *requests: GenerationRequest) -> list[Collected]:
    """Submit all requests concurrently (they share decode batches) and wait for all."""

    async def main():
        await engine.start()
        return await asyncio.gather(*(collect(engine, r) for r in requests))

    return asyncio.run(main())
