"""In-process apps (FastAPI TestClient) and subprocess servers for the service tests."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from sparrow_server.commands.demo import wait_healthy

REPO = Path(__file__).resolve().parents[2]


class CharTokenizer:
    """A toy tokenizer (one token per byte + 1; 0 is BOS) so text requests work on tiny models."""

    def __call__(self, text: str):
        return {"input_ids": [0] + [b % 120 + 1 for b in text.encode()]}

    def decode(self, ids, skip_special_tokens=True) -> str:
        """Token 0 (BOS) is special: ``<s>`` unless skipped."""
        return "".join(chr(96 + (i % 26)) if i else ("" if skip_special_tokens else "<s>") for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        return self("<user>" + messages[-1]["content"] + "<assistant>")["input_ids"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """A loopback URL whose connections are refused while the block runs: its port is bound here and
    never listened on (a port merely free when looked at could be taken by another process)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


class ServerProcess:
    """``sparrow-server serve`` in a subprocess on a free loopback port.

    The port is free when ``free_port`` looks, but the server binds it only after its imports (seconds
    on a loaded box), and another process may take it meanwhile: a server that exits because its port
    is in use is started again on another one."""

    PORT_TRIES = 3

    def __init__(self, model_dir: Path, state_dir: Path, *extra: str, timeout_s: float = 120.0):
        self.state_dir = state_dir
        for attempt in range(1, self.PORT_TRIES + 1):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference", "--model", str(model_dir),
                   "--port", str(self.port), "--state-dir", str(state_dir), "--device", "cpu", "--threads", "1",
                   "--kv-pool-tokens", "8192", "--log-level", "warning", *extra]
            self.log = open(state_dir.parent / f"server-{self.port}.log", "w")
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(REPO)})
            if self._wait(timeout_s, last_try=attempt == self.PORT_TRIES):
                return

    def _wait(self, timeout_s: float, last_try: bool) -> bool:
        """True once healthy; False if the port was taken (and not ``last_try``); raises otherwise."""
        try:
            wait_healthy(self.url, self.proc, timeout_s)
            return True
        except RuntimeError as exc:
            self.stop()
            log = Path(self.log.name).read_text()
            if self.proc.returncode not in (None, 0) and "address already in use" in log.lower() and not last_try:
                return False
            raise RuntimeError(f"{exc}: {log[-3000:]}") from None

    def stop(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
