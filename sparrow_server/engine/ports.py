"""Optional capabilities of an engine, each a typed port ``Engine`` hands out or answers ``None``
for (the service asks, it never probes attributes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class LoadedAdapter:
    """One LoRA adapter in the engine, under the name requests use."""

    name: str
    path: str


@runtime_checkable
class AdapterPort(Protocol):
    """Loading LoRA adapters into a running engine (blocking: the version manager calls it off the loop)."""

    def load_adapter(self, name: str, path: str) -> None: ...

    def unload_adapter(self, name: str) -> None: ...

    def loaded_adapters(self) -> tuple[LoadedAdapter, ...]:
        """The adapters loaded now (at start: ``serve --adapter NAME=PATH``)."""
        ...


__all__ = ["AdapterPort", "LoadedAdapter"]
