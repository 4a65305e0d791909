"""The real ``sglang-router`` on loopback in front of a list of worker URLs, for the fleet benchmarks
and the fleet tests (``tests/helpers/fleet_util.py`` re-exports it).

Everything binds to 127.0.0.1 on free ports; every wait is bounded. Router behaviour this relies on
(observed with sglang-router 0.3.2, see docs/fleet.md): workers are listed by ``GET /workers`` with
``url`` and ``is_healthy``; ``POST /workers {"url": ...}`` adds one (202, background);
``DELETE /workers/{worker_id}`` removes one by its UUID, not its URL.
"""
from __future__ import annotations

import contextlib
import importlib.util
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

LOOPBACK = "127.0.0.1"
# The router release the observations in docs/fleet.md were made with.
ROUTER_VERSION_OBSERVED = "0.3.2"


@dataclass(frozen=True)
class RouterSettings:
    """Router flags for a loopback fleet: health checks every second, so a killed worker (its port
    refuses at once) drops out in ~2 s, while a live one must miss two checks of 5 s each (one slow
    answer on a loaded box no longer drops it: a 1 s timeout and one miss did)."""

    policy: str = "round_robin"
    health_check_interval_s: int = 1
    health_check_timeout_s: int = 5
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    retry_max_retries: int = 3
    # the router's own defaults; a fleet whose dead worker takes seconds to drop out of the rotation
    # spreads its retries over longer (benchmarks/fleet_gpu/common.py)
    retry_initial_backoff_ms: int = 50
    retry_backoff_multiplier: float = 1.5
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


def spawn_process(cmd: list[str], url: str, log_path: Path) -> ManagedProcess:
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
        "--retry-initial-backoff-ms", str(settings.retry_initial_backoff_ms),
        "--retry-backoff-multiplier", str(settings.retry_backoff_multiplier),
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
    router = Router(spawn_process(cmd, url, log_dir / f"router-{port}.log"), f"http://{LOOPBACK}:{metrics_port}")
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
