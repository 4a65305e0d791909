"""Publish a trained adapter to a fleet of servers: on each server, load it under a new immutable
version name (``POST /adapters``), move the alias to it (``PUT /adapters/aliases/{alias}``), then
unload the version the alias pointed at before (``DELETE /adapters/{old}``, which returns once the
old version's in-flight requests have ended). Requests naming the alias switch atomically; none
fails. The adapter path must be readable by every server (shared storage, inside its --adapter-root).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import httpx

DEFAULT_ALIAS = "distill-latest"
API_KEY_ENV = "SPARROW_API_KEY"
DRAIN_TIMEOUT_S = 600.0  # DELETE waits for the old version's requests to end


class PublishError(RuntimeError):
    """Some servers failed; ``failures`` maps each server URL to its error (the others published)."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        super().__init__("; ".join(f"{url}: {msg}" for url, msg in failures.items()))


@dataclass(frozen=True)
class Published:
    server: str
    name: str
    alias: str
    previous: str | None  # the version the alias pointed at before (now unloaded), if any


def publish(servers: Sequence[str], name: str, path: str, alias: str = DEFAULT_ALIAS,
            api_key: str | None = None, unload_previous: bool = True) -> list[Published]:
    """Publish on every server (one after another); raises ``PublishError`` naming the failed ones."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    done, failures = [], {}
    for url in servers:
        try:
            with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=DRAIN_TIMEOUT_S) as client:
                done.append(_publish_one(client, url, name, path, alias, unload_previous))
        except (httpx.HTTPError, _ServerRefused) as exc:
            failures[url] = str(exc)
    if failures:
        raise PublishError(failures)
    return done


class _ServerRefused(Exception):
    pass


def _publish_one(client: httpx.Client, url: str, name: str, path: str, alias: str, unload_previous: bool) -> Published:
    previous = _check(client.get("/adapters"), "GET /adapters").json().get("aliases", {}).get(alias)
    _check(client.post("/adapters", json={"name": name, "path": path}), "POST /adapters")
    _check(client.put(f"/adapters/aliases/{alias}", json={"name": name}), f"PUT /adapters/aliases/{alias}")
    if unload_previous and previous is not None and previous != name:
        _check(client.delete(f"/adapters/{previous}"), f"DELETE /adapters/{previous}")
    return Published(url, name, alias, previous)


def _check(response: httpx.Response, what: str) -> httpx.Response:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        raise _ServerRefused(f"{what} -> {response.status_code}: {message}")
    return response
