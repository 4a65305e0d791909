"""``sparrow-server serve`` processes forked from a "zygote" that imported the server once.

Importing torch and transformers costs ~10 s of CPU per process, so a test that starts several
servers (and restarts one) pays it once: ``Zygote`` runs ``python -m helpers.forked_servers zygote``,
which imports everything and then forks one child per ``serve`` command. Each child is a real
process running ``sparrow-server serve`` (its own pid, port and log) and dies for real under SIGKILL.
Only imports happen in the zygote (no torch op, no thread), so forking it is safe.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import httpx

from helpers.fleet_util import wait_until as wait_for  # one poll loop for the fleet tests

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent



def zygote_main() -> int:
    """Read one JSON command per stdin line: ``{"argv": [...], "log": path}`` forks a child that
    runs ``sparrow-server <argv>`` with stdout/stderr to ``log`` and answers ``{"pid": N}``. On EOF,
    SIGKILL every child still running."""
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
            except BaseException:  # os._exit below would swallow the traceback: put it in the log
                traceback.print_exc()
                raise
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
        wait_for(lambda: not self.alive(), 10, f"pid {self.pid} to die")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class Zygote:
    def __init__(self, log_dir: Path, timeout_s: float = 120.0):
        self.log_dir = log_dir
        cmd = [sys.executable, "-m", "helpers.forked_servers", "zygote"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")])}
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


def wait_healthy(server: ForkedServer, timeout_s: float = 60.0) -> None:
    def healthy() -> bool:
        if not server.alive():
            raise RuntimeError(f"server on port {server.port} exited:\n{server.log_tail()}")
        return httpx.get(f"{server.url}/health", timeout=2).status_code == 200

    try:
        wait_for(healthy, timeout_s, f"server on port {server.port}", interval_s=0.2)
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}\n{server.log_tail()}") from exc


if __name__ == "__main__" and sys.argv[1:] == ["zygote"]:
    sys.exit(zygote_main())
