"""benchmarks/sglang_server.py's Server on CPU: a port another process listens on is refused before the server
starts (its /health would answer for this one: call 25's two profiles on one port, one benchmarking the other's
server), and a stopped server's port, its connections in TIME_WAIT, is free again."""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sglang_server as S  # noqa: E402


def test_a_port_in_use_is_refused_at_once(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert S.port_in_use(port)
        srv = S.Server(tmp_path / "model", [], tmp_path / "server.log", port=port)
        t0 = time.time()
        with pytest.raises(RuntimeError, match=f"port {port} is in use"):
            srv.start(timeout_s=30)
        assert time.time() - t0 < 5 and srv.proc is None  # nothing started


def test_a_closed_server_s_port_is_free_again():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server closes first: its side of the connection waits in TIME_WAIT
    client.close()
    listener.close()
    assert not S.port_in_use(port)
    assert S.free_port() > 0
