"""The OpenAPI document says what the server really answers: every operation lists its error
responses with their body model (``ErrorBody``, the shape ``errors.error_response`` writes), so
generated clients and schema fuzzers agree with the server (``tests/server/test_fuzz_api.py`` checks
response conformance over every route).

Codes every operation of a kind can give are added by rule, so a new route is covered as soon as
it exists: 503 (shutdown drain) everywhere, 401 behind an auth dependency, 400, 413 and 422 with
a body, 422 with path parameters. Codes particular to a route are listed in ``ROUTE_ERRORS``.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, routing
from fastapi.openapi.utils import _get_api_route_for_openapi, get_openapi  # FastAPI's own route walk
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict

from sparrow_server.server.security import require_admin, require_rollout_auth

DESCRIPTIONS = {
    400: "Bad request (a body that is not UTF-8 text, context length exceeded, invalid adapter or weights)",
    401: "Missing or invalid API key",
    403: "Path outside the allowed roots",
    404: "Unknown schedule or adapter",
    409: "Conflict (rid already live, adapter in use, weight update in progress)",
    413: "Request body too large",
    422: "Invalid request: the field, its value and why",
    429: "Too many requests (retry after Retry-After seconds)",
    500: "The engine failed while serving this request",
    501: "Not supported by this engine",
    503: "Shutting down (retry after Retry-After seconds)",
    504: "Request timeout",
}
GENERATION = (400, 404, 409, 429, 500, 504)
ADAPTER_CHANGE = (400, 404, 409)
ROUTE_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/rollout"): GENERATION,
    ("POST", "/generate"): GENERATION,
    ("GET", "/schedules/{name}"): (404,),
    ("POST", "/update_weights_from_disk"): (400, 409, 501),
    ("POST", "/pause_generation"): (501,),
    ("POST", "/continue_generation"): (501,),
    ("GET", "/generation_state"): (501,),
    ("POST", "/adapters"): (*ADAPTER_CHANGE, 403),
    ("DELETE", "/adapters/{name}"): ADAPTER_CHANGE,
    ("PUT", "/adapters/aliases/{alias}"): ADAPTER_CHANGE,
    ("DELETE", "/adapters/aliases/{alias}"): ADAPTER_CHANGE,
    ("POST", "/v1/completions"): GENERATION,
    ("POST", "/v1/chat/completions"): GENERATION,
    ("GET", "/v1/models/{model:path}"): (404,),
    ("DELETE", "/default_schedule"): (409,),
    **{(m, path): (400,) for m in ("GET", "POST")
       for path in ("/release_memory_occupation", "/resume_memory_occupation", "/weights_checker")},
    ("GET", "/schedules/{name}/history"): (404,),
    ("GET", "/schedules/{name}/autopilot"): (404,),
    ("PUT", "/schedules/{name}/autopilot"): (404, 409),
    ("DELETE", "/schedules/{name}/autopilot"): (404,),
    ("POST", "/schedules/{name}/versions"): (404, 409),
    ("POST", "/default_schedule"): (404, 409),
    ("GET", "/v1/loads"): (400,),
    ("POST", "/update_weights_from_tensor"): (400,),
    ("POST", "/init_weights_update_group"): (400, 409),
    ("POST", "/update_weights_from_distributed"): (400, 409),
    ("POST", "/destroy_weights_update_group"): (400,),
}
TEXT_ROUTES = {("GET", "/metrics"): "text/plain"}
# SGLang's own non-JSON answers, kept byte-compatible for its clients: (method, path) -> {code: description}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
PLAIN_ROUTES: dict[tuple[str, str], dict[int, dict[str, Any]]] = {
    **{(m, "/flush_cache"): {200: {"description": "Cache flushed (plain text)", "content": _TEXT},
                             400: {"description": "Requests are running (plain text, as SGLang)", "content": _TEXT}}
       for m in ("GET", "POST")},
    ("GET", "/health_generate"): {200: {"description": "The engine produced a token or finished a step (empty "
                                                       "body, as SGLang)"},
                                  503: {"description": "None within SGLang's 20 s, or at once while the KV cache is "
                                                       "released or generation paused (empty body)"}},
}
HEALTH = ("GET", "/health")


class ErrorDetail(BaseModel):
    """``error``: ``type`` and ``message`` always; more fields by type (``field``, ``value``, ``limit``...)."""

    model_config = ConfigDict(extra="allow")
    type: str
    message: str


class ErrorBody(BaseModel):
    """Every error answer. ``detail`` repeats ``error.message`` (FastAPI's and SGLang's key)."""

    model_config = ConfigDict(extra="allow")
    error: ErrorDetail
    detail: str


class HealthBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: str
    live_requests: int
    queued_requests: int
    free_pages: int | None
    total_pages: int | None
    detail: str


def _error_codes(route: APIRoute, method: str) -> set[int]:
    calls = {d.call for d in route.dependant.dependencies}
    codes = {503} | set(ROUTE_ERRORS.get((method, route.path), ()))
    if calls & {require_admin, require_rollout_auth}:
        codes.add(401)
    if route.body_field is not None:
        codes |= {400, 413, 422}  # 400: a body that cannot be decoded at all
    if route.dependant.path_params:
        codes.add(422)
    return codes


def _api_routes(app: FastAPI) -> list[APIRoute]:
    """Every APIRoute, those of included routers too (as FastAPI's own ``get_openapi`` walks them)."""
    routes = []
    for context in routing.iter_route_contexts(app.routes):
        route = _get_api_route_for_openapi(context)
        if route is not None:
            routes.append(route)
    return routes


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (ErrorBody, HealthBody):
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema
    for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422 shape, which this server never sends
        components.pop(name, None)
    for route in _api_routes(app):
        if not route.include_in_schema:
            continue
        for method in route.methods:
            operation = schema["paths"][route.path_format][method.lower()]  # path_format: no ":path" convertors
            responses = operation.setdefault("responses", {})
            for code in sorted(_error_codes(route, method)):
                responses[str(code)] = _json(_ref("ErrorBody"), DESCRIPTIONS[code])
            if (method, route.path) == HEALTH:
                responses["200"] = _json(_ref("HealthBody"), "Engine healthy")
                responses["503"] = _json({"anyOf": [_ref("HealthBody"), _ref("ErrorBody")]},
                                         "Engine loop not running, KV cache released, generation paused, "
                                         "or shutting down")
            for code, response in PLAIN_ROUTES.get((method, route.path), {}).items():
                responses[str(code)] = response
            media = TEXT_ROUTES.get((method, route.path))
            if media is not None:
                responses["200"] = {"description": "Prometheus exposition text", "content": {media: {"schema": {"type": "string"}}}}
    return schema


def install_openapi(app: FastAPI) -> None:
    """Serve ``build_openapi``'s document (built once, after every route is added)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["install_openapi", "build_openapi", "ErrorBody", "ErrorDetail", "HealthBody", "ROUTE_ERRORS"]
