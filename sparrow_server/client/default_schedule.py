"""Fleet-wide default schedule: ``set_default_schedule(urls, name)`` posts ``/default_schedule`` to
every server at once, so a trainer that cannot name a schedule per request (slime main behind
sglang-router) switches the whole fleet between steps. Replies and failures as ``update_weights``."""
from __future__ import annotations

from typing import Any

from sparrow_server.client.common import DEFAULT_TIMEOUT_S
from sparrow_server.client.weights import Urls, apost_all, post_all


def set_default_schedule(urls: Urls, name: str, *, api_key: str | None = None,
                         timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Make ``name`` (registered on every server) the schedule of requests that name none."""
    return post_all("set_default_schedule", urls, "/default_schedule", {"name": name}, api_key, timeout)


async def async_set_default_schedule(urls: Urls, name: str, *, api_key: str | None = None,
                                     timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    return await apost_all("set_default_schedule", urls, "/default_schedule", {"name": name}, api_key, timeout)


__all__ = ["set_default_schedule", "async_set_default_schedule"]
