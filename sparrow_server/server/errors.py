"""HTTP error mapping. Every error body is ``{"error": {"type", "message", ...}, "detail": message}``
and names the offending field and value (422), the unknown name (404) or the numbers (400)."""
from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from sparrow_server.engine.base import (
    ContextLengthError,
    DuplicateRequestError,
    InvalidRequestError,
    UnknownAdapterError,
)
from sparrow_server.server.generate_models import UNION_TAGS
from sparrow_server.server.request_checks import json_safe
from sparrow_server.sparsity.registry import UnknownScheduleError
from sparrow_server.sparsity.schedule import ScheduleError


def error_body(kind: str, message: str, **fields: Any) -> dict[str, Any]:
    """Every error answer's body; the values it echoes (which may be anything a client sent) are made strict JSON."""
    return json_safe({"error": {"type": kind, "message": message, **fields}, "detail": message})


def error_response(status: int, kind: str, message: str, **fields: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(kind, message, **fields))


def _loc(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body" and p not in UNION_TAGS]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


JSON_EXCERPT_CHARS = 20  # of the body on each side of where a malformed JSON body broke


def _invalid_json(error: dict[str, Any], document: Any) -> JSONResponse:
    """A body that is not JSON: where it broke (line, column, character) and the parser's message, with
    the text around that point (FastAPI reports only the character offset)."""
    text = document.decode("utf-8", "replace") if isinstance(document, (bytes, bytearray)) else str(document or "")
    position = error["loc"][-1] if error.get("loc") and isinstance(error["loc"][-1], int) else 0
    parsed = json.JSONDecodeError((error.get("ctx") or {}).get("error", "invalid JSON"), text, min(position, len(text)))
    near = text[max(0, parsed.pos - JSON_EXCERPT_CHARS):parsed.pos + JSON_EXCERPT_CHARS]
    reason = f"not valid JSON: {parsed}"  # "Expecting value: line 2 column 5 (char 21)"
    return error_response(422, "invalid_request", f"body = {near!r}: {reason}", field="body", value=near, reason=reason,
                          line=parsed.lineno, column=parsed.colno, position=parsed.pos)


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return _invalid_json(first, exc.body)
    field, value = _loc(tuple(first.get("loc", ()))), first.get("input")
    message = f"{field} = {value!r}: {first.get('msg')}"
    return error_response(422, "invalid_request", message, field=field, value=value,
                          errors=[{"field": _loc(tuple(e.get("loc", ()))), "value": e.get("input"), "msg": e.get("msg")} for e in errors])


async def _invalid(request: Request, exc: InvalidRequestError) -> JSONResponse:
    return error_response(422, "invalid_request", str(exc), field=exc.field, value=exc.value)


async def _schedule_error(request: Request, exc: ScheduleError) -> JSONResponse:
    return error_response(422, "invalid_schedule", str(exc), field=exc.field, value=exc.value, reason=exc.reason)


async def _context(request: Request, exc: ContextLengthError) -> JSONResponse:
    return error_response(400, "context_length_exceeded", str(exc), prompt_tokens=exc.prompt_tokens,
                          max_new_tokens=exc.max_new_tokens, context_length=exc.context_length)


async def _unknown_schedule(request: Request, exc: UnknownScheduleError) -> JSONResponse:
    return error_response(404, "unknown_schedule", str(exc), name=exc.name)


async def _unknown_adapter(request: Request, exc: UnknownAdapterError) -> JSONResponse:
    return error_response(404, "unknown_adapter", str(exc), name=exc.name)


async def _duplicate(request: Request, exc: DuplicateRequestError) -> JSONResponse:
    return error_response(409, "duplicate_rid", str(exc))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(InvalidRequestError, _invalid)
    app.add_exception_handler(ScheduleError, _schedule_error)
    app.add_exception_handler(ContextLengthError, _context)
    app.add_exception_handler(UnknownScheduleError, _unknown_schedule)
    app.add_exception_handler(UnknownAdapterError, _unknown_adapter)
    app.add_exception_handler(DuplicateRequestError, _duplicate)
