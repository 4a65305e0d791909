"""A CPU fleet end to end: three reference-engine servers behind the real ``sglang-router``; a
client drives schedule-carrying ``/generate`` rollouts through the router while one server is
SIGKILLed and restarted. Every request completes exactly once from the client's view, the
schedule survives the router (``extra_key``), and the restarted server gets traffic again.

Exactly-once, as tested here: the client sends each request with a ``rid`` and resends the same
body after a connection error, 408/409/429 or 5xx (``sparrow_server.client``); it returns one
result per call, whose ``meta_info.id`` is that ``rid``. A server refuses a ``rid`` that is live on
it with 409 (the router passes 409 through without trying another worker), so a retry never runs
beside its own earlier attempt on one server. Across servers nothing de-duplicates: a request cut
off by a dying server runs again elsewhere (its first run is lost with the server).

Start-up is the slow part (importing torch and transformers takes ~10 s of CPU per process), so
the servers are forked from one "zygote" process that imported everything once: each server is
still its own process running ``sparrow-server serve`` and dies for real under SIGKILL. The fast
tests at the top check the schedule precedence, ``/model_info`` and the client's payloads in-process.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

SPARSE_SCHEDULE = {"budgets_tokens": [64], "dense_layers": [0], "description": "fleet test: 4 pages of KV"}
SCHEDULE_NAME = "fleet-sparse"
PROMPT_LEN = 48
NEW_TOKENS = 48  # prompt + generation = 96 tokens > the 64-token budget, so the schedule is visibly sparse


# ---------------------------------------------------------------------------------------------
# Fast, in-process: schedule precedence on /generate, /model_info, the client's /generate body.
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api():
    from fastapi.testclient import TestClient

    from helpers.fake_engine import FakeEngine
    from sparrow_server.server.app import create_app
    from sparrow_server.sparsity.registry import ScheduleRegistry
    from sparrow_server.sparsity.schedule import schedule_from_dict

    schedules = ScheduleRegistry()
    schedules.register(schedule_from_dict({"name": SCHEDULE_NAME, **SPARSE_SCHEDULE}))
    with TestClient(create_app(FakeEngine(), schedules, default_schedule="dense")) as client:
        yield client


def _schedule_of(api, **body) -> tuple[int, dict]:
    body = {"input_ids": [1, 2, 3], **body}
    body["sampling_params"] = {"max_new_tokens": 2, **body.get("sampling_params", {})}
    response = api.post("/generate", json=body)
    return response.status_code, response.json()


@pytest.mark.parametrize("body, expected", [
    ({}, "dense"),  # the server's default
    ({"extra_key": f"sparrow_schedule={SCHEDULE_NAME}"}, SCHEDULE_NAME),
    ({"extra_key": "some-cache-salt"}, "dense"),  # any other extra_key is only a cache salt
    ({"sampling_params": {"custom_params": {"sparrow_schedule": SCHEDULE_NAME}}}, SCHEDULE_NAME),
    ({"sampling_params": {"custom_params": {"sparrow_schedule": "dense"}},
      "extra_key": f"sparrow_schedule={SCHEDULE_NAME}"}, "dense"),  # custom_params first
])
def test_generate_schedule_precedence(api, body, expected):
    status, answer = _schedule_of(api, **body)
    assert status == 200, answer
    assert answer["meta_info"]["sparrow"]["schedule"] == expected
    assert answer["meta_info"]["sparrow"]["schedule_id"].startswith(f"{expected}@")


def test_generate_schedule_errors_are_4xx(api):
    status, answer = _schedule_of(api, extra_key="sparrow_schedule=no-such-schedule")
    assert (status, answer["error"]["type"], answer["error"]["name"]) == (404, "unknown_schedule", "no-such-schedule")
    status, answer = _schedule_of(api, extra_key="sparrow_schedule=")
    assert (status, answer["error"]["field"]) == (422, "extra_key")


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info_has_sglangs_fields(api, path):
    info = api.get(path).json()
    assert set(info) >= {"model_path", "tokenizer_path", "is_generation", "weight_version"}
    assert info["is_generation"] is True and info["tokenizer_path"] is None  # the fake engine has no tokenizer


def test_client_generate_body_carries_the_schedule_both_ways():
    from sparrow_server.client import generate_payload

    body = generate_payload({"input_ids": [1], "sampling_params": {"n": 2}}, schedule=SCHEDULE_NAME)
    assert body["sampling_params"] == {"n": 2, "custom_params": {"sparrow_schedule": SCHEDULE_NAME}}
    assert body["extra_key"] == f"sparrow_schedule={SCHEDULE_NAME}" and body["rid"] and body["stream"] is False
    named = {"rid": "r1", "sampling_params": {"custom_params": {"sparrow_schedule": "dense"}}}
    assert generate_payload(named)["extra_key"] == "sparrow_schedule=dense"  # mirrored from custom_params
    assert generate_payload(named)["rid"] == "r1"
    assert "extra_key" not in generate_payload({"input_ids": [1]})
    with pytest.raises(ValueError, match="extra_key"):
        generate_payload({"extra_key": "salt"}, schedule=SCHEDULE_NAME)
    with pytest.raises(ValueError, match="custom_params"):
        generate_payload(named, schedule=SCHEDULE_NAME)


# ---------------------------------------------------------------------------------------------
# The zygote: imports the server once, then forks `serve` processes on request.
# ---------------------------------------------------------------------------------------------

def _zygote_main() -> int:
    """Read one JSON command per stdin line: ``{"argv": [...], "log": path}`` forks a child that
    runs ``sparrow-server <argv>`` with stdout/stderr to ``log`` and answers ``{"pid": N}``. On EOF,
    SIGKILL every child still running. Only imports happen here (no torch op, no thread), so
    forking is safe."""
    import sparrow_server.cli as cli
    import sparrow_server.commands.serve  # noqa: F401
    import sparrow_server.engine.reference.factory  # noqa: F401
    import sparrow_server.server.app  # noqa: F401
    import transformers  # noqa: F401
    import uvicorn  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    children: list[int] = []
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            fd = os.open(command["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            code = 1
            try:
                code = cli.main(command["argv"])
            finally:
                sys.stdout.flush()
                os._exit(code)
        children.append(pid)
        print(json.dumps({"pid": pid}), flush=True)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return 0


@dataclass
class ForkedServer:
    """One ``serve`` process forked by the zygote (not our child: liveness by ``kill(pid, 0)``)."""

    pid: int
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        _wait_for(lambda: not self.alive(), 10, f"pid {self.pid} to die")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class Zygote:
    def __init__(self, log_dir: Path, timeout_s: float = 120.0):
        self.log_dir = log_dir
        cmd = [sys.executable, str(Path(__file__).resolve()), "zygote"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
        self.stderr = open(log_dir / "zygote.log", "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     cwd=REPO, env=env, text=True, bufsize=1)
        self._reply(timeout_s)

    def _reply(self, timeout_s: float) -> dict:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                raise RuntimeError(f"zygote silent for {timeout_s} s: {(self.log_dir / 'zygote.log').read_text()[-2000:]}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"zygote exited: {(self.log_dir / 'zygote.log').read_text()[-2000:]}")
        return json.loads(line)

    def serve(self, port: int, *args: str) -> ForkedServer:
        log_path = self.log_dir / f"sparrow-{port}-{time.monotonic_ns()}.log"
        argv = ["serve", "--engine", "reference", "--host", "127.0.0.1", "--port", str(port), *args]
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log_path)}) + "\n")
        return ForkedServer(self._reply(10.0)["pid"], port, log_path)

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def _wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if predicate():
                return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _wait_healthy(server: ForkedServer, timeout_s: float = 60.0) -> None:
    def healthy() -> bool:
        if not server.alive():
            raise RuntimeError(f"server on port {server.port} exited:\n{server.log_tail()}")
        return httpx.get(f"{server.url}/health", timeout=2).status_code == 200

    try:
        _wait_for(healthy, timeout_s, f"server on port {server.port}", interval_s=0.2)
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}\n{server.log_tail()}") from exc


if __name__ == "__main__" and sys.argv[1:] == ["zygote"]:
    sys.exit(_zygote_main())
