"""Fleet-wide weight updates from the trainer: ``update_weights``, ``pause`` and ``resume``, each
sent to every server of a list at once (sync, and ``async_*`` twins).

Between RL steps::

    from sparrow_server.client import pause, resume, update_weights
    update_weights(urls, "/ckpt/step-42", weight_version="42")   # waits for in-flight rollouts

or, to cut the step short: ``pause(urls, "abort")``, ``update_weights(...)``, ``resume(urls)``.

Every call waits for all servers and returns ``{url: reply}``; if any server failed it raises
``FleetError`` (after all have answered) with the replies and the failures, so the trainer can
see which servers run which version.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import httpx

from sparrow_server.client.common import DEFAULT_TIMEOUT_S, raise_for_status

Urls = str | Sequence[str]


class FleetError(Exception):
    """Some servers failed. ``results``: url -> reply of those that succeeded; ``failures``: url -> exception;
    ``pending``: servers whose answer had not come when the caller stopped waiting (a failure elsewhere
    ended the wait); ``trainer_error``: the failure of the caller's own side of a collective. The message
    names every server of the call."""

    def __init__(self, action: str, results: dict[str, Any], failures: dict[str, Exception],
                 pending: Sequence[str] = (), trainer_error: BaseException | None = None):
        self.results = results
        self.failures = failures
        self.pending = list(pending)
        self.trainer_error = trainer_error
        total = len(results) + len(failures) + len(self.pending)
        parts = [f"{url}: {exc}" for url, exc in failures.items()]
        parts += [f"no answer yet from {', '.join(self.pending)}"] if self.pending else []
        parts += [f"the trainer's side (rank 0): {trainer_error}"] if trainer_error is not None else []
        super().__init__(f"{action} failed on {len(failures)} of {total} servers: {'; '.join(parts)}")


def update_payload(model_path: str, *, weight_version: str | None = None, load_format: str | None = None,
                   flush_cache: bool = True, abort_all_requests: bool = False, keep_pause: bool = False) -> dict[str, Any]:
    """``POST /update_weights_from_disk`` body (SGLang's shape)."""
    body: dict[str, Any] = {"model_path": model_path, "flush_cache": flush_cache,
                            "abort_all_requests": abort_all_requests, "keep_pause": keep_pause}
    if weight_version is not None:
        body["weight_version"] = weight_version
    if load_format is not None:
        body["load_format"] = load_format
    return body


def url_list(urls: Urls) -> list[str]:
    out = [urls] if isinstance(urls, str) else list(urls)
    if not out:
        raise ValueError("urls: give at least one server URL")
    return [u.rstrip("/") for u in out]


def admin_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _split(action: str, urls: list[str], outcomes: list[Any]) -> dict[str, Any]:
    results = {u: o for u, o in zip(urls, outcomes) if not isinstance(o, Exception)}
    failures = {u: o for u, o in zip(urls, outcomes) if isinstance(o, Exception)}
    if failures:
        raise FleetError(action, results, failures)
    return results


def post_all(action: str, urls: Urls, path: str, body: dict[str, Any], api_key: str | None, timeout: float) -> dict[str, Any]:
    """POST ``body`` to ``path`` on every server at once; each server's reply, or ``FleetError``."""
    servers = url_list(urls)

    def one(url: str) -> Any:
        try:
            response = httpx.post(f"{url}{path}", json=body, headers=admin_headers(api_key), timeout=timeout)
            raise_for_status(response)
            return response.json()
        except Exception as exc:  # reported per server in FleetError
            return exc

    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        return _split(action, servers, list(pool.map(one, servers)))


async def apost_all(action: str, urls: Urls, path: str, body: dict[str, Any], api_key: str | None,
                    timeout: float) -> dict[str, Any]:
    """``post_all`` for asyncio callers."""
    servers = url_list(urls)
    async with httpx.AsyncClient(timeout=timeout, headers=admin_headers(api_key)) as http:
        async def one(url: str) -> Any:
            response = await http.post(f"{url}{path}", json=body)
            raise_for_status(response)
            return response.json()

        outcomes = await asyncio.gather(*(one(u) for u in servers), return_exceptions=True)
    return _split(action, servers, list(outcomes))


def update_weights(urls: Urls, model_path: str, *, weight_version: str | None = None, load_format: str | None = None,
                   flush_cache: bool = True, abort_all_requests: bool = False, keep_pause: bool = False,
                   api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Load ``model_path`` on every server; pass the same ``weight_version`` (e.g. the trainer step)
    so that the fleet agrees on it."""
    body = update_payload(model_path, weight_version=weight_version, load_format=load_format, flush_cache=flush_cache,
                          abort_all_requests=abort_all_requests, keep_pause=keep_pause)
    return post_all("update_weights", urls, "/update_weights_from_disk", body, api_key, timeout)


def pause(urls: Urls, mode: str = "abort", *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """``POST /pause_generation`` on every server (``abort`` | ``retract`` | ``in_place``)."""
    return post_all("pause", urls, "/pause_generation", {"mode": mode}, api_key, timeout)


def resume(urls: Urls, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """``POST /continue_generation`` on every server."""
    return post_all("resume", urls, "/continue_generation", {}, api_key, timeout)


async def async_update_weights(urls: Urls, model_path: str, *, weight_version: str | None = None,
                               load_format: str | None = None, flush_cache: bool = True,
                               abort_all_requests: bool = False, keep_pause: bool = False, api_key: str | None = None,
                               timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    body = update_payload(model_path, weight_version=weight_version, load_format=load_format, flush_cache=flush_cache,
                          abort_all_requests=abort_all_requests, keep_pause=keep_pause)
    return await apost_all("update_weights", urls, "/update_weights_from_disk", body, api_key, timeout)


async def async_pause(urls: Urls, mode: str = "abort", *, api_key: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    return await apost_all("pause", urls, "/pause_generation", {"mode": mode}, api_key, timeout)


async def async_resume(urls: Urls, *, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    return await apost_all("resume", urls, "/continue_generation", {}, api_key, timeout)


__all__ = ["update_weights", "pause", "resume", "async_update_weights", "async_pause", "async_resume", "FleetError",
           "update_payload", "post_all", "apost_all"]
