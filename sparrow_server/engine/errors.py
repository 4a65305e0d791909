"""The errors an engine raises on a request, each mapped to its HTTP status by ``server/errors.py``.
Re-exported by ``engine.base``, the engine interface."""
from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base of every error an engine raises on a request."""


class InvalidRequestError(EngineError, ValueError):
    """A request field with a bad value (HTTP 422). ``field`` names it, ``value`` is its value."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field = field_name
        self.value = value
        self.reason = reason
        super().__init__(f"{field_name} = {value!r}: {reason}")


class ContextLengthError(EngineError, ValueError):
    """Prompt plus ``max_new_tokens`` does not fit the model's context (HTTP 400)."""

    def __init__(self, prompt_tokens: int, max_new_tokens: int, context_length: int, what: str = "context length"):
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length
        super().__init__(
            f"prompt_tokens ({prompt_tokens}) + max_new_tokens ({max_new_tokens}) = "
            f"{prompt_tokens + max_new_tokens} exceeds the model's {what} ({context_length})"
        )


class UnknownAdapterError(EngineError, KeyError):
    """No adapter of that name (HTTP 404)."""

    def __init__(self, name: str, known: tuple[str, ...] = ()):
        self.name = name
        self.known = known
        super().__init__(name)

    def __str__(self) -> str:
        return f"unknown adapter {self.name!r} (loaded: {', '.join(self.known) or 'none'})"


class DuplicateRequestError(EngineError, ValueError):
    """A live request already uses this ``rid`` (HTTP 409)."""


__all__ = ["EngineError", "InvalidRequestError", "ContextLengthError", "UnknownAdapterError", "DuplicateRequestError"]
