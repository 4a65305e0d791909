"""The schedule that requests naming none run with, changeable at run time: ``GET
/default_schedule`` and ``POST /default_schedule {"name": NAME}`` (admin). For trainers that cannot
name a schedule per request (slime main behind sglang-router, which drops ``custom_params`` and
cannot add ``extra_key``): the trainer, or ``sparrow_server.client.set_default_schedule`` fanned out
to every server, switches the fleet's schedule between steps without restarting anything. Each
response's ``meta_info.sparrow.schedule`` names the schedule it ran with.

The choice is saved in the state directory (``default_schedule.json`` beside ``schedules/``) and
wins over ``--default-schedule`` on restart; ``DELETE /default_schedule`` forgets it and returns to
the start-up default. On ``--engine sglang`` a change is a 409: the plug-in's scheduler processes
read the default once, at start.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from sparrow_server.server.api_models import STRICT
from sparrow_server.server.errors import error_response
from sparrow_server.server.security import require_admin
from sparrow_server.server.service import RolloutService
from sparrow_server.sparsity.registry import ScheduleRegistry

log = logging.getLogger(__name__)
DEFAULT_SCHEDULE_FILE = "default_schedule.json"
# An engine whose generation processes read the default once (the SGLang plug-in's schedulers):
# changing it here would only change /rollout, not SGLang's own /generate, so it is refused.
FIXED_AT_START = ("this engine's scheduler processes fix the default schedule when they start "
                  "(--default-schedule); name the schedule per request (custom_params or extra_key) or restart")


class DefaultScheduleIn(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    name: str


def saved_default_path(registry: ScheduleRegistry) -> Path | None:
    """Where the choice is saved: beside the registry's schedules directory (None: not persisted)."""
    return Path(registry.persist_dir).parent / DEFAULT_SCHEDULE_FILE if registry.persist_dir is not None else None


def saved_default(registry: ScheduleRegistry) -> str | None:
    """The saved default if it is still a registered schedule (else None, with a warning)."""
    path = saved_default_path(registry)
    if path is None or not path.is_file():
        return None
    name = json.loads(path.read_text()).get("name")
    if name not in registry:
        log.warning("saved default schedule %r is not registered any more; using the start-up default", name)
        return None
    return name


def _save(path: Path, name: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": name}))
    os.replace(tmp, path)


def install_default_schedule_routes(app: FastAPI, service: RolloutService, startup_default: str) -> None:
    def state() -> dict:
        schedule = service.schedules.get(service.default_schedule)
        return {"name": service.default_schedule, "schedule_id": schedule.id, "startup_default": startup_default}

    @app.get("/default_schedule")
    async def get_default_schedule():
        return state()

    def fixed_at_start() -> JSONResponse | None:
        if service.engine.default_schedule_fixed_at_start:
            return error_response(409, "conflict", FIXED_AT_START)
        return None

    @app.post("/default_schedule", dependencies=[Depends(require_admin)])
    async def set_default_schedule(body: DefaultScheduleIn):
        if (refused := fixed_at_start()) is not None:
            return refused
        service.schedules.get(body.name)  # 404 for an unknown name
        previous = service.default_schedule
        service.default_schedule = body.name
        path = saved_default_path(service.schedules)
        if path is not None:
            _save(path, body.name)
        return {**state(), "previous": previous, "persisted": path is not None}

    @app.delete("/default_schedule", dependencies=[Depends(require_admin)])
    async def reset_default_schedule():
        if (refused := fixed_at_start()) is not None:
            return refused
        path = saved_default_path(service.schedules)
        if path is not None:
            path.unlink(missing_ok=True)
        service.default_schedule = startup_default
        return state()
