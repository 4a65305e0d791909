"""Authentication and file-path confinement of the HTTP service.

**Bearer tokens.** ``SecurityConfig.api_key`` (``serve --api-key`` or ``SPARROW_API_KEY``) is the
admin token. Routes that change what the server serves depend on ``require_admin``; generation
routes depend on ``require_rollout_auth``, which asks for the same token only when
``require_auth_for_rollouts`` is set. A missing or wrong token answers 401 with
``WWW-Authenticate: Bearer``. Tokens are compared in constant time (``hmac.compare_digest``) and
never logged or echoed (the key is excluded from ``repr``).

Without an ``api_key`` the admin routes are open only when ``open_admin_without_key`` is true:
``serve`` sets it when it binds to loopback (the default without a key) and clears it under
``--insecure-allow-remote``, so a remote-reachable server without a key serves rollouts but
refuses every state change.

How another router protects its routes (adapters, weight updates, aliases)::

    from fastapi import APIRouter, Depends
    from sparrow_server.server.security import require_admin, resolve_adapter_path

    router = APIRouter(dependencies=[Depends(require_admin)])   # every route: 401 without the token

    @router.post("/adapters")
    async def load_adapter(body: AdapterIn, request: Request):
        path = resolve_adapter_path(request, body.path)   # 403 outside --adapter-root (after auth)

**Paths.** ``resolve_inside(path, roots)`` resolves a client-given path (symlinks followed) and
returns it only if it lies inside one of ``roots`` (``--adapter-root`` / ``--schedule-root``);
otherwise it raises ``PathNotAllowedError`` (HTTP 403, naming the path but not the roots).
With no roots configured every client-given path is refused.
"""
from __future__ import annotations

import hmac
from http import HTTPStatus
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sparrow_server.server.errors import error_response

BEARER = "bearer"
API_KEY_ENV = "SPARROW_API_KEY"


@dataclass(frozen=True)
class SecurityConfig:
    """Who may do what. The defaults (no key, admin open) suit an in-process or loopback server."""

    api_key: str | None = field(default=None, repr=False)
    require_auth_for_rollouts: bool = False
    open_admin_without_key: bool = True
    adapter_roots: tuple[Path, ...] = ()
    schedule_roots: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None and not _is_token(self.api_key):
            raise ValueError("api_key: must be non-empty printable ASCII without spaces (it travels in an HTTP header)")
        if self.require_auth_for_rollouts and self.api_key is None:
            raise ValueError("require_auth_for_rollouts needs an api_key (--api-key or SPARROW_API_KEY)")


class AuthError(Exception):
    """Missing or wrong bearer token (HTTP 401)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class PathNotAllowedError(Exception):
    """A client-given path outside the configured roots (HTTP 403). ``field`` names the request field."""

    def __init__(self, field_name: str, path: str, reason: str):
        self.field = field_name
        self.path = path
        self.reason = reason
        super().__init__(f"{field_name} = {path!r}: {reason}")


def _is_token(text: str) -> bool:
    return bool(text) and all(33 <= ord(c) <= 126 for c in text)


def token_matches(presented: str, expected: str) -> bool:
    """Constant-time comparison (of UTF-8 bytes: a header decoded as latin-1 cannot raise here)."""
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))


def bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != BEARER:
        return None
    return token.strip() or None


def security_config(request: Request) -> SecurityConfig:
    return getattr(request.app.state, "security", None) or SecurityConfig()


def _check_token(request: Request, config: SecurityConfig) -> None:
    assert config.api_key is not None
    token = bearer_token(request)
    if token is None:
        raise AuthError("missing bearer token (send 'Authorization: Bearer <key>')")
    if not token_matches(token, config.api_key):
        raise AuthError("invalid bearer token")


async def require_admin(request: Request) -> None:
    """FastAPI dependency of every state-changing route: 401 unless the admin token is presented."""
    config = security_config(request)
    if config.api_key is not None:
        _check_token(request, config)
    elif not config.open_admin_without_key:
        raise AuthError("state-changing endpoints are disabled: this server has no API key (--api-key)")


async def require_rollout_auth(request: Request) -> None:
    """FastAPI dependency of the generation routes: 401 without the token when rollouts need auth."""
    config = security_config(request)
    if config.require_auth_for_rollouts:
        _check_token(request, config)


def resolve_inside(path: str | Path, roots: Iterable[str | Path], field_name: str = "path") -> Path:
    """``path`` resolved (symlinks followed) if it lies inside one of ``roots``, else ``PathNotAllowedError``.

    A relative path is taken relative to each root in turn. The returned path may not exist
    (the caller reports a missing file); only confinement is checked here.
    """
    text = str(path)
    if not text or "\x00" in text:
        raise PathNotAllowedError(field_name, text, "is empty or contains a NUL byte")
    resolved_roots = [Path(r).resolve() for r in roots]
    if not resolved_roots:
        raise PathNotAllowedError(field_name, text, "no root directory is configured for client-given paths")
    given = Path(text)
    for root in resolved_roots:
        candidate = (given if given.is_absolute() else root / given).resolve()
        if candidate.is_relative_to(root):
            return candidate
    raise PathNotAllowedError(field_name, text, "resolves outside the configured root directories")


def resolve_adapter_path(request: Request, path: str | Path, field_name: str = "path") -> Path:
    return resolve_inside(path, security_config(request).adapter_roots, field_name)


def resolve_schedule_path(request: Request, path: str | Path, field_name: str = "path") -> Path:
    return resolve_inside(path, security_config(request).schedule_roots, field_name)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _auth_error(request: Request, exc: AuthError) -> JSONResponse:
    response = error_response(401, "unauthorized", exc.reason)
    response.headers["WWW-Authenticate"] = 'Bearer realm="sparrow-server"'
    return response


async def _path_error(request: Request, exc: PathNotAllowedError) -> JSONResponse:
    return error_response(403, "path_not_allowed", str(exc), field=exc.field, value=exc.path)


def _route_auth_checks(request: Request) -> list:
    """The auth dependencies of the route a request matched (FastAPI puts the route in the scope)."""
    route = request.scope.get("route")
    if request.method not in (getattr(route, "methods", None) or ()):
        return []  # a wrong-method match (405) or no route
    dependant = getattr(route, "dependant", None)
    calls = [d.call for d in getattr(dependant, "dependencies", ())]
    return [c for c in (require_admin, require_rollout_auth) if c in calls]


def _auth_before_validation(handler):
    """FastAPI parses the body before it runs dependencies: answer 401, not 400/422, to an
    unauthenticated request with a malformed body."""

    async def validation_error(request: Request, exc: Exception):
        try:
            for check in _route_auth_checks(request):
                await check(request)
        except AuthError as auth:
            return await _auth_error(request, auth)
        return await handler(request, exc)

    return validation_error


async def _http_error(request: Request, exc: StarletteHTTPException):
    """Starlette/FastAPI's own HTTP errors (404, 405, 400 on an unreadable body) in the service's error shape."""
    if exc.status_code < 400 or exc.status_code in (204, 304):
        return await http_exception_handler(request, exc)
    response = error_response(exc.status_code, HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_"), str(exc.detail))
    response.headers.update(exc.headers or {})
    return response


def install_security(app: FastAPI, config: SecurityConfig | None = None) -> None:
    """Store the config where the dependencies read it and map the errors to 401/403 (call it
    after the app's own ``RequestValidationError`` handler is installed)."""
    app.state.security = config or SecurityConfig()
    app.add_exception_handler(AuthError, _auth_error)
    app.add_exception_handler(PathNotAllowedError, _path_error)
    validation = app.exception_handlers.get(RequestValidationError, request_validation_exception_handler)
    app.add_exception_handler(RequestValidationError, _auth_before_validation(validation))
    http_error = app.exception_handlers.get(StarletteHTTPException, http_exception_handler)
    if http_error is http_exception_handler:  # FastAPI's default: use this service's error shape
        http_error = _http_error
    app.add_exception_handler(StarletteHTTPException, _auth_before_validation(http_error))


__all__ = [
    "SecurityConfig", "AuthError", "PathNotAllowedError", "require_admin", "require_rollout_auth", "resolve_inside",
    "resolve_adapter_path", "resolve_schedule_path", "install_security", "is_loopback_host", "token_matches",
    "API_KEY_ENV",
]
