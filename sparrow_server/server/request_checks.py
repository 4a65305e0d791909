"""Checks every JSON body gets before any route looks at it: numbers are finite and strings are
valid Unicode, anywhere in the body (free-form fields such as ``custom_params`` or a schedule
included). Python's JSON parser takes ``NaN``, ``Infinity`` and ``1e400`` (-> inf) and lone
surrogates (``"\\ud800"``); none of them can be executed, echoed back as JSON, or encoded as
UTF-8, so they are refused with a 422 naming the field and value.

An app-wide dependency (``check_json_body``), so it runs after authentication is decided (the
security module answers 401 before any 422) and reads the body FastAPI already parsed (cached
on the request): no second parse. The fast path is one C-level encode of the parsed body.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterator

from fastapi import Request
from fastapi.exceptions import RequestValidationError

NON_FINITE = "must be a finite number (NaN and Infinity are not JSON numbers; this one overflows a double)"
NOT_UNICODE = "must be valid Unicode (a lone UTF-16 surrogate cannot be encoded as UTF-8)"


async def check_json_body(request: Request) -> None:
    """FastAPI dependency: 422 for a non-finite number or a lone surrogate anywhere in a JSON body."""
    if request.method not in ("POST", "PUT", "PATCH") or "json" not in request.headers.get("content-type", ""):
        return
    if not await request.body():
        return
    try:
        data = await request.json()
    except ValueError:
        return  # FastAPI has already answered a malformed body (this dependency does not run then)
    problem = find_problem(data)
    if problem is not None:
        path, value, reason = problem
        raise RequestValidationError([{"type": "value_error", "loc": ("body", *path), "msg": reason, "input": value}])


def find_problem(data: Any) -> tuple[tuple[Any, ...], str, str] | None:
    """(path, printable value, reason) of the first non-finite number or invalid string; None if clean."""
    try:
        json.dumps(data, allow_nan=False, ensure_ascii=False).encode("utf-8")
        return None
    except (ValueError, UnicodeEncodeError):
        pass
    for path, value in _leaves(data, ()):
        if isinstance(value, float) and not math.isfinite(value):
            return path, json.dumps(value), NON_FINITE
        if isinstance(value, str) and not _encodable(value):
            return path, printable(value), NOT_UNICODE
    return None


def _leaves(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (printable(key),), key
            yield from _leaves(item, path + (printable(key),))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, path + (i,))
    else:
        yield path, value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def printable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udXXX`` escapes (safe to put in a JSON answer)."""
    return text if _encodable(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> Any:
    """``value`` made encodable as strict JSON: non-finite floats as their JSON-ish text, lone
    surrogates escaped, anything else unknown as its ``repr``. For error bodies, which echo input."""
    if isinstance(value, dict):
        return {printable(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, str):
        return printable(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return printable(repr(value))


__all__ = ["check_json_body", "find_problem", "json_safe", "printable"]
