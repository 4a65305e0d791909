"""Graceful shutdown: stop admitting, let streams finish, abort the rest with an error event, exit.

On SIGTERM or SIGINT, ``GracefulServer`` (a ``uvicorn.Server``) first ``drain``s the app:

1. admission closes: every new request, ``/health`` included (so load balancers stop routing
   here), answers 503 with ``Retry-After`` (``DrainMiddleware``); queued requests get 503 too;
2. in-flight streams get up to ``Limits.drain_timeout_s`` to finish normally;
3. streams still running are aborted: each ends with one final event
   ``{"error": {"type": "shutdown", ...}, "done": true}`` and its generation is aborted;

then uvicorn closes the listeners and connections, the app's lifespan shuts the engine down and
the process exits (uvicorn re-raises the signal it caught, so the exit status is that of SIGTERM).
A second SIGINT skips the wait.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from sparrow_server.server.admission import Admission, ShuttingDownError
from sparrow_server.server.errors import error_response

log = logging.getLogger(__name__)
POLL_S = 0.05
ABORT_GRACE_S = 5.0  # time for aborted streams to send their final event
UVICORN_CLOSE_TIMEOUT_S = 5.0
SHUTDOWN_REASON = "shutdown"


async def drain(admission: Admission, timeout_s: float, force: Callable[[], bool] = lambda: False) -> int:
    """Close admission, wait up to ``timeout_s`` for streams to end, abort the rest; returns how many were aborted."""
    admission.close()
    deadline = time.monotonic() + timeout_s
    if admission.active:
        log.info("draining %d in-flight request(s) for up to %.1f s", len(admission.active), timeout_s)
    while admission.active and time.monotonic() < deadline and not force():
        await asyncio.sleep(POLL_S)
    aborted = admission.abort_all(SHUTDOWN_REASON)
    if aborted:
        log.warning("aborting %d request(s) still running after the drain timeout", aborted)
    deadline = time.monotonic() + ABORT_GRACE_S
    while admission.active and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    return aborted


class DrainMiddleware:
    """ASGI middleware: 503 for every HTTP request once admission is closed."""

    def __init__(self, app: Any, admission: Admission, retry_after_s: int):
        self.app = app
        self.admission = admission
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http" and self.admission.closed:
            response = error_response(503, "shutting_down", str(ShuttingDownError("the server is shutting down")))
            response.headers["Retry-After"] = str(self.retry_after_s)
            response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def install_shutdown(app: Any, admission: Admission, retry_after_s: int) -> None:
    app.add_middleware(DrainMiddleware, admission=admission, retry_after_s=retry_after_s)


def make_server(app: Any, host: str, port: int, log_level: str, drain_timeout_s: float):
    """A ``uvicorn.Server`` whose shutdown drains ``app`` first (``app.state.admission``)."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            await drain(app.state.admission, drain_timeout_s, force=lambda: self.force_exit)
            await super().shutdown(sockets)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=UVICORN_CLOSE_TIMEOUT_S)
    return GracefulServer(config)


__all__ = ["drain", "DrainMiddleware", "install_shutdown", "make_server", "SHUTDOWN_REASON"]
