"""The server's state directory: what survives a restart (registered schedules, adapters, autopilot
configs and schedule version history)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparrow_server.models import user_cache_dir


def default_state_dir() -> Path:
    return user_cache_dir() / "state"


@dataclass(frozen=True)
class StateDir:
    root: Path

    @property
    def schedules(self) -> Path:
        return self.root / "schedules"

    @property
    def adapters(self) -> Path:
        return self.root / "adapters"

    @property
    def autopilot(self) -> Path:
        return self.root / "autopilot"

    def create(self) -> "StateDir":
        for d in (self.root, self.schedules, self.adapters, self.autopilot):
            d.mkdir(parents=True, exist_ok=True)
        return self
