"""Loopback fleet fixtures: the real ``sglang-router`` binary in front of a list of worker URLs,
and a stand-in worker that answers what the router probes.

Everything binds to 127.0.0.1 on free ports; every wait is bounded. Used by
``tests/e2e/test_fleet_router.py`` and meant for the CPU fleet test (reference-engine servers instead
of stand-ins). Run a stand-in by hand with ``python tests/helpers/fleet_util.py standin --port 8001``.

Router behaviour this relies on (observed with sglang-router 0.3.2, see docs/fleet.md): workers are
listed by ``GET /workers`` with ``url`` and ``is_healthy``; ``POST /workers {"url": ...}`` adds one
(202, background); ``DELETE /workers/{worker_id}`` removes one by its UUID, not its URL.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

LOOPBACK = "127.0.0.1"
# The router release the observations in docs/fleet.md were made with.
ROUTER_VERSION_OBSERVED = "0.3.2"


@dataclass(frozen=True)
class RouterSettings:
    """Router flags for a loopback fleet; fast health checks so a killed worker drops out in ~1 s."""

    policy: str = "round_robin"
    health_check_interval_s: int = 1
    health_check_timeout_s: int = 1
    health_failure_threshold: int = 1
    health_success_threshold: int = 1
    retry_max_retries: int = 3
    # off, as deploy/ runs the router (docs/fleet.md): it counts 4xx answers and requests cut by a kill
    # as failures, and once open it keeps a healthy, restarted worker out of the rotation for 60 s
    circuit_breaker: bool = False
    startup_timeout_s: float = 30.0


DEFAULT_ROUTER_SETTINGS = RouterSettings()


def router_available() -> bool:
    """True when the ``sglang_router`` package (which ships the Rust router) is importable."""
    return importlib.util.find_spec("sglang_router") is not None


def router_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-router")
    except PackageNotFoundError:
        return None


def free_port() -> int:
    """A TCP port on the loopback interface that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll ``predicate`` until it is true; raise ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if predicate():
                return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class ManagedProcess:
    """A child process with its log file; ``stop`` is idempotent."""

    popen: subprocess.Popen
    url: str
    log_path: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        if not self.alive():
            return
        self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=timeout_s)

    def kill(self) -> None:
        """Abrupt death (SIGKILL), as when a GPU server crashes."""
        self.stop(signal.SIGKILL)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def _spawn(cmd: list[str], url: str, log_path: Path) -> ManagedProcess:
    log = open(log_path, "wb")  # the child keeps its own handle; ours closes with the Popen
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return ManagedProcess(popen=popen, url=url, log_path=log_path)


def router_command(worker_urls: list[str], port: int, metrics_port: int, settings: RouterSettings) -> list[str]:
    """The router's command line (``python -m sglang_router.launch_router`` == ``sglang-router launch``)."""
    return [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", LOOPBACK, "--port", str(port),
        "--prometheus-host", LOOPBACK, "--prometheus-port", str(metrics_port),
        "--policy", settings.policy,
        "--health-check-interval-secs", str(settings.health_check_interval_s),
        "--health-check-timeout-secs", str(settings.health_check_timeout_s),
        "--health-failure-threshold", str(settings.health_failure_threshold),
        "--health-success-threshold", str(settings.health_success_threshold),
        "--retry-max-retries", str(settings.retry_max_retries),
        "--worker-startup-timeout-secs", str(int(settings.startup_timeout_s)),
        "--worker-startup-check-interval", "1",
        "--log-level", "info",
        *(() if settings.circuit_breaker else ("--disable-circuit-breaker",)),
        "--worker-urls", *worker_urls,
    ]


@dataclass
class Router:
    """A running router: its URL, its metrics URL and the worker-management calls."""

    process: ManagedProcess
    metrics_url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10.0))

    @property
    def url(self) -> str:
        return self.process.url

    def workers(self) -> list[dict]:
        """``GET /workers``: one dict per worker with ``id``, ``url``, ``is_healthy``, ..."""
        return self.client.get(f"{self.url}/workers").json()["workers"]

    def healthy_worker_urls(self) -> set[str]:
        return {w["url"] for w in self.workers() if w["is_healthy"]}

    def wait_healthy(self, urls: list[str], timeout_s: float) -> None:
        wanted = set(urls)
        wait_until(lambda: wanted <= self.healthy_worker_urls(), timeout_s, f"router to mark {sorted(wanted)} healthy")

    def wait_unhealthy(self, url: str, timeout_s: float) -> None:
        wait_until(lambda: url not in self.healthy_worker_urls(), timeout_s, f"router to drop {url}")

    def add_worker(self, url: str) -> None:
        response = self.client.post(f"{self.url}/workers", json={"url": url})
        response.raise_for_status()

    def remove_worker(self, url: str) -> None:
        """Remove by URL: the API takes the worker's UUID, so look it up first."""
        ids = [w["id"] for w in self.workers() if w["url"] == url]
        if not ids:
            raise KeyError(f"worker url={url!r} is not registered with the router")
        self.client.delete(f"{self.url}/workers/{ids[0]}").raise_for_status()

    def metrics_text(self) -> str:
        return self.client.get(f"{self.metrics_url}/metrics").text

    def stop(self) -> None:
        self.client.close()
        self.process.stop()


def start_router(worker_urls: list[str], log_dir: Path, settings: RouterSettings = DEFAULT_ROUTER_SETTINGS) -> Router:
    """Start the real router on free loopback ports and wait until every worker is healthy in it."""
    if not router_available():
        raise RuntimeError("sglang-router is not installed (pip install sglang-router)")
    port, metrics_port = free_port(), free_port()
    url = f"http://{LOOPBACK}:{port}"
    cmd = router_command(worker_urls, port, metrics_port, settings)
    router = Router(_spawn(cmd, url, log_dir / f"router-{port}.log"), f"http://{LOOPBACK}:{metrics_port}")
    try:
        wait_until(lambda: router.process.alive() and router.client.get(f"{url}/liveness").status_code == 200,
                   settings.startup_timeout_s, f"router at {url} to answer /liveness")
        router.wait_healthy(worker_urls, settings.startup_timeout_s)
    except Exception as exc:
        router.stop()
        raise RuntimeError(f"router failed to start: {exc}\n--- router log ---\n{router.process.log_tail()}") from exc
    return router


@contextlib.contextmanager
def running_router(worker_urls: list[str], log_dir: Path | None = None,
                   settings: RouterSettings = DEFAULT_ROUTER_SETTINGS) -> Iterator[Router]:
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sparrow-router-")))
        router = start_router(worker_urls, log_dir, settings)
        stack.callback(router.stop)
        yield router


# ---------------------------------------------------------------------------------------------
# Real sparrow servers (reference engine) as workers.
# ---------------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]


def spawn_sparrow_server(log_dir: Path, port: int | None = None, extra_args: tuple[str, ...] = ()) -> ManagedProcess:
    """Start ``sparrow-server serve --engine reference`` on loopback (embedded model unless
    ``extra_args`` names ``--model``); returns at once, see ``wait_server_healthy``."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference",
           "--host", LOOPBACK, "--port", str(port), *extra_args]
    log_path = log_dir / f"sparrow-{port}-{time.monotonic_ns()}.log"
    log = open(log_path, "wb")
    popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
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
    return _spawn(cmd, f"http://{LOOPBACK}:{port}", log_dir / f"standin-{port}-{time.monotonic_ns()}.log")


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
