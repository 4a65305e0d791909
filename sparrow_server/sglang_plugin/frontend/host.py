"""``sparrow-server serve --engine sglang``: SGLang's own HTTP server, with the sparrow backend
selected and the sparrow app mounted on the same FastAPI app.

SGLang's routes are registered first and win (``/generate``, ``/health``, ``/load_lora_adapter``,
``/update_weights_*``, ``/pause_generation``, ``/flush_cache``, ``/abort_request``, ``/v1/loads``,
``/release_memory_occupation``, ...); every other path falls through to the sparrow app
(``/rollout``, ``/schedules``, ``/adapters``, ``/metrics``). SGLang's ``/get_weight_version`` and
``/weight_version`` answer 404 in 0.5.17 and are replaced by ones that answer the version. The sparrow app's lifespan runs
inside SGLang's, once the tokenizer manager exists. ``/metrics`` serves the sparrow metrics plus
SGLang's own when ``--enable-metrics`` is on (SGLang's multiprocess collector).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

from sparrow_server.sglang_plugin.config import BACKEND_NAME, ENV_DEFAULT_SCHEDULE, ENV_SCHEDULE_DIR
from sparrow_server.sglang_plugin.config import PAGE_SIZE

# SGLang flags the sparrow server sets itself (from its own flags), so they must not come twice.
OWNED_SGLANG_FLAGS = ("--model-path", "--host", "--port", "--attention-backend", "--page-size", "--max-running-requests")


def sglang_argv(model: str, host: str, port: int, adapters: tuple[tuple[str, str], ...] = (),
                max_batch_size: int | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """SGLang ``ServerArgs`` command line: the sparrow backend, page 16, then the user's SGLang flags."""
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in OWNED_SGLANG_FLAGS:
            raise ValueError(f"SGLang argument {arg!r}: set by sparrow-server itself (use --model/--host/--port/"
                             "--max-batch-size; the backend is always sparrow with page size 16)")
    argv = ["--model-path", model, "--host", host, "--port", str(port), "--attention-backend", BACKEND_NAME,
            "--page-size", str(PAGE_SIZE)]
    if max_batch_size:
        argv += ["--max-running-requests", str(max_batch_size)]
    if adapters:
        argv += ["--lora-paths", *(f"{name}={path}" for name, path in adapters)]
    return argv + list(extra)


def plugin_environment(default_schedule: str, schedule_dir: str | None) -> dict[str, str]:
    """What the spawned scheduler processes read (``PluginConfig.from_env``)."""
    env = {ENV_DEFAULT_SCHEDULE: default_schedule}
    if schedule_dir:
        env[ENV_SCHEDULE_DIR] = schedule_dir
    return env


# SGLang 0.5.17 registers these and answers 404 ("moved to /model_info"); slime main still reads
# ``/get_weight_version``, so they are replaced, in place, by routes that answer the version.
SGLANG_WEIGHT_VERSION_PATHS = ("/get_weight_version", "/weight_version")


def serve_weight_version(sglang_app: Any, read_version: Callable[[], Any]) -> int:
    """Replace SGLang's 404 weight-version routes with ``{"weight_version": read_version()}``
    (same position, so they still win over the mounted sparrow app). Returns how many were replaced."""
    from fastapi.routing import APIRoute

    async def weight_version() -> dict[str, Any]:
        return {"weight_version": read_version()}

    routes = sglang_app.router.routes
    replaced = 0
    for i, route in enumerate(routes):
        if getattr(route, "path", None) in SGLANG_WEIGHT_VERSION_PATHS:
            routes[i] = APIRoute(route.path, weight_version, methods=["GET"])
            replaced += 1
    return replaced


def mount_sparrow(sglang_app: Any, sparrow_app: Any) -> None:
    """Mount ``sparrow_app`` under SGLang's routes (they win) and run its lifespan inside SGLang's."""
    sglang_app.mount("", sparrow_app)
    outer = sglang_app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app):
        async with outer(app):
            async with sparrow_app.router.lifespan_context(sparrow_app):
                yield

    sglang_app.router.lifespan_context = lifespan


def sglang_metrics_text() -> bytes:
    """SGLang's metrics (multiprocess collector), or nothing when ``--enable-metrics`` is off."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return b""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)


def run_sglang_server(argv: list[str], build_sparrow_app: Callable[[Any], Any], environ: dict[str, str],
                      admin_api_key: str | None = None) -> None:
    """Parse SGLang's args, register the plug-in, mount the sparrow app, and serve (blocks).

    ``build_sparrow_app(engine)`` builds the sparrow FastAPI app around the ``SGLangEngine``.
    ``admin_api_key``: the sparrow admin key, also made SGLang's ``admin_api_key`` (parsed in-process,
    never on a command line), so SGLang's own state-changing endpoints
    (``/update_weights_*``, ``/load_lora_adapter``, ``/pause_generation``) need the same token.
    """
    os.environ.update(environ)  # before SGLang spawns its scheduler processes
    from sglang.srt.entrypoints import http_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    from sparrow_server.sglang_plugin.frontend.engine import SGLangEngine
    from sparrow_server.sglang_plugin.frontend.runtime import TokenizerManagerRuntime

    load_plugins()  # registers the sparrow backend here, before ServerArgs validates its choice
    # Parsed in-process: the key never appears on a command line (ServerArgs is read-only once resolved).
    server_args = prepare_server_args(argv + (["--admin-api-key", admin_api_key] if admin_api_key else []))
    runtime = TokenizerManagerRuntime(lambda: getattr(http_server.get_global_state(), "tokenizer_manager", None))
    engine = SGLangEngine(runtime, adapters=tuple(_startup_adapters(server_args)))
    sparrow_app = build_sparrow_app(engine)
    sparrow_app.state.service.metrics.extra_sources.append(sglang_metrics_text)
    serve_weight_version(http_server.app,
                         lambda: http_server.get_global_state().tokenizer_manager.config_value("weight_version"))
    mount_sparrow(http_server.app, sparrow_app)
    try:
        http_server.launch_server(server_args)
    finally:  # as SGLang's launch_server entry point: take the scheduler processes down with us
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(os.getpid(), include_parent=False)


def _startup_adapters(server_args: Any) -> list[tuple[str, str]]:
    """(name, path) of the adapters SGLang loads at start (``--lora-paths``), as ServerArgs normalised them."""
    out = []
    for item in getattr(server_args, "lora_paths", None) or []:
        get = item.get if isinstance(item, dict) else (lambda key, _item=item: getattr(_item, key, None))
        if get("lora_name") and get("lora_path"):
            out.append((get("lora_name"), get("lora_path")))
    return out


__all__ = ["sglang_argv", "plugin_environment", "mount_sparrow", "serve_weight_version", "sglang_metrics_text", "run_sglang_server",
           "OWNED_SGLANG_FLAGS"]
