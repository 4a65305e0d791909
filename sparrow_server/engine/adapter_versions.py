"""Adapter lifecycle over any engine: immutable versioned names, aliases, drain-then-unload.

- ``load(name, path)`` checks the PEFT directory (LoRA, rank <= ``max_rank``, base fingerprint
  equal to the server's when both are known) and loads it under ``name``; names are immutable
  (an existing or draining name -> ``AdapterConflictError``, 409).
- ``set_alias(alias, name)`` switches an alias atomically; a request names a version or an alias.
- ``acquire(name_or_alias)`` runs once per request at admission: resolves the alias, refuses a
  draining version, counts the request in flight and returns the version; ``release`` ends it.
- ``unload(name)`` stops new requests at once, waits until the version has no request in flight,
  then unloads it from the engine. An alias still pointing at it -> 409 (move the alias first).
- With ``persist_dir`` the versions and aliases survive a restart (``registry.json``).

``engine.gated.GatedEngine`` wraps an engine so that every request goes through ``acquire``/``release``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sparrow_server.adapter_meta.metadata import AdapterArtifactError, AdapterMetadata, read_adapter_metadata
from sparrow_server.engine.base import Engine, EngineError, UnknownAdapterError
from sparrow_server.engine.ports import AdapterPort

log = logging.getLogger(__name__)

DEFAULT_MAX_LORA_RANK = 64
REGISTRY_FILE = "registry.json"
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class AdapterRequestError(EngineError, ValueError):
    """A bad adapter operation (HTTP 400/422): ``field`` names what was wrong, ``reason`` why."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field, self.value, self.reason = field_name, value, reason
        super().__init__(f"{field_name} = {value!r}: {reason}")


class AdapterConflictError(AdapterRequestError):
    """The name is taken, or the operation conflicts with the current state (HTTP 409)."""


@dataclass(frozen=True)
class AdapterVersion:
    name: str
    path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_fingerprint: str | None
    schedule_id: str | None
    loaded_at: float


class AdapterManager:
    """See the module docstring. Thread-safe; ``unload`` is a coroutine (it waits for the drain)."""

    def __init__(self, port: AdapterPort | None, max_rank: int = DEFAULT_MAX_LORA_RANK,
                 base_fingerprint: Callable[[], str | None] | None = None, persist_dir: str | Path | None = None):
        self.port = port  # None: the engine cannot load adapters at run time
        self.max_rank = max_rank
        self._fingerprint_fn = base_fingerprint or (lambda: None)
        self.persist_dir = Path(persist_dir) if persist_dir is not None else None
        self._versions: dict[str, AdapterVersion] = {}
        self._aliases: dict[str, str] = {}
        self._inflight: dict[str, int] = {}
        self._draining: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    # ----- queries ---------------------------------------------------------------------
    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(n for n in self._versions if n not in self._draining))

    def aliases(self) -> dict[str, str]:
        with self._lock:
            return dict(sorted(self._aliases.items()))

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**dataclasses.asdict(v), "target_modules": list(v.target_modules),
                     "in_flight": self._inflight.get(n, 0), "draining": n in self._draining,
                     "aliases": sorted(a for a, t in self._aliases.items() if t == n)}
                    for n, v in sorted(self._versions.items())]

    def resolve(self, name: str | None) -> str | None:
        """Version a request naming ``name`` (version or alias) would run on; UnknownAdapterError."""
        with self._lock:
            return self._resolve_locked(name)

    def _resolve_locked(self, name: str | None) -> str | None:
        if name is None:
            return None
        version = self._aliases.get(name, name)
        if version not in self._versions or version in self._draining:
            raise UnknownAdapterError(name, tuple(sorted(set(self._versions) - self._draining) + sorted(self._aliases)))
        return version

    # ----- requests --------------------------------------------------------------------
    def acquire(self, name: str | None) -> str | None:
        with self._lock:
            version = self._resolve_locked(name)
            if version is not None:
                self._inflight[version] = self._inflight.get(version, 0) + 1
            return version

    def release(self, version: str | None) -> None:
        if version is None:
            return
        with self._lock:
            self._inflight[version] -= 1
            assert self._inflight[version] >= 0, f"adapter {version!r} released more often than acquired"
            if not self._inflight[version]:
                self._idle.notify_all()

    # ----- lifecycle -------------------------------------------------------------------
    def load(self, name: str, path: str | Path, persist: bool = True) -> AdapterVersion:
        """Check and load ``path`` as version ``name`` (blocking: run it off the event loop)."""
        _check_name("name", name)
        with self._lock:
            if name in self._versions or name in self._aliases:
                raise AdapterConflictError("name", name, "is already loaded (or an alias); versions are immutable, "
                                           "load under a new name and move the alias")
        meta = self._check(path)
        try:
            self._port("path", str(path)).load_adapter(name, str(path))
        except EngineError:
            raise
        except Exception as exc:  # peft/safetensors refusing the files: a bad adapter, not a server fault
            raise AdapterRequestError("path", str(path), f"the engine could not load it: {exc}") from exc
        version = self._record(name, path, meta)
        if persist:
            self._save()
        return version

    def adopt_loaded(self) -> None:
        """Record as versions the adapters the engine loaded at start (``serve --adapter NAME=PATH``)."""
        for info in self.port.loaded_adapters() if self.port is not None else ():
            if info.name not in self._versions:
                self._record(info.name, info.path, self._check(info.path))

    def _port(self, field_name: str, value: Any) -> AdapterPort:
        if self.port is None:
            raise AdapterRequestError(field_name, value, "this engine cannot load adapters at run time")
        return self.port

    def _check(self, path: str | Path) -> AdapterMetadata:
        """The adapter's metadata, or AdapterRequestError naming what is wrong with it."""
        try:
            meta = read_adapter_metadata(path)
        except AdapterArtifactError as exc:
            raise AdapterRequestError("path", str(path), str(exc)) from None
        if meta.rank > self.max_rank:
            raise AdapterRequestError("path", str(path), f"LoRA rank {meta.rank} exceeds this server's maximum ({self.max_rank})")
        base = self._base_fingerprint()
        if meta.base_fingerprint is not None and base is not None and meta.base_fingerprint != base:
            raise AdapterRequestError("path", str(path), f"trained on another base model (fingerprint "
                                      f"{meta.base_fingerprint[:24]}..., this server runs {base[:24]}...)")
        return meta

    def _record(self, name: str, path: str | Path, meta: AdapterMetadata) -> AdapterVersion:
        version = AdapterVersion(name, str(path), meta.rank, meta.alpha, meta.target_modules, meta.base_fingerprint,
                                 meta.schedule_id, time.time())
        with self._lock:
            self._versions[name] = version
            self._inflight.setdefault(name, 0)
        return version

    def set_alias(self, alias: str, name: str) -> None:
        _check_name("alias", alias)
        with self._lock:
            if alias in self._versions:
                raise AdapterConflictError("alias", alias, "is the name of an adapter version")
            if name not in self._versions or name in self._draining:
                raise UnknownAdapterError(name, tuple(sorted(set(self._versions) - self._draining)))
            self._aliases[alias] = name
        self._save()

    def delete_alias(self, alias: str) -> None:
        with self._lock:
            if alias not in self._aliases:
                raise UnknownAdapterError(alias, tuple(sorted(self._aliases)))
            del self._aliases[alias]
        self._save()

    async def unload(self, name: str, timeout_s: float | None = None) -> AdapterVersion:
        """Stop new requests on ``name``, wait for its in-flight ones, then unload it."""
        with self._lock:
            if name not in self._versions or name in self._draining:
                raise UnknownAdapterError(name, tuple(sorted(set(self._versions) - self._draining)))
            pointing = sorted(a for a, t in self._aliases.items() if t == name)
            if pointing:
                raise AdapterConflictError("name", name, f"aliases {pointing} still point at it; move them first")
            self._draining.add(name)
        self._save()
        await asyncio.get_running_loop().run_in_executor(None, self._unload_when_idle, name, timeout_s)
        with self._lock:
            version = self._versions.pop(name)
            self._inflight.pop(name, None)
            self._draining.discard(name)
        return version

    def _unload_when_idle(self, name: str, timeout_s: float | None) -> None:
        with self._idle:
            if not self._idle.wait_for(lambda: self._inflight.get(name, 0) == 0, timeout_s):
                self._draining.discard(name)
                raise AdapterConflictError("name", name, f"still has {self._inflight[name]} request(s) in flight "
                                           f"after {timeout_s} s; it stays loaded")
        self._port("name", name).unload_adapter(name)

    def restore(self) -> list[str]:
        """Reload the persisted versions and aliases (at start-up); returns the problems, one per line."""
        if self.persist_dir is None or not (self.persist_dir / REGISTRY_FILE).is_file():
            return []
        data = json.loads((self.persist_dir / REGISTRY_FILE).read_text())
        problems = []
        for entry in data.get("versions", []):
            if entry.get("draining"):
                continue  # an unload that was cut short: finish it by not loading
            try:
                self.load(entry["name"], entry["path"], persist=False)
            except (EngineError, KeyError) as exc:
                problems.append(f"adapter {entry.get('name')!r} from {entry.get('path')!r} not restored: {exc}")
        with self._lock:
            for alias, name in data.get("aliases", {}).items():
                if name in self._versions:
                    self._aliases[alias] = name
        self._save()
        for p in problems:
            log.warning("%s", p)
        return problems

    def _base_fingerprint(self) -> str | None:
        """Recomputed at every load (cheap: a few values per parameter): weight updates change the base."""
        return self._fingerprint_fn()

    def _save(self) -> None:
        if self.persist_dir is None:
            return
        with self._lock:
            data = {"versions": [{"name": v.name, "path": v.path, "draining": v.name in self._draining}
                                 for v in self._versions.values()], "aliases": dict(self._aliases)}
        self.persist_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.persist_dir, prefix=f".{REGISTRY_FILE}.")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.persist_dir / REGISTRY_FILE)


def _check_name(field_name: str, name: Any) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= 128 or not set(name) <= _NAME_CHARS:
        raise AdapterRequestError(field_name, name, "must be 1-128 characters of letters, digits, '.', '_' or '-'")


def default_adapter_manager(engine: Engine, persist_dir: str | Path | None = None,
                            max_rank: int = DEFAULT_MAX_LORA_RANK) -> AdapterManager:
    """The manager a server builds: base fingerprint from the engine's model when it has one in
    process (the reference engine), adapters loaded at start adopted, persisted ones restored."""
    local = engine.local_model()

    def fingerprint() -> str | None:
        if local is None:
            return None
        from sparrow_server.adapter_meta.fingerprint import model_fingerprint  # torch: only with an in-process model

        return model_fingerprint(local.model)

    manager = AdapterManager(engine.adapter_port(), max_rank=max_rank, base_fingerprint=fingerprint, persist_dir=persist_dir)
    manager.adopt_loaded()
    manager.restore()
    return manager


__all__ = ["AdapterManager", "AdapterVersion", "default_adapter_manager", "AdapterRequestError", "AdapterConflictError",
           "DEFAULT_MAX_LORA_RANK"]
