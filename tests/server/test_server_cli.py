"""``serve`` refuses bad arguments before loading anything (exit 2, message naming the value)."""
from __future__ import annotations

import pytest

from sparrow_server.cli import main
from sparrow_server.engine.factory import ENGINE_FACTORIES, EngineOptions, build_engine, default_engine_name


@pytest.mark.parametrize("args,needle", [
    (["--model", "/no/such/model"], "/no/such/model"),
    (["--default-schedule", "no-such-schedule"], "no-such-schedule"),
    (["--adapter", "missing-equals"], "missing-equals"),
    (["--engine", "warp-drive"], "warp-drive"),
    (["--weight-group-timeout-s", "0"], "--weight-group-timeout-s 0.0: must be a positive"),
    (["--weight-group-timeout-s", "nan"], "--weight-group-timeout-s nan"),
])
def test_serve_refuses_bad_arguments(args, needle, tmp_path, capsys):
    assert main(["serve", "--state-dir", str(tmp_path), *args]) == 2
    assert needle in capsys.readouterr().err


def test_engine_factory_names():
    assert {"reference", "sglang"} <= set(ENGINE_FACTORIES)
    assert default_engine_name() in ENGINE_FACTORIES
    with pytest.raises(ValueError, match="unknown engine"):
        build_engine("nope", EngineOptions())
