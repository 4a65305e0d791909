"""SGLang 0.5.17's weight-update group routes (admin): ``POST /init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group``.

Bodies are SGLang's request models (``srt/managers/io_struct.py``: ``InitWeightsUpdateGroupReqInput``,
``UpdateWeightsFromDistributedReqInput``, ``DestroyWeightsUpdateGroupReqInput``), names and defaults
included (``group_name: "weight_update_group"``, ``backend: "nccl"``). Answers are SGLang's
``{"success", "message"}`` (200, else 400 as ``http_server.py``); failures add this service's
``error`` object (``type``, ``field``/``value`` when a field is at fault, ``group_destroyed``), and a
successful update also reports what the update from disk reports (``weight_version``, timings). A
group whose name is taken or still closing is a 409. An engine without ``weight_groups()`` answers 400
saying so.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from sparrow_server.engine.base import Engine
from sparrow_server.engine.weight_groups import (
    DEFAULT_GROUP_NAME,
    SGLANG_DEFAULT_BACKEND,
    DistributedWeightUpdate,
    WeightGroupError,
    WeightGroupSpec,
)
from sparrow_server.engine.weights import WeightSyncConflictError
from sparrow_server.server.api_models import STRICT
from sparrow_server.server.errors import error_body
from sparrow_server.server.security import require_admin

NO_GROUPS = ("the {engine} engine cannot join a trainer's weight-update group; update weights with "
             "/update_weights_from_disk")


class InitWeightsUpdateGroupIn(BaseModel):
    """SGLang's ``InitWeightsUpdateGroupReqInput`` (``rid`` accepted, unused)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = SGLANG_DEFAULT_BACKEND
    rid: str | None = None

    def to_engine(self) -> WeightGroupSpec:
        return WeightGroupSpec(self.master_address, self.master_port, self.rank_offset, self.world_size,
                               self.group_name, self.backend)


class UpdateWeightsFromDistributedIn(BaseModel):
    """SGLang's ``UpdateWeightsFromDistributedReqInput``; ``torch_empty_cache`` (a GPU knob) and
    ``rid`` are accepted and have no effect here."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = DEFAULT_GROUP_NAME
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    torch_empty_cache: bool = False
    rid: str | None = None

    def to_engine(self) -> DistributedWeightUpdate:
        return DistributedWeightUpdate(tuple(self.names), tuple(self.dtypes), tuple(tuple(s) for s in self.shapes),
                                       self.group_name, self.flush_cache, self.abort_all_requests,
                                       self.weight_version, self.load_format)


class DestroyWeightsUpdateGroupIn(BaseModel):
    """SGLang's ``DestroyWeightsUpdateGroupReqInput``."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    group_name: str = DEFAULT_GROUP_NAME
    rid: str | None = None


def _failure(status: int, kind: str, message: str, **fields: Any) -> JSONResponse:
    return JSONResponse({"success": False, "message": message, **error_body(kind, message, **fields)},
                        status_code=status)


def _group_failure(exc: WeightGroupError) -> JSONResponse:
    fields = {"field": exc.field, "value": exc.value} if exc.field is not None else {}
    return _failure(400, exc.kind, str(exc), group_destroyed=exc.group_destroyed, **fields)


def weight_group_router(engine: Engine) -> APIRouter:
    router = APIRouter(dependencies=[Depends(require_admin)])

    async def call(operation, respond) -> Any:
        """Run ``operation(port)`` and answer with ``respond(result)``, or SGLang's failure shape."""
        port = engine.weight_groups()
        if port is None:  # engine.info() read per request: SGLang's is not up while the app is built
            return _failure(400, "not_supported", NO_GROUPS.format(engine=engine.info().engine))
        try:
            return respond(await operation(port))
        except WeightGroupError as exc:
            return _group_failure(exc)
        except WeightSyncConflictError as exc:
            return _failure(409, "conflict", str(exc))

    @router.post("/init_weights_update_group")
    async def init_weights_update_group(body: InitWeightsUpdateGroupIn):
        spec = body.to_engine()
        return await call(lambda port: port.init_group(spec), lambda message: {"success": True, "message": message})

    @router.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(body: UpdateWeightsFromDistributedIn):
        update = body.to_engine()

        def respond(result) -> dict[str, Any]:
            return {"success": True, "message": result.message, "num_paused_requests": result.num_paused_requests,
                    "weight_version": result.weight_version, "previous_weight_version": result.previous_weight_version,
                    "num_aborted_requests": result.num_aborted_requests, "load_s": result.load_s,
                    "drain_s": result.drain_s, "swap_s": result.swap_s}

        return await call(lambda port: port.update_from_group(update), respond)

    @router.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(body: DestroyWeightsUpdateGroupIn | None = Body(None)):
        name = (body or DestroyWeightsUpdateGroupIn()).group_name
        return await call(lambda port: port.destroy_group(name), lambda message: {"success": True, "message": message})

    return router


def install_weight_group_routes(app: FastAPI, engine: Engine) -> None:
    app.include_router(weight_group_router(engine))


__all__ = ["install_weight_group_routes", "weight_group_router", "InitWeightsUpdateGroupIn",
           "UpdateWeightsFromDistributedIn", "DestroyWeightsUpdateGroupIn", "NO_GROUPS"]
