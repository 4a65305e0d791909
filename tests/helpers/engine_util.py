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
    prompt_logprobs: list[float | None] | None = None
    prompt_top: list[Any] | None = None


async def collect(engine, request: GenerationRequest) -> Collected:
    tokens, logprobs, selections, budgets, top = [], [], [], [], []
    last, prompt_logprobs, prompt_top = None, None, None
    async for chunk in engine.submit(request):
        if chunk.prompt_logprobs is not None:
            assert prompt_logprobs is None, "prompt logprobs arrive once"
            prompt_logprobs, prompt_top = list(chunk.prompt_logprobs), chunk.prompt_top_logprobs
        tokens += chunk.token_ids
        logprobs += chunk.logprobs
        selections += chunk.selected_pages or []
        budgets += chunk.kv_budget_tokens
        top += chunk.top_logprobs or []
        last = chunk
    return Collected(tokens, logprobs, selections, budgets, top, last.finish, last.adapter, prompt_logprobs,
                     list(prompt_top) if prompt_top is not None else None)


def run_requests(engine, *requests: GenerationRequest) -> list[Collected]:
    """Submit all requests concurrently (they share decode batches) and wait for all."""

    async def main():
        await engine.start()
        return await asyncio.gather(*(collect(engine, r) for r in requests))

    return asyncio.run(main())


def scenario(engine, coro_fn):
    """Start the engine, run ``coro_fn()`` on its event loop, shut the engine down; returns its result."""

    async def main():
        await engine.start()
        try:
            return await coro_fn()
        finally:
            await engine.shutdown()

    return asyncio.run(main())
