"""Every published version of a schedule, with why it was published (JSON lines, append-only).

``ScheduleHistory(root)`` keeps, per schedule name, the list of versions that were served:
each record holds the version's full schedule, when and by whom it was published (``source``:
``put``, ``autopilot``, ``fleet``), the weight version it was decided under, and for autopilot
versions the per-bin changes with their evidence (``BudgetChange.to_dict``). With a ``root`` the
records are appended to ``<root>/<name>.jsonl`` (one line each, flushed and fsynced) and read back
at start, so the history survives restarts; without one it lives in memory.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from sparrow_server.sparsity.schedule import Schedule, schedule_from_dict

SOURCES = ("put", "autopilot", "fleet")


class ScheduleHistory:
    """Thread-safe per-schedule version records (module docstring)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else None
        self._records: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            for path in sorted(self.root.glob("*.jsonl")):
                lines = [line for line in path.read_text().splitlines() if line.strip()]
                self._records[path.stem] = [json.loads(line) for line in lines]

    def record(self, schedule: Schedule, source: str, changes: Sequence[dict[str, Any]] = (),
               weight_version: str | None = None) -> dict[str, Any]:
        """Append the record of a newly served version (a re-record of the last version is skipped)."""
        if source not in SOURCES:
            raise ValueError(f"source = {source!r}: must be one of {SOURCES}")
        entry = {"version": schedule.version, "published_at": time.time(), "source": source,
                 "weight_version": weight_version, "schedule": schedule.to_dict(), "changes": list(changes)}
        with self._lock:
            records = self._records.setdefault(schedule.name, [])
            if records and records[-1]["schedule"] == entry["schedule"]:
                return records[-1]
            records.append(entry)
            if self.root is not None:
                with open(self.root / f"{schedule.name}.jsonl", "a") as f:
                    f.write(json.dumps(entry) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        return entry

    def records(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._records.get(name, ()))

    def version(self, name: str, version: int) -> Schedule | None:
        """The schedule as served at ``version`` (the latest record of that version), or ``None``."""
        for entry in reversed(self.records(name)):
            if entry["version"] == version:
                return schedule_from_dict(entry["schedule"])
        return None


__all__ = ["ScheduleHistory", "SOURCES"]
