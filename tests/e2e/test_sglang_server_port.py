"""benchmarks/sglang_server.py's Server on CPU: a port another process listens on is refused before the server
starts (its /health would answer for this one: call 25's two profiles on one port, one benchmarking the other's
server), a server whose port another server answers is stopped at once (both passed that check when started
together), and a stopped server's port, its connections in TIME_WAIT, is free again."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
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


STAND_IN = """import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Answer(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"model_path": sys.argv[2]} if self.path == "/model_info" else {}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


@pytest.mark.parametrize("served", ["own path", "own name", "another path", "another name"])
def test_a_port_answered_by_another_server_is_refused(tmp_path, served):
    """A stand-in server answers /health and /model_info with the model this server was started for (its path, as
    SGLang answers, or its folder's name, as the reference engine does), or with another's (as the first of two
    servers started at once on one port answers the second's clients: same folder name, another path, as two
    benchmarks' temporary checkpoints)."""
    model_dir = tmp_path / "run-a" / "model"
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = S.free_port()
    srv = S.Server(model_dir, [], tmp_path / "server.log", port=port)
    answer = {"own path": str(model_dir), "own name": "model", "another path": str(tmp_path / "run-b" / "model"),
              "another name": "other-model"}[served]
    srv.cmd = [sys.executable, str(script), str(port), answer]
    try:
        if served.startswith("own"):
            assert srv.start(timeout_s=120) < 120 and srv.proc.poll() is None
        else:
            with pytest.raises(RuntimeError, match=f"port {port} is answered by another server"):
                srv.start(timeout_s=120)
            assert srv.proc is None  # this server stopped
    finally:
        srv.stop()


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


def test_sigterm_stops_the_server_before_the_benchmark_exits(tmp_path):
    """``timeout``'s SIGTERM to a benchmark stops the server it started (its own session: without the handler it
    outlives the benchmark and keeps its port). The stand-in server records its pid and sleeps; no /health answers,
    so the benchmark is still waiting in ``start`` when the signal comes."""
    pid_file = tmp_path / "server.pid"
    server = tmp_path / "server.py"
    server.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    bench_script = tmp_path / "bench.py"
    bench_script.write_text(
        f"import sys\nsys.path.insert(0, {str(Path(S.__file__).parent)!r})\nimport sglang_server as S\n"
        f"srv = S.Server({str(tmp_path)!r}, [], {str(tmp_path / 'server.log')!r}, port=S.free_port())\n"
        f"srv.cmd = [sys.executable, {str(server)!r}]\nsrv.start(timeout_s=600)\n")
    bench = subprocess.Popen([sys.executable, str(bench_script)])
    try:
        deadline = time.time() + 120
        while not (pid_file.exists() and pid_file.read_text()) and bench.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
        assert not os.path.exists(f"/proc/{server_pid}")  # stopped and reaped by the benchmark before it exited
    finally:
        bench.kill()
        bench.wait()
        if pid_file.exists() and pid_file.read_text() and os.path.exists(f"/proc/{pid_file.read_text()}"):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # a server the benchmark left behind
