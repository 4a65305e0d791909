"""``serve``'s auth, bind and limit flags, and an authenticated server end to end."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from helpers.server_util import REPO, ServerProcess, free_port
from helpers.tiny_models import save_tiny_model
from sparrow_server.commands.serve import register
from sparrow_server.commands.serve_security import limits_from_args, security_from_args
from sparrow_server.server.limits import Limits

KEY = "test-key-0123456789abcdef"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_no_key_binds_loopback_and_says_so():
    config, line = security_from_args(parse(), environ={})
    assert config.api_key is None and config.open_admin_without_key
    assert "no API key" in line and "loopback" in line


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.com"])
def test_non_loopback_without_key_refused(host):
    with pytest.raises(ValueError, match="without an API key"):
        security_from_args(parse("--host", host), environ={})
    config, line = security_from_args(parse("--host", host, "--insecure-allow-remote"), environ={})
    assert not config.open_admin_without_key and "WARNING" in line  # remote without key: no state changes


def test_key_from_env_or_flag_never_in_the_summary():
    config, line = security_from_args(parse("--host", "0.0.0.0"), environ={"SPARROW_API_KEY": KEY})
    assert config.api_key == KEY and KEY not in line and "require" in line
    config, _ = security_from_args(parse("--api-key", "other-key", "--require-auth-for-rollouts"),
                                   environ={"SPARROW_API_KEY": KEY})
    assert config.api_key == "other-key" and config.require_auth_for_rollouts
    with pytest.raises(ValueError, match="needs an api_key"):
        security_from_args(parse("--require-auth-for-rollouts"), environ={})


def test_roots_and_limit_flags(tmp_path):
    args = parse("--adapter-root", str(tmp_path), "--adapter-root", "rel", "--schedule-root", str(tmp_path),
                 "--max-body-bytes", "1000", "--max-n", "4", "--request-timeout-s", "2.5", "--max-queue", "0")
    config, _ = security_from_args(args, environ={})
    assert config.adapter_roots == (tmp_path.resolve(), Path("rel").resolve())
    assert config.schedule_roots == (tmp_path.resolve(),)
    limits = limits_from_args(args)
    assert (limits.max_body_bytes, limits.max_n, limits.request_timeout_s, limits.max_queue) == (1000, 4, 2.5, 0)
    assert limits.max_concurrent_streams == Limits().max_concurrent_streams
    assert limits_from_args(parse("--request-timeout-s", "0")).request_timeout_s is None
    with pytest.raises(ValueError, match="max_n"):
        limits_from_args(parse("--max-n", "0"))


def test_cli_refuses_remote_bind_without_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SPARROW_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "sparrow_server.cli", "serve", "--host", "0.0.0.0", "--port",
                        str(free_port()), "--state-dir", str(tmp_path)], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "without an API key" in r.stderr


@pytest.mark.slow
def test_authenticated_server_subprocess(tmp_path, monkeypatch):
    """A real server with a key: admin routes need it, rollouts too when asked; the key is never logged."""
    model = save_tiny_model(tmp_path / "model")
    monkeypatch.setenv("SPARROW_API_KEY", KEY)  # the server inherits it
    server = ServerProcess(model, tmp_path / "state", "--require-auth-for-rollouts", "--log-level", "info")
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        schedule = {"budgets_tokens": [64, 128]}
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.get("/health").status_code == 200  # health and reads stay open
            assert c.post("/rollout", json=body).status_code == 401
            assert c.post("/generate", json=body).status_code == 401
            assert c.post("/rollout", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
            assert c.post("/rollout", json=body, headers=auth).status_code == 200
            assert c.put("/schedules/mine", json=schedule).status_code == 401
            assert c.put("/schedules/mine", json=schedule, headers={"Authorization": "Bearer " + KEY[:-1]}).status_code == 401
            assert c.put("/schedules/mine", json=schedule, headers=auth).status_code == 200
            assert c.get("/schedules/mine").status_code == 200
    finally:
        server.stop()
    log = (tmp_path / f"server-{server.port}.log").read_text()
    assert "API key set" in log and KEY not in log
