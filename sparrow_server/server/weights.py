"""Weight-update routes in SGLang's shapes (``POST /update_weights_from_disk``,
``/pause_generation``, ``/continue_generation``) plus ``GET /generation_state``.

The state-changing routes depend on ``require_admin``. Replies keep SGLang's fields
(``success``, ``message``, ``num_paused_requests``; ``status`` for pause/continue) so SGLang
trainers (slime, verl's HTTP mode) work unchanged; failures add this service's ``error`` object.
``GET /get_weight_version`` and ``weight_version`` in ``/server_info`` come from ``app.py``.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from sparrow_server.engine.base import Engine, InvalidRequestError
from sparrow_server.engine.weights import (
    DEFAULT_PAUSE_MODE,
    PauseState,
    WeightLoadError,
    WeightSync,
    WeightSyncConflictError,
    WeightUpdate,
)
from sparrow_server.server.api_models import STRICT
from sparrow_server.server.security import require_admin

NOT_SUPPORTED = 501


class UpdateWeightsFromDiskIn(BaseModel):
    """SGLang's ``UpdateWeightFromDiskReqInput``. GPU-only knobs (``torch_empty_cache``,
    ``recapture_cuda_graph``) and bookkeeping (``token_step``, ``manifest``) are accepted and
    have no effect here; ``is_async`` is refused (an update returns once it is done)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    flush_cache: bool = True
    manifest: dict[str, Any] | None = None

    def to_engine(self) -> WeightUpdate:
        if self.is_async:
            raise InvalidRequestError("is_async", self.is_async, "is not supported: an update returns when it is done")
        return WeightUpdate(model_path=self.model_path, load_format=self.load_format, weight_version=self.weight_version,
                            flush_cache=self.flush_cache, abort_all_requests=self.abort_all_requests,
                            keep_pause=self.keep_pause)


class PauseGenerationIn(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    mode: Literal["abort", "retract", "in_place"] = DEFAULT_PAUSE_MODE


class ContinueGenerationIn(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    torch_empty_cache: bool = True  # SGLang's knob; nothing to empty on the reference engine


def _failure(status: int, kind: str, message: str, **fields: Any) -> JSONResponse:
    body = {"success": False, "message": message, "num_paused_requests": 0,
            "error": {"type": kind, "message": message, **fields}, "detail": message}
    return JSONResponse(body, status_code=status)


def _state(sync: WeightSync, state: PauseState) -> dict[str, Any]:
    return {"weight_version": sync.weight_version, "paused": state.mode, "running_requests": state.running,
            "waiting_requests": state.waiting}


def weight_router(engine: Engine) -> APIRouter:
    sync = engine.weights()
    admin = APIRouter(dependencies=[Depends(require_admin)])
    public = APIRouter()

    def unsupported() -> JSONResponse:
        return _failure(NOT_SUPPORTED, "not_supported", f"the {engine.info().engine} engine cannot update weights")

    @admin.post("/update_weights_from_disk")
    async def update_weights_from_disk(body: UpdateWeightsFromDiskIn, request: Request):
        if sync is None:
            return unsupported()
        try:
            result = await sync.update_weights_from_disk(body.to_engine())
        except WeightLoadError as exc:
            return _failure(400, "weight_load_failed", str(exc), field=exc.field, value=exc.value, reason=exc.reason)
        except WeightSyncConflictError as exc:
            return _failure(409, "conflict", str(exc))
        return {"success": True, "message": result.message, "num_paused_requests": result.num_paused_requests,
                "weight_version": result.weight_version, "previous_weight_version": result.previous_weight_version,
                "num_aborted_requests": result.num_aborted_requests, "load_s": result.load_s,
                "drain_s": result.drain_s, "swap_s": result.swap_s}

    @admin.post("/pause_generation")
    async def pause_generation(body: PauseGenerationIn | None = Body(None)):
        if sync is None:
            return unsupported()
        state = await sync.pause_generation((body or PauseGenerationIn()).mode)
        return {"message": "Generation paused successfully.", "status": "ok", **_state(sync, state)}

    @admin.post("/continue_generation")
    async def continue_generation(body: ContinueGenerationIn | None = Body(None)):
        if sync is None:
            return unsupported()
        state = await sync.continue_generation()
        return {"message": "Generation continued successfully.", "status": "ok", **_state(sync, state)}

    @public.get("/generation_state")
    async def generation_state():
        if sync is None:
            return unsupported()
        return _state(sync, sync.pause_state())

    router = APIRouter()
    router.include_router(admin)
    router.include_router(public)
    return router


def install_weight_routes(app: FastAPI, engine: Engine) -> None:
    app.include_router(weight_router(engine))


__all__ = ["install_weight_routes", "weight_router", "UpdateWeightsFromDiskIn", "PauseGenerationIn",
           "ContinueGenerationIn"]
