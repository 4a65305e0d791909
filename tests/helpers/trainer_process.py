"""``gloo_trainer.py`` in a subprocess, driven one JSON command at a time (answers read on a thread, so
every wait has a timeout and a stuck trainer fails the test instead of hanging it)."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

SCRIPT = Path(__file__).with_name("gloo_trainer.py")
REPO = Path(__file__).resolve().parents[2]  # the trainer imports the product's client
START_TIMEOUT_S = 180.0  # importing torch on a loaded 2-core box
CALL_TIMEOUT_S = 120.0


class TrainerProcess:
    def __init__(self, log_path: Path):
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            assert self.next(START_TIMEOUT_S) == {"event": "ready"}
        except BaseException:
            self.kill()
            raise

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)  # the process ended

    def send(self, op: str, **fields) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()

    def next(self, timeout_s: float = CALL_TIMEOUT_S) -> dict:
        try:
            answer = self.answers.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"the trainer did not answer within {timeout_s} s; its log: {self.log_tail()}") from None
        assert answer is not None, f"the trainer exited (code {self.proc.poll()}); its log: {self.log_tail()}"
        return answer

    def call(self, op: str, timeout_s: float = CALL_TIMEOUT_S, **fields) -> dict:
        self.send(op, **fields)
        return self.next(timeout_s)

    def log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self) -> "TrainerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
