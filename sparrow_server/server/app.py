"""The FastAPI app: ``/rollout``, SGLang's ``/generate`` and control plane, OpenAI's routes,
schedules, health, metrics.

``create_app(engine, schedules=...)`` builds an app around any ``Engine``; the app starts the
engine on startup and shuts it down on exit.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from fastapi import Body, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sparrow_server.engine.adapter_versions import AdapterManager, default_adapter_manager
from sparrow_server.engine.gated import GatedEngine
from sparrow_server.engine.base import Engine
from sparrow_server.monitor.service_hooks import build_verifier
from sparrow_server.monitor.verifier import DEFAULT_SAMPLE_FRACTION
from sparrow_server.server import formats
from sparrow_server.server.adapters import install_adapter_routes
from sparrow_server.server.admission import (
    GuardedStreamingResponse,
    admission_of,
    guarded_call,
    guarded_stream,
    install_admission,
)
from sparrow_server.server.api_models import RolloutIn
from sparrow_server.server.autopilot import ServerAutopilot, install_autopilot_routes
from sparrow_server.server.control import install_control_routes
from sparrow_server.server.default_schedule import install_default_schedule_routes, saved_default
from sparrow_server.server.errors import error_response, install_error_handlers
from sparrow_server.server.generate import install_generate_routes
from sparrow_server.server.openai_routes import install_openai_routes
from sparrow_server.server.handling import CLIENT_CLOSED, NDJSON, SSE, admit, unless_disconnected
from sparrow_server.server.limits import Limits, install_limits
from sparrow_server.server.openapi import install_openapi
from sparrow_server.server.request_checks import check_json_body
from sparrow_server.server.metrics import METRICS_CONTENT_TYPE, ServiceMetrics
from sparrow_server.server.security import SecurityConfig, install_security, require_admin, require_rollout_auth
from sparrow_server.server.service import RolloutService
from sparrow_server.server.shutdown import install_shutdown
from sparrow_server.server.weight_groups import install_weight_group_routes
from sparrow_server.server.weights import install_weight_routes
from sparrow_server.sparsity.registry import ScheduleRegistry, UnknownScheduleError
from sparrow_server.sparsity.schedule import DENSE_SCHEDULE_NAME, ScheduleError, schedule_from_dict



def create_app(engine: Engine, schedules: ScheduleRegistry | None = None, default_schedule: str = DENSE_SCHEDULE_NAME,
               tokenizer: Any | None = None, metrics: ServiceMetrics | None = None,
               security: SecurityConfig | None = None, limits: Limits | None = None,
               verify_fraction: float = DEFAULT_SAMPLE_FRACTION, adapters: AdapterManager | None = None,
               autopilot_dir: Path | None = None) -> FastAPI:
    schedules = schedules or ScheduleRegistry()
    schedules.get(default_schedule)  # an unknown default fails at start, not per request
    startup_default, default_schedule = default_schedule, saved_default(schedules) or default_schedule
    adapters = adapters or default_adapter_manager(engine)
    service = RolloutService(GatedEngine(engine, adapters), schedules, metrics or ServiceMetrics(), default_schedule,
                             tokenizer)
    service.verifier = build_verifier(engine, service.metrics.acceptance, verify_fraction)
    autopilot = ServerAutopilot(service, service.metrics.registry, autopilot_dir)
    if service.verifier is not None:
        service.verifier.listeners.append(autopilot.on_verified)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await engine.start()
        try:
            yield
        finally:
            await engine.shutdown()
            if service.verifier is not None:
                service.verifier.close(wait=False)

    app = FastAPI(title="Sparrow Server", version="0.1.0", lifespan=lifespan, dependencies=[Depends(check_json_body)])
    app.state.service = service
    app.state.autopilot = autopilot
    app.state.engine = engine
    install_error_handlers(app)
    _hardening(app, service, security, limits or Limits())
    _rollout_routes(app, service)
    install_generate_routes(app, service)
    install_openai_routes(app, service)
    _schedule_routes(app, service, autopilot)
    install_autopilot_routes(app, autopilot)
    install_default_schedule_routes(app, service, startup_default)
    _ops_routes(app, service)
    install_weight_routes(app, engine)
    install_weight_group_routes(app, engine)
    install_control_routes(app, service, engine)
    install_adapter_routes(app, adapters)
    install_openapi(app)
    return app


def _hardening(app: FastAPI, service: RolloutService, security: SecurityConfig | None, limits: Limits) -> None:
    """Auth config, body-size limit, admission (slots, queue, timeouts) and graceful drain."""
    install_security(app, security)
    install_limits(app, limits)
    admission = install_admission(app, limits, service.metrics.registry)
    install_shutdown(app, admission, limits.retry_after_s)


def _wants_ndjson(request: Request) -> bool:
    return NDJSON in request.headers.get("accept", "")


def _rollout_routes(app: FastAPI, service: RolloutService) -> None:
    @app.post("/rollout", dependencies=[Depends(require_rollout_auth)])
    async def rollout(body: RolloutIn, request: Request):
        input_ids = service.encode(body.input_ids, body.text, body.apply_chat_template)
        n = body.n if body.n != 1 else body.sampling_params.n
        ro = service.prepare("rollout", input_ids, body.sampling_params, body.schedule, body.adapter, body.top_logprobs,
                             n, body.rid, return_selected_pages=body.return_selected_pages, verify=body.verify)
        slot = await admit(request, ro)
        with_text = service.tokenizer is not None
        if body.stream:
            encode, media = (formats.ndjson, NDJSON) if _wants_ndjson(request) else (formats.sse, SSE)

            async def events():
                async with contextlib.aclosing(service.stream(ro)) as stream:  # closing events closes it now
                    async for sample, chunk, delta in stream:
                        yield encode(formats.rollout_event(ro, sample, chunk, delta, time.monotonic() - ro.started))

            def error_event(error: dict[str, Any]) -> bytes:
                return encode({"rid": ro.rid, "error": error, "done": True})

            body_iter = guarded_stream(admission_of(request), slot, events(), error_event)
            return GuardedStreamingResponse(body_iter, media_type=media)
        samples = await guarded_call(admission_of(request), slot, unless_disconnected(service.collect(ro), request))
        if samples is None:
            return Response(status_code=CLIENT_CLOSED)
        elapsed = time.monotonic() - ro.started
        results = [formats.rollout_result(ro, s, elapsed, body.top_logprobs > 0, with_text) for s in samples]
        return results[0] if n == 1 else {"rid": ro.rid, "n": n, "samples": results}


def _schedule_routes(app: FastAPI, service: RolloutService, autopilot: ServerAutopilot) -> None:
    @app.get("/schedules")
    async def list_schedules():
        return {"default": service.default_schedule,
                "schedules": [s.to_dict() for s in service.schedules.schedules()]}

    @app.get("/schedules/{name}")
    async def get_schedule(name: str):
        base, _, version = name.partition("@")
        try:
            return service.schedules.get(name).to_dict()
        except UnknownScheduleError:
            older = autopilot.history.version(base, int(version)) if version.isdigit() else None
            if older is None:
                raise
            return older.to_dict()  # a version served before (GET /schedules/{name}/history)

    @app.put("/schedules/{name}", dependencies=[Depends(require_admin)])
    async def put_schedule(name: str, body: Any = Body(...)):
        if not isinstance(body, dict):
            raise ScheduleError("<root>", type(body).__name__, "a schedule must be a JSON object")
        data = {**body}
        if data.setdefault("name", name) != name:
            raise ScheduleError("name", data["name"], f"differs from the name in the path ({name!r})")
        if "version" not in data and name in service.schedules and not service.schedules.is_builtin(name):
            current = service.schedules.get(name)  # a change publishes the next version; the same content keeps it
            if schedule_from_dict({**data, "version": current.version}) != current:
                data["version"] = current.version + 1
            else:
                data["version"] = current.version
        schedule = schedule_from_dict(data)
        service.engine.check_schedule(schedule)
        persist = service.schedules.persist_dir is not None
        service.schedules.register(schedule, persist=persist, replace=True)
        autopilot.history.record(schedule, "put", weight_version=service.engine.info().weight_version or None)
        autopilot.metrics.publish_schedule(schedule)
        return schedule.to_dict()


def _ops_routes(app: FastAPI, service: RolloutService) -> None:
    engine = service.engine

    @app.get("/health")
    async def health():
        """503 whenever no token can come (SGLang 0.5.17's /health runs its generation check): the loop is
        down (``unavailable``), the KV cache is released (``memory_released``) or generation is paused."""
        h = engine.health()
        status = "unavailable" if not h.ok else h.held or "ok"
        body = {"status": status, "live_requests": h.live_requests, "queued_requests": h.queued_requests,
                "free_pages": h.free_pages, "total_pages": h.total_pages, "detail": h.detail}
        return JSONResponse(body, status_code=200 if h.serving else 503)

    @app.get("/metrics")
    async def metrics():
        service.metrics.set_engine_state(engine.health(), engine.info().weight_version)
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/model_info")
    @app.get("/get_model_info")  # SGLang's deprecated alias; the router falls back to it
    async def model_info():
        info = engine.info()
        return {"model_path": info.model_name, "tokenizer_path": info.model_name if service.tokenizer else None,
                "is_generation": True, "weight_version": info.weight_version}


__all__ = ["create_app", "error_response"]
