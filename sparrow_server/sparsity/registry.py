"""Name -> schedule resolution: the built-in ``dense`` schedule, the paper's presets, and
schedules registered at run time (optionally persisted as JSON files).

Usage (what the server does)::

    registry = ScheduleRegistry.load(persist_dir=state_dir / "schedules")  # built-ins + saved ones
    registry.register(schedule, persist=True)    # validates, refuses built-in names, saves <name>.json
    schedule = registry.get("qwen3-1.7b-0.86")   # or "qwen3-1.7b-0.86@1"; UnknownScheduleError if absent
    registry.names()                             # sorted names, built-ins included

- Built-ins (``dense`` and every ``presets/*.json`` shipped in this package) can never be
  replaced or removed.
- Registering a schedule equal to the one already under that name is a no-op; a different
  schedule under a taken user name needs ``replace=True``.
- ``persist=True`` writes ``<persist_dir>/<name>.json`` atomically (temporary file, then rename);
  ``ScheduleRegistry.load(persist_dir=...)`` reads every ``*.json`` there back, refusing an
  invalid file (or one whose ``name`` is not its file name, or is a built-in) with a
  ``ScheduleError`` that names the file and the bad field.
- All methods are thread-safe.
"""
from __future__ import annotations

import os
import tempfile
import threading
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterator

from sparrow_server.sparsity.schedule import (
    DENSE_SCHEDULE_NAME,
    Schedule,
    ScheduleError,
    dense_schedule,
    dump_schedule,
    load_schedule,
    parse_schedule_text,
)

PRESETS_PACKAGE = "sparrow_server.sparsity"
PRESETS_DIR = "presets"


class UnknownScheduleError(KeyError):
    """No schedule of that name. ``name`` is the name asked for."""

    def __init__(self, name: str, known: tuple[str, ...] = ()):
        self.name = name
        self.known = known
        super().__init__(name)

    def __str__(self) -> str:
        hint = f" (known: {', '.join(self.known)})" if self.known else ""
        return f"unknown schedule {self.name!r}{hint}"


@lru_cache(maxsize=1)
def builtin_schedules() -> tuple[Schedule, ...]:
    """``dense`` followed by the shipped presets, sorted by name."""
    presets = []
    for entry in resources.files(PRESETS_PACKAGE).joinpath(PRESETS_DIR).iterdir():
        if entry.name.endswith(".json"):
            schedule = parse_schedule_text(entry.read_text())
            if schedule.name + ".json" != entry.name:
                raise ScheduleError("name", schedule.name, f"does not match its preset file {entry.name}")
            presets.append(schedule)
    return (dense_schedule(), *sorted(presets, key=lambda s: s.name))


def preset_names() -> tuple[str, ...]:
    """Names of the shipped presets (``dense`` excluded)."""
    return tuple(s.name for s in builtin_schedules() if s.name != DENSE_SCHEDULE_NAME)


class ScheduleRegistry:
    """Thread-safe mapping of schedule names to schedules (see the module docstring)."""

    def __init__(self, persist_dir: str | Path | None = None):
        self._builtin = {s.name: s for s in builtin_schedules()}
        self._user: dict[str, Schedule] = {}
        self._persist_dir = Path(persist_dir) if persist_dir is not None else None
        self._lock = threading.RLock()

    @classmethod
    def load(cls, persist_dir: str | Path | None = None) -> "ScheduleRegistry":
        """Built-ins plus every ``*.json`` schedule saved in ``persist_dir`` (created if missing)."""
        registry = cls(persist_dir)
        if registry._persist_dir is None:
            return registry
        registry._persist_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(registry._persist_dir.glob("*.json")):
            try:
                schedule = load_schedule(path)
                if schedule.name != path.stem:  # unregister() deletes <name>.json: keep them in step
                    raise ScheduleError("name", schedule.name, f"does not match its file name {path.name}")
                registry.register(schedule)
            except ScheduleError as exc:
                raise ScheduleError(exc.field, exc.value, f"{exc.reason} (in {path})") from exc
        return registry

    @property
    def persist_dir(self) -> Path | None:
        return self._persist_dir

    def get(self, name: str) -> Schedule:
        """Schedule named ``name`` (``name@version`` also accepted). Raises ``UnknownScheduleError``."""
        base, _, version = name.partition("@")
        with self._lock:
            schedule = self._user.get(base) or self._builtin.get(base)
        if schedule is None or (version and version != str(schedule.version)):
            raise UnknownScheduleError(name, self.names())
        return schedule

    def __getitem__(self, name: str) -> Schedule:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.get(name)
        except UnknownScheduleError:
            return False
        return True

    def __iter__(self) -> Iterator[Schedule]:
        return iter(self.schedules())

    def __len__(self) -> int:
        with self._lock:
            return len(self._builtin) + len(self._user)

    def names(self) -> tuple[str, ...]:
        """Every resolvable name, sorted (``dense`` first)."""
        with self._lock:
            rest = sorted((set(self._builtin) | set(self._user)) - {DENSE_SCHEDULE_NAME})
        return (DENSE_SCHEDULE_NAME, *rest)

    def schedules(self) -> tuple[Schedule, ...]:
        return tuple(self.get(n) for n in self.names())

    def is_builtin(self, name: str) -> bool:
        return name.partition("@")[0] in self._builtin

    def register(self, schedule: Schedule, persist: bool = False, replace: bool = False) -> Schedule:
        """Add a user schedule (already validated by ``Schedule``); returns it.

        Raises ``ScheduleError`` on field ``name`` for a built-in name, or for a taken user name
        with different content unless ``replace``; ``persist`` needs a ``persist_dir``.
        """
        if not isinstance(schedule, Schedule):
            raise ScheduleError("<root>", type(schedule).__name__, "register() takes a Schedule")
        if self.is_builtin(schedule.name):
            raise ScheduleError("name", schedule.name, "is a built-in schedule and cannot be replaced")
        if persist and self._persist_dir is None:
            raise ValueError("persist=True needs a registry created with a persist_dir")
        with self._lock:
            current = self._user.get(schedule.name)
            if current is not None and current != schedule and not replace:
                raise ScheduleError(
                    "name", schedule.name, "is already registered with different content (pass replace=True)"
                )
            if persist:  # saved first: a failed write leaves nothing registered
                self._write(schedule)
            self._user[schedule.name] = schedule
        return schedule

    def unregister(self, name: str) -> Schedule:
        """Remove a user schedule (and its persisted file). Built-ins are refused."""
        if self.is_builtin(name):
            raise ScheduleError("name", name, "is a built-in schedule and cannot be removed")
        with self._lock:
            schedule = self._user.pop(name, None)
            if schedule is None:
                raise UnknownScheduleError(name, self.names())
            if self._persist_dir is not None:
                (self._persist_dir / f"{name}.json").unlink(missing_ok=True)
        return schedule

    def _write(self, schedule: Schedule) -> None:
        assert self._persist_dir is not None
        self._persist_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self._persist_dir, prefix=f".{schedule.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(dump_schedule(schedule))
            os.replace(tmp, self._persist_dir / f"{schedule.name}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


__all__ = ["ScheduleRegistry", "UnknownScheduleError", "builtin_schedules", "preset_names"]
