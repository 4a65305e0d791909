"""Loopback load generator: N concurrent streaming clients against a real ``serve`` subprocess.

Each client loops for the duration: ``POST /rollout`` with ``stream: true`` (SSE), reads every
event until ``done``, records latency and time to first token. An error is any non-200
answer, a final event carrying ``error``, a stream without a final event, or a transport
error. The server's resident memory (``/proc/<pid>/status`` VmRSS) is sampled every second.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from sparrow_server.models import TINY_VOCAB

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CLIENTS = 64
DEFAULT_DURATION_S = 60.0
DEFAULT_WARMUP_S = 5.0
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_PROMPT_TOKENS = (16, 64)


@dataclass
class LoadResult:
    clients: int
    duration_s: float
    requests: int
    errors: int
    tokens: int
    requests_per_s: float
    tokens_per_s: float
    latency_p50_s: float
    latency_p99_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    rss_start_mib: float
    rss_end_mib: float
    rss_max_mib: float
    error_examples: list[str] = field(default_factory=list)

    @property
    def rss_growth_mib(self) -> float:
        return self.rss_end_mib - self.rss_start_mib

    def to_dict(self) -> dict:
        return {**asdict(self), "rss_growth_mib": self.rss_growth_mib}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (no interpolation), NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class _Tally:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    examples: list[str] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.examples) < 5:
            self.examples.append(what[:300])


async def _one_rollout(client: httpx.AsyncClient, rng: random.Random, max_new_tokens: int,
                       prompt_tokens: tuple[int, int], tally: _Tally, record: bool) -> None:
    prompt = [rng.randrange(1, TINY_VOCAB - 1) for _ in range(rng.randint(*prompt_tokens))]
    body = {"input_ids": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0, "ignore_eos": True}}
    start = time.monotonic()
    first = None
    tokens = 0
    try:
        async with client.stream("POST", "/rollout", json=body) as response:
            if response.status_code != 200:
                tally.error(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if first is None:
                    first = time.monotonic()
                tokens += len(event.get("token_ids", ()))
                if "error" in event:
                    tally.error(f"error event: {event['error']}")
                    return
                if event.get("done"):
                    break
            else:
                tally.error("stream ended without a final event")
                return
    except httpx.HTTPError as exc:
        tally.error(f"{type(exc).__name__}: {exc}")
        return
    if record:
        tally.latencies.append(time.monotonic() - start)
        tally.ttfts.append((first or time.monotonic()) - start)
        tally.tokens += tokens


async def run_load(url: str, pid: int, clients: int = DEFAULT_CLIENTS, duration_s: float = DEFAULT_DURATION_S,
                   warmup_s: float = DEFAULT_WARMUP_S, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                   prompt_tokens: tuple[int, int] = DEFAULT_PROMPT_TOKENS, seed: int = 0,
                   headers: dict[str, str] | None = None) -> LoadResult:
    """Warm up for ``warmup_s`` (not counted), then measure ``duration_s`` with ``clients`` loops."""
    tally = _Tally()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0), limits=limits, headers=headers) as client:
        t0 = time.monotonic()
        measure_from = t0 + warmup_s
        stop_at = measure_from + duration_s
        rss: list[float] = []

        async def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < stop_at:
                record = time.monotonic() >= measure_from
                await _one_rollout(client, rng, max_new_tokens, prompt_tokens, tally, record)

        async def sampler() -> None:
            while time.monotonic() < stop_at:
                if time.monotonic() >= measure_from:
                    rss.append(rss_mib(pid))
                await asyncio.sleep(1.0)

        await asyncio.sleep(0)
        started = time.monotonic()
        await asyncio.gather(sampler(), *(worker(i) for i in range(clients)))
        rss.append(rss_mib(pid))
    elapsed = time.monotonic() - max(measure_from, started)
    n = len(tally.latencies)
    return LoadResult(
        clients=clients, duration_s=elapsed, requests=n, errors=tally.errors, tokens=tally.tokens,
        requests_per_s=n / elapsed, tokens_per_s=tally.tokens / elapsed,
        latency_p50_s=quantile(tally.latencies, 0.5), latency_p99_s=quantile(tally.latencies, 0.99),
        ttft_p50_s=quantile(tally.ttfts, 0.5), ttft_p99_s=quantile(tally.ttfts, 0.99),
        rss_start_mib=rss[0], rss_end_mib=rss[-1], rss_max_mib=max(rss), error_examples=tally.examples,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_tiny_model(directory: Path) -> Path:
    """The product's tiny random Llama (``sparrow_server.models.save_tiny_model``, what the tests serve)."""
    from sparrow_server.models import save_tiny_model as save

    return save(directory)


class Server:
    """``sparrow-server serve`` on a free loopback port (reference engine, CPU)."""

    def __init__(self, model: Path, workdir: Path, *extra: str, threads: int = 1, timeout_s: float = 180.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "server.log"
        cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference", "--model", str(model),
               "--device", "cpu", "--threads", str(threads), "--port", str(self.port), "--state-dir",
               str(workdir / "state"), "--log-level", "warning", *extra]
        self.command = " ".join(cmd[1:]).replace(str(model), "MODEL_DIR").replace(str(workdir / "state"), "STATE_DIR")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        from sparrow_server.commands.demo import wait_healthy

        try:
            wait_healthy(self.url, self.proc, timeout_s)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {self.log_path.read_text()[-2000:]}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def load_test(clients: int = DEFAULT_CLIENTS, duration_s: float = DEFAULT_DURATION_S, warmup_s: float = DEFAULT_WARMUP_S,
              max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, model: Path | None = None, workdir: Path | None = None,
              server_args: tuple[str, ...] = ()) -> tuple[LoadResult, str]:
    """Start a server (a tiny random model unless ``model``), load it, stop it; (result, server command)."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = workdir or Path(tmp)
        model = model or save_tiny_model(workdir / "model")
        server = Server(model, workdir, "--max-batch-size", str(clients), *server_args)
        try:
            result = asyncio.run(run_load(server.url, server.proc.pid, clients, duration_s, warmup_s, max_new_tokens))
        finally:
            server.stop()
        return result, server.command
