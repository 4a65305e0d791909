"""The server's state directory: what survives a restart (registered schedules now; adapters later)."""
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

    def create(self) -> "StateDir":
        for d in (self.root, self.schedules, self.adapters):
            d.mkdir(parents=True, exist_ok=True)
        return self
