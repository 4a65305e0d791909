"""The LoRA adapters loaded into the reference engine's model (peft): attach/detach by name from a
PEFT directory. Versions, aliases and drain-then-unload are ``engine.adapter_versions``' job."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sparrow_server.engine.base import InvalidRequestError, UnknownAdapterError
from sparrow_server.engine.ports import LoadedAdapter
from sparrow_server.models import user_path


class PeftAdapterSlots:
    """Name -> loaded adapter. ``attach`` wraps the base model in a peft ``PeftModel`` on first use."""

    def __init__(self) -> None:
        self._adapters: dict[str, LoadedAdapter] = {}
        self._lock = threading.Lock()

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._adapters))

    def loaded(self) -> tuple[LoadedAdapter, ...]:
        with self._lock:
            return tuple(self._adapters[n] for n in sorted(self._adapters))

    def resolve(self, name: str | None) -> str | None:
        if name is None:
            return None
        with self._lock:
            if name in self._adapters:
                return name
        raise UnknownAdapterError(name, self.names())

    def attach(self, model: Any, name: str, path: str | Path) -> Any:
        """Load the PEFT directory ``path`` as adapter ``name`` into ``model``; returns the model to run."""
        try:
            path = user_path(path)
        except ValueError as exc:
            raise InvalidRequestError("adapter.path", str(path), str(exc)) from None
        if not (path / "adapter_config.json").is_file():
            raise InvalidRequestError("adapter.path", str(path), "is not a PEFT adapter directory (no adapter_config.json)")
        with self._lock:
            if name in self._adapters:
                raise InvalidRequestError("adapter.name", name, "is already loaded")
        from peft import PeftModel

        if hasattr(model, "peft_config"):
            model.load_adapter(str(path), adapter_name=name)
        else:
            model = PeftModel.from_pretrained(model, str(path), adapter_name=name)
        model.eval()
        with self._lock:
            self._adapters[name] = LoadedAdapter(name, str(path))
        return model

    def detach(self, model: Any, name: str) -> Any:
        """Unload adapter ``name`` from ``model``; returns the model to run (the plain base model once
        the last adapter is gone: peft cannot run a ``PeftModel`` with no adapter)."""
        with self._lock:
            if name not in self._adapters:
                raise UnknownAdapterError(name, tuple(sorted(self._adapters)))
        if len(model.peft_config) == 1:
            model = model.unload()  # removes the LoRA layers, returns the base model
        else:
            model.delete_adapter(name)
        model.eval()
        with self._lock:
            del self._adapters[name]
        return model
