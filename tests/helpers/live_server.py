"""A real uvicorn server for an in-process app, on a loopback port, in a background thread (real
streaming and real disconnects, unlike TestClient; no subprocess start-up cost). It serves on a
socket bound here to port 0: no other process can take the port between choosing and binding it."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Callable, Iterator

from sparrow_server.server.shutdown import make_server


class LiveServer:
    def __init__(self, app, drain_timeout_s: float = 5.0):
        self.app = app
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(app, "127.0.0.1", self.port, "warning", drain_timeout_s)
        self.server.install_signal_handlers = lambda: None  # not the main thread
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def start(self, timeout_s: float = 20.0) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("live server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """What SIGTERM does: ``should_exit``, then the graceful drain."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        self.socket.close()


@contextlib.contextmanager
def live_server(app, drain_timeout_s: float = 5.0) -> Iterator[LiveServer]:
    server = LiveServer(app, drain_timeout_s).start()
    try:
        yield server
    finally:
        server.stop()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
