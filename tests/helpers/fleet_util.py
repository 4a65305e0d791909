"""Loopback fleet fixtures: the real ``sglang-router`` (launched by ``benchmarks/fleet_router.py``,
re-exported here), reference-engine sparrow servers as workers, and a stand-in worker that answers
what the router probes.

Everything binds to 127.0.0.1 on free ports; every wait is bounded. Used by the fleet tests. Run a
stand-in by hand with ``python tests/helpers/fleet_util.py standin --port 8001``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from fleet_router import (  # noqa: E402,F401  (the router launcher lives with the fleet benchmarks)
    DEFAULT_ROUTER_SETTINGS, LOOPBACK, ROUTER_VERSION_OBSERVED, ManagedProcess, Router, RouterSettings, free_port,
    router_available, router_command, router_version, running_router, spawn_process, start_router, wait_until,
)

# ---------------------------------------------------------------------------------------------
# Real sparrow servers (reference engine) as workers.
# ---------------------------------------------------------------------------------------------



def spawn_sparrow_server(log_dir: Path, port: int | None = None, extra_args: tuple[str, ...] = ()) -> ManagedProcess:
    """Start ``sparrow-server serve --engine reference`` on loopback (embedded model unless
    ``extra_args`` names ``--model``); returns at once, see ``wait_server_healthy``."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference",
           "--host", LOOPBACK, "--port", str(port), *extra_args]
    log_path = log_dir / f"sparrow-{port}-{time.monotonic_ns()}.log"
    log = open(log_path, "wb")
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    log.close()
    return ManagedProcess(popen=popen, url=f"http://{LOOPBACK}:{port}", log_path=log_path)


def wait_server_healthy(server: ManagedProcess, timeout_s: float = 240.0) -> None:
    """Wait for ``/health`` 200 (the model loads first: ~30 s for the embedded one on 2 cores)."""
    try:
        wait_until(lambda: server.alive() and httpx.get(f"{server.url}/health", timeout=5).status_code == 200,
                   timeout_s, f"sparrow server at {server.url}", interval_s=0.5)
    except TimeoutError as exc:
        server.stop()
        raise RuntimeError(f"{exc}\n--- server log ---\n{server.log_tail()}") from exc


# ---------------------------------------------------------------------------------------------
# Stand-in worker: answers the router's probes and echoes what reached it.
# ---------------------------------------------------------------------------------------------

def spawn_standin_worker(log_dir: Path, port: int | None = None, unhealthy_for_s: float = 0.0,
                         generate_delay_s: float = 0.0) -> ManagedProcess:
    """Start a stand-in worker process on loopback (on ``port`` if given, e.g. to restart one)."""
    port = port or free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "standin", "--port", str(port),
           "--unhealthy-for", str(unhealthy_for_s), "--generate-delay", str(generate_delay_s)]
    return spawn_process(cmd, f"http://{LOOPBACK}:{port}", log_dir / f"standin-{port}-{time.monotonic_ns()}.log")


def wait_listening(worker: ManagedProcess, timeout_s: float = 20.0) -> None:
    """Wait until ``/health`` answers at all (503 while "loading" included)."""
    try:
        wait_until(lambda: worker.alive() and httpx.get(f"{worker.url}/health", timeout=2).status_code in (200, 503),
                   timeout_s, f"stand-in worker at {worker.url}")
    except TimeoutError as exc:
        worker.stop()
        raise RuntimeError(f"{exc}\n--- worker log ---\n{worker.log_tail()}") from exc


def start_standin_worker(log_dir: Path, port: int | None = None, unhealthy_for_s: float = 0.0,
                         generate_delay_s: float = 0.0) -> ManagedProcess:
    worker = spawn_standin_worker(log_dir, port, unhealthy_for_s, generate_delay_s)
    wait_listening(worker)
    return worker


def start_standin_workers(log_dir: Path, count: int, generate_delay_s: float = 0.0) -> list[ManagedProcess]:
    """Start ``count`` stand-in workers in parallel and wait until all listen."""
    workers = [spawn_standin_worker(log_dir, generate_delay_s=generate_delay_s) for _ in range(count)]
    try:
        for worker in workers:
            wait_listening(worker)
    except Exception:
        for worker in workers:
            worker.stop()
        raise
    return workers


def standin_worker_app(name: str, unhealthy_for_s: float = 0.0, generate_delay_s: float = 0.0) -> FastAPI:
    """A FastAPI app with the endpoints an SGLang worker exposes to the router, plus ``/rollout``.

    ``GET /_seen`` returns every (method, path, rid) it served, so a test can tell which routes
    passed through the router and how often a request id arrived. ``/health`` answers 503 for the
    first ``unhealthy_for_s`` seconds, as a server does while it loads its model; other routes
    answer after ``generate_delay_s`` (requests in flight, as while decoding).
    """
    healthy_from = time.monotonic() + unhealthy_for_s
    app = FastAPI()
    seen: list[dict] = []
    info = {"model_path": "stand-in", "tokenizer_path": None, "is_generation": True}

    async def record(request: Request) -> dict:
        body = await request.body()
        await asyncio.sleep(generate_delay_s)
        payload = _json_or_none(body)
        rid = payload.get("rid") if isinstance(payload, dict) else None
        seen.append({"method": request.method, "path": request.url.path, "rid": rid})
        return {"worker": name, "path": request.url.path, "received": payload}

    @app.get("/health")
    async def health():
        if time.monotonic() < healthy_from:
            return PlainTextResponse("loading", status_code=503)
        return PlainTextResponse("ok")

    @app.get("/_seen")
    async def seen_requests():
        return {"worker": name, "seen": seen}

    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        app.add_api_route(path, lambda: dict(info, worker=name), methods=["GET"])
    app.add_api_route("/v1/models", lambda: {"object": "list", "data": [{"id": "stand-in", "object": "model"}]},
                      methods=["GET"])
    app.add_api_route("/get_load", lambda: {"num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}, methods=["GET"])

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def any_other(request: Request):
        return await record(request)

    return app


def _json_or_none(body: bytes):
    import json

    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    standin = sub.add_parser("standin", help="run a stand-in worker on loopback")
    standin.add_argument("--port", type=int, required=True)
    standin.add_argument("--unhealthy-for", type=float, default=0.0, help="answer /health with 503 for this many seconds")
    standin.add_argument("--generate-delay", type=float, default=0.0, help="seconds each non-probe request takes")
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(standin_worker_app(f"standin-{args.port}", args.unhealthy_for, args.generate_delay), host=LOOPBACK, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
