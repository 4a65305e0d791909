"""``serve``'s auth, bind and limit flags (an authenticated server subprocess: ``test_faults_restart.py``)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

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


def test_serve_refuses_remote_bind_without_key_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SPARROW_API_KEY", raising=False)
    args = parse("--host", "0.0.0.0", "--state-dir", str(tmp_path), "--model", str(tmp_path / "no-such-model"))
    assert args.func(args) == 2
    assert "without an API key" in capsys.readouterr().err  # not the missing model: refused before loading
