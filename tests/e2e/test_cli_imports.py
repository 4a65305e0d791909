"""The CLI imports heavy libraries only where they are used: ``sparrow-server --help`` and the
``schedules`` commands start without torch, transformers, numpy or the HTTP stack, and no command's
``--help`` imports torch or transformers (they took 6.5-8.5 s before any output). Each case runs the
CLI's ``main`` in a fresh interpreter and reads ``sys.modules`` afterwards: an import check, not a
timing."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from helpers.server_util import REPO
from sparrow_server.commands import SUMMARIES

ML = ("torch", "transformers")
HEAVY = ML + ("numpy", "scipy", "fastapi", "starlette", "pydantic", "httpx")
SCHEDULE = "qwen3-1.7b-0.86"
# Runs main(argv) and then prints, as its last line, the exit status and which HEAVY modules are loaded.
RUN_MAIN = """
import json, sys
from sparrow_server.cli import main
try:
    rc = main(sys.argv[2:])
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "loaded": sorted(m for m in json.loads(sys.argv[1]) if m in sys.modules)}))
"""


def run_cli(*argv: str) -> tuple[int, list[str], str]:
    """(exit status, HEAVY modules loaded, output before the last line) of ``sparrow-server ARGV``."""
    proc = subprocess.run([sys.executable, "-c", RUN_MAIN, json.dumps(HEAVY), *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    *out, last = proc.stdout.splitlines()
    result = json.loads(last)
    return result["rc"], result["loaded"], "\n".join(out)


def test_help_lists_every_command_and_imports_nothing_heavy():
    rc, loaded, out = run_cli("--help")
    assert rc == 0 and loaded == []
    assert all(name in out for name in SUMMARIES)


@pytest.mark.parametrize("argv,expected", [
    (("schedules", "list"), SCHEDULE),
    (("schedules", "list", "--json"), f'"name": "{SCHEDULE}"'),
    (("schedules", "show", SCHEDULE), "[38000, inf)"),
    (("schedules", "show", SCHEDULE, "--json"), '"budgets_tokens"'),
])
def test_schedules_commands_import_nothing_heavy(argv, expected):
    rc, loaded, out = run_cli(*argv)
    assert rc == 0 and expected in out
    assert loaded == []


def test_schedules_validate_imports_nothing_heavy(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "mine", "budgets_tokens": [512, 1024]}))
    rc, loaded, out = run_cli("schedules", "validate", str(path))
    assert (rc, loaded) == (0, []) and "ok: mine@1" in out


@pytest.mark.parametrize("command", list(SUMMARIES))
def test_no_command_help_imports_torch_or_transformers(command):
    rc, loaded, out = run_cli(command, "--help")
    assert rc == 0 and f"sparrow-server {command}" in out
    assert not set(loaded) & set(ML), loaded


@pytest.mark.parametrize("package", ["sparrow_server.stats", "sparrow_server.calibrate", "sparrow_server.distill"])
def test_lazy_package_exports_resolve(package):
    """These packages import their public names on first use (so their light modules stay light);
    every name they export still resolves, to the object its defining module holds."""
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(module, "no_such_name")
