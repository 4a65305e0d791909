"""SGLang 0.5.17's control plane, as trainers call it (slime, verl, SGLang's own clients):
``/abort_request`` (by ``rid`` or ``abort_all``), ``/flush_cache``, ``/health_generate``,
``/server_info`` (alias ``/get_server_info``) with the server-args keys clients read, ``/v1/loads``,
``/get_weight_version`` (alias ``/weight_version``), ``/release_memory_occupation``,
``/resume_memory_occupation``, ``/weights_checker``, and the weight-update route this server cannot
serve (``/update_weights_from_tensor``) as an explicit 400 saying why. The group routes
(``/init_weights_update_group``...) are ``weight_groups.py``'s.

Shapes follow ``sglang/srt/entrypoints/http_server.py`` and ``v1_loads.py`` of the 0.5.17 wheel:
``flush_cache`` answers plain text (200, or 400 while requests run), abort answers 200, failures
``{"success": false, "message"}``. SGLang itself answers ``/get_weight_version`` with 404 (moved to
``/model_info``); slime main still calls it, so this server keeps answering it.
"""
from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Optional

from fastapi import Body, Depends, FastAPI, Query
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from sparrow_server import __version__
from sparrow_server.engine.base import Engine, GenerationRequest, SamplingParams
from sparrow_server.engine.memory import WEIGHT_CHECK_ACTIONS, MemoryBusyError
from sparrow_server.server.api_models import STRICT, AbortIn
from sparrow_server.server.errors import error_body
from sparrow_server.server.security import require_admin, require_rollout_auth
from sparrow_server.server.service import RolloutService

HEALTH_CHECK_TIMEOUT_S = 20.0  # SGLang's HEALTH_CHECK_TIMEOUT default
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"  # SGLang's, so health probes are recognisable in logs
HEALTH_POLL_S = 0.01  # how often a busy engine's step counter is read
FLUSH_POLL_S = 0.01
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "
           "(When there are running or waiting requests, the operation will not be performed.)\n")
FLUSH_REFUSED = "Flush cache failed: requests are running or waiting.\n"
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})  # SGLang's VALID_SECTIONS
NO_TENSOR_IPC = ("the {engine} engine cannot map serialized tensors: SGLang's update_weights_from_tensor passes "
                 "CUDA IPC handles (MultiprocessingSerializer), meaningful only to a GPU worker on the trainer's "
                 "host, and unpickling bytes from HTTP is unsafe; update weights with /update_weights_from_disk")
OR_DISTRIBUTED = " or, from a trainer's gloo group, /update_weights_from_distributed"


class MemoryTagsIn(BaseModel):
    """SGLang's ``ReleaseMemoryOccupationReqInput`` / ``ResumeMemoryOccupationReqInput``."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    tags: Optional[list[str]] = None
    rid: Optional[str] = None


class CheckWeightsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", **STRICT)

    action: str = "checksum"
    allow_quant_error: bool = False
    rid: Optional[str] = None


def _failure(message: str, kind: str = "not_supported", status: int = 400) -> JSONResponse:
    """SGLang's failure body (``success``/``message``, 400) plus this service's ``error`` object."""
    return JSONResponse({"success": False, "message": message, **error_body(kind, message)}, status_code=status)


def install_control_routes(app: FastAPI, service: RolloutService, engine: Engine) -> None:
    _abort_and_health(app, service)
    _info_routes(app, service, engine)
    _memory_routes(app, engine)
    _unsupported_weight_routes(app, engine)


def _abort_and_health(app: FastAPI, service: RolloutService) -> None:
    @app.post("/abort_request", dependencies=[Depends(require_rollout_auth)])
    async def abort_request(body: AbortIn):
        """SGLang answers 200 whatever it aborted; ``aborted``/``num_aborted`` say what happened here."""
        rids = service.engine.live_requests() if body.abort_all else ((body.rid,) if body.rid else ())
        done = [rid for rid in rids if await service.engine.abort(rid)]
        return {"aborted": bool(done), "num_aborted": len(done)}

    @app.get("/health_generate")
    async def health_generate():
        """SGLang's check: 200 once the engine shows it generates, 503 when it does not within SGLang's 20 s.
        Busy: the engine must finish a step (SGLang answers with its next batch); idle: a 1-token greedy
        request must come back. While the KV cache is released or generation paused no token can come:
        503 at once (SGLang's answer in that state, without its 20 s wait)."""
        engine = service.engine
        h = engine.health()
        if not h.serving:
            return Response(status_code=503)
        probe = _next_step(engine, h.progress) if h.live_requests else _one_token(engine)
        try:
            await asyncio.wait_for(probe, HEALTH_CHECK_TIMEOUT_S)
        except Exception:  # a timeout, a hold or an engine failure: unhealthy either way
            return Response(status_code=503)
        return Response(status_code=200)


async def _one_token(engine: Engine) -> None:
    request = GenerationRequest(rid=f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}", input_ids=(0,),
                                sampling=SamplingParams(max_new_tokens=1, temperature=0.0))
    async for _ in engine.submit(request):
        return


async def _next_step(engine: Engine, progress: Optional[int]) -> None:
    """Return once the engine finishes a step after ``progress``; raise if generation becomes held.
    An engine that does not count steps (``progress`` None) is taken at its word."""
    while progress is not None:
        h = engine.health()
        if not h.serving:
            raise RuntimeError(h.detail)
        if h.progress != progress:
            return
        await asyncio.sleep(HEALTH_POLL_S)


def _info_routes(app: FastAPI, service: RolloutService, engine: Engine) -> None:
    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's deprecated alias; slime falls back to it
    async def server_info():
        return server_info_body(service, engine)

    @app.get("/get_weight_version")
    @app.get("/weight_version")
    async def get_weight_version():
        return {"weight_version": engine.info().weight_version}

    @app.get("/v1/loads")
    async def loads(include: Optional[str] = None, dp_rank: Optional[int] = None):
        sections = {s.strip() for s in include.split(",")} if include else set()
        unknown = sections - LOAD_SECTIONS
        if unknown:
            message = f"Invalid include sections: {sorted(unknown)}. Valid options: {sorted(LOAD_SECTIONS)}"
            return _failure(message, "invalid_request")  # SGLang's 400 and "detail", plus this service's "error"
        return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": __version__,
                "accelerator": None, "num_accelerators": 0,
                "loads": [] if dp_rank not in (None, 0) else [core_load(engine)]}


def server_info_body(service: RolloutService, engine: Engine) -> dict[str, Any]:
    """This server's own fields, then SGLang's server-args keys that clients read (slime's external
    engines, sglang-router): one process, no parallelism, no memory saver."""
    info = engine.info()
    health = engine.health()
    pool_tokens = health.total_pages * info.page_size if health.total_pages is not None else None
    return {
        **info.__dict__, "eos_token_ids": list(info.eos_token_ids), "default_schedule": service.default_schedule,
        "adapters": list(engine.adapters()), "has_tokenizer": service.tokenizer is not None,
        "model_path": info.model_name, "served_model_name": info.model_name,
        "tokenizer_path": info.model_name if service.tokenizer is not None else None,
        "skip_tokenizer_init": service.tokenizer is None,
        "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1, "moe_dp_size": 1, "nnodes": 1, "node_rank": 0,
        "enable_dp_attention": False, "enable_memory_saver": False, "disaggregation_mode": "null",
        "max_total_num_tokens": pool_tokens, "max_running_requests": engine.max_running_requests(),
        "version": __version__,
    }


def core_load(engine: Engine) -> dict[str, Any]:
    """SGLang's ``LoadSnapshot`` core keys that this engine can fill from what it knows."""
    h = engine.health()
    page = engine.info().page_size
    total = (h.total_pages or 0) * page
    used = h.used_pages * page
    return {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": h.live_requests - h.queued_requests,
            "num_waiting_reqs": h.queued_requests, "num_used_tokens": used, "num_total_tokens": total,
            "max_total_num_tokens": total, "max_running_requests": engine.max_running_requests() or 0,
            "token_usage": used / total if total else 0.0, "cache_hit_rate": 0.0}


def get_and_post(app: FastAPI, path: str, endpoint, dependencies: list) -> None:
    """SGLang serves these on GET and POST; one schema entry (POST) is enough."""
    app.add_api_route(path, endpoint, methods=["POST"], dependencies=dependencies, operation_id=path.strip("/"))
    app.add_api_route(path, endpoint, methods=["GET"], dependencies=dependencies, include_in_schema=False)


def _memory_routes(app: FastAPI, engine: Engine) -> None:
    memory = engine.memory_control()
    admin = [Depends(require_admin)]

    def unsupported(route: str) -> JSONResponse:
        return _failure(f"the {engine.info().engine} engine does not serve {route}")

    async def in_thread(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def flush_cache(timeout: float = Query(0.0, ge=0.0)):
        """SGLang 0.5.17: with ``timeout`` > 0, wait that long for the server to become idle."""
        if memory is None:
            return unsupported("/flush_cache")
        deadline = time.monotonic() + timeout
        while not await in_thread(memory.flush_cache):
            if time.monotonic() >= deadline:
                return PlainTextResponse(FLUSH_REFUSED, status_code=400)
            await asyncio.sleep(FLUSH_POLL_S)
        return PlainTextResponse(FLUSHED)

    get_and_post(app, "/flush_cache", flush_cache, admin)

    def memory_route(path: str, release: bool):
        async def route(body: Optional[MemoryTagsIn] = Body(None)):
            if memory is None:
                return unsupported(path)
            tags = (body or MemoryTagsIn()).tags
            try:
                report = await in_thread(memory.release_memory if release else memory.resume_memory, tags)
            except MemoryBusyError as exc:
                return _failure(str(exc), "busy")
            return {"success": True, "message": "released" if release else "resumed",
                    "tags": list(report.changed) + list(report.kept), "changed": list(report.changed),
                    "kept": list(report.kept)}

        get_and_post(app, path, route, admin)

    memory_route("/release_memory_occupation", True)
    memory_route("/resume_memory_occupation", False)

    async def weights_checker(body: Optional[CheckWeightsIn] = Body(None)):
        if memory is None:
            return unsupported("/weights_checker")
        action = (body or CheckWeightsIn()).action
        if action not in WEIGHT_CHECK_ACTIONS:
            return _failure(f"Unsupported action={action!r} (one of {', '.join(WEIGHT_CHECK_ACTIONS)})", "invalid_request")
        try:
            payload = await in_thread(memory.check_weights, action)
        except ValueError as exc:
            return _failure(str(exc), "weights_differ")
        out: dict[str, Any] = {"success": True, "message": f"{action} done"}
        if payload is not None:
            out["ranks"] = [payload]
            out["per_engine_checksum"] = _engine_checksum(payload["per_gpu_checksum"])
        return out

    get_and_post(app, "/weights_checker", weights_checker, admin)


def _engine_checksum(per_gpu: str) -> str:
    return hashlib.sha256(per_gpu.encode()).hexdigest()


def _unsupported_weight_routes(app: FastAPI, engine: Engine) -> None:
    """``/update_weights_from_tensor``, which only an SGLang GPU worker can serve: an explicit 400 saying why
    (after auth)."""

    # engine.info() and the ports are read per request: on SGLang they need the tokenizer manager, which is
    # not up while the app is built.
    async def refuse():
        reason = NO_TENSOR_IPC.format(engine=engine.info().engine)
        return _failure(reason + (OR_DISTRIBUTED if engine.weight_groups() is not None else ""))

    app.add_api_route("/update_weights_from_tensor", refuse, methods=["POST"], dependencies=[Depends(require_admin)])
