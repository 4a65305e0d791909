"""``sparrow-server demo``: start a server on the embedded model (a subprocess on a free loopback
port, with a throw-away state directory), register a small sparse schedule, stream one rollout
under it, print it (text, per-token sparse logprobs, summary), stop the server and exit 0."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time

from sparrow_server.commands import SUMMARIES

DEMO_SCHEDULE = {
    "name": "demo-sparse",
    "budgets_tokens": [64],  # 4 pages: sink + 2 recent + 1 chosen by score, once the sequence passes 64 tokens
    "dense_layers": [0, 1],
    "description": "Tiny budget so that a short demo decodes sparsely.",
}
DEMO_PROMPT = "Explain in three sentences why attention over a long context is expensive."
STARTUP_TIMEOUT_S = 300.0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help=SUMMARIES["demo"])
    p.add_argument("--model", default=None, help="model to serve (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--max-new-tokens", type=int, default=80)
    p.add_argument("--prompt", default=DEMO_PROMPT)
    p.set_defaults(func=run)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the server did not become healthy within {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> int:
    from sparrow_server.client import SparrowClient
    from sparrow_server.commands.rollout import stream_and_print

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sparrow-demo-") as state:
        cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference", "--device", "cpu",
               "--port", str(port), "--state-dir", state, "--log-level", "warning"]
        if args.model:
            cmd += ["--model", args.model]
        print(f"starting the server on {url} (the first run converts the embedded model once) ...", flush=True)
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            wait_healthy(url, proc)
            with SparrowClient(url) as client:
                client.put_schedule(DEMO_SCHEDULE["name"], DEMO_SCHEDULE)
                print(f"registered schedule {DEMO_SCHEDULE['name']}: budget {DEMO_SCHEDULE['budgets_tokens'][0]} KV tokens")
                print(f"prompt: {args.prompt}\n")
                kwargs = dict(text=args.prompt, apply_chat_template=True, schedule=DEMO_SCHEDULE["name"],
                              sampling_params={"max_new_tokens": args.max_new_tokens, "temperature": 0.7, "seed": 0})
                return stream_and_print(client, kwargs, logprobs=True)
        except RuntimeError as exc:
            print(f"sparrow-server demo: {exc}", file=sys.stderr)
            return 1
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
