"""Adapter lifecycle routes (``AdapterManager`` over HTTP).

- ``POST /adapters`` ``{"name", "path"}``: load a PEFT LoRA directory (inside ``--adapter-root``)
  under an immutable version name. 409 if the name exists; 403 outside the roots; 400 for a
  missing or malformed adapter, a base-model mismatch or a rank above the server's maximum.
- ``GET /adapters``: versions (fingerprint, rank, targets, load time, in-flight requests) and aliases.
- ``DELETE /adapters/{name}``: stop new requests, drain the in-flight ones, unload. 404 unknown,
  409 while an alias points at it.
- ``PUT /adapters/aliases/{alias}`` ``{"name"}``: point the alias at a version (atomic).
  ``DELETE /adapters/aliases/{alias}`` removes it.
"""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from pydantic import BaseModel, ConfigDict

from sparrow_server.engine.adapter_versions import AdapterConflictError, AdapterManager, AdapterRequestError
from sparrow_server.server.api_models import STRICT
from sparrow_server.server.errors import error_response
from sparrow_server.server.security import require_admin, resolve_adapter_path


class AdapterIn(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)
    name: str
    path: str


class AliasIn(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)
    name: str


def adapter_router(manager: AdapterManager) -> APIRouter:
    router = APIRouter()

    @router.get("/adapters")
    async def list_adapters() -> dict[str, Any]:
        return {"adapters": manager.describe(), "aliases": manager.aliases(), "max_rank": manager.max_rank}

    @router.post("/adapters", dependencies=[Depends(require_admin)])
    async def load_adapter(body: AdapterIn, request: Request) -> dict[str, Any]:
        path = resolve_adapter_path(request, body.path)
        await asyncio.get_running_loop().run_in_executor(None, manager.load, body.name, path)
        return _one(manager, body.name)

    @router.delete("/adapters/{name}", dependencies=[Depends(require_admin)])
    async def unload_adapter(name: str) -> dict[str, Any]:
        version = await manager.unload(name)
        return {"unloaded": version.name, "path": version.path}

    @router.put("/adapters/aliases/{alias}", dependencies=[Depends(require_admin)])
    async def put_alias(alias: str, body: AliasIn) -> dict[str, Any]:
        manager.set_alias(alias, body.name)
        return {"alias": alias, "name": body.name}

    @router.delete("/adapters/aliases/{alias}", dependencies=[Depends(require_admin)])
    async def delete_alias(alias: str) -> dict[str, Any]:
        manager.delete_alias(alias)
        return {"deleted": alias}

    return router


def _one(manager: AdapterManager, name: str) -> dict[str, Any]:
    return next(a for a in manager.describe() if a["name"] == name)


async def _conflict(request: Request, exc: AdapterConflictError):
    return error_response(409, "adapter_conflict", str(exc), field=exc.field, value=exc.value, reason=exc.reason)


async def _bad_adapter(request: Request, exc: AdapterRequestError):
    return error_response(400, "invalid_adapter", str(exc), field=exc.field, value=exc.value, reason=exc.reason)


def install_adapter_routes(app: FastAPI, manager: AdapterManager) -> None:
    app.state.adapter_manager = manager
    app.add_exception_handler(AdapterConflictError, _conflict)
    app.add_exception_handler(AdapterRequestError, _bad_adapter)
    app.include_router(adapter_router(manager))


__all__ = ["install_adapter_routes", "adapter_router", "AdapterIn", "AliasIn"]
