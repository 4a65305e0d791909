"""What every generation route does around the service: check limits and take a slot, and collect
a non-streaming result unless the client leaves first."""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from fastapi import Request

from sparrow_server.server.admission import StreamSlot, admission_of, client_key
from sparrow_server.server.limits import check_rollout_limits

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
DISCONNECT_POLL_S = 0.25
CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs show it

T = TypeVar("T")


async def admit(request: Request, *rollouts) -> StreamSlot:
    """Check the configured request limits of each rollout (422), then take one slot (429 / 503)."""
    for rollout in rollouts:
        check_rollout_limits(request.app.state.limits, rollout)
    return await admission_of(request).acquire(client_key(request))


async def unless_disconnected(work: Awaitable[T], request: Request) -> T | None:
    """Await ``work``; if the client goes away first, cancel it (which aborts its generations) -> None."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                return None
    finally:  # disconnected, or this coroutine cancelled (timeout, shutdown): abort the generation
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
