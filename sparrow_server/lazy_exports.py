"""A package's public names imported on first use (PEP 562 ``__getattr__``), so that importing one
light submodule (what a CLI parser reads for its defaults) does not pull torch through the package's
``__init__``."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` for ``exports`` (defining module -> public names)."""
    owner = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(owner[name]), name)

    return __getattr__
