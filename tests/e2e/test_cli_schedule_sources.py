"""Where ``sparrow-server schedules list|show`` reads registered schedules: ``--state-dir DIR`` (the
flag ``serve`` takes; ``--persist-dir DIR/schedules`` still works, deprecated) or ``--server URL`` (a
running server's ``GET /schedules``). The commands only read: a folder that does not exist is an
error naming it, and is not created."""
from __future__ import annotations

import json

import httpx
import pytest

from helpers.live_server import live_server
from helpers.server_util import refused_url
from helpers.tiny_models import tiny_model
from sparrow_server.cli import main
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.state import StateDir
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule

MINE = Schedule("mine", budgets_tokens=(512, 1024), description="registered by the test")


@pytest.fixture
def state_dir(tmp_path):
    """A server's state dir (what ``serve --state-dir`` creates) holding one registered schedule."""
    state = StateDir(tmp_path / "state").create()
    ScheduleRegistry.load(persist_dir=state.schedules).register(MINE, persist=True)
    return state.root


@pytest.fixture(scope="module")
def server(tmp_path_factory, one_torch_thread):
    registry = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("served-schedules"))
    app = create_app(ReferenceEngine(tiny_model(), None, "tiny", kv_pool_tokens=1024), registry)
    with live_server(app) as live:
        httpx.put(f"{live.url}/schedules/remote-one", json={"budgets_tokens": [256, 512]}, timeout=30).raise_for_status()
        httpx.post(f"{live.url}/default_schedule", json={"name": "remote-one"}, timeout=30).raise_for_status()
        yield live


def rows(capsys, *argv: str) -> dict[str, dict]:
    assert main(["schedules", "list", "--json", *argv]) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)}


def test_state_dir_lists_and_shows_the_registered_schedules(capsys, state_dir):
    listed = rows(capsys, "--state-dir", str(state_dir))
    assert listed["mine"]["builtin"] is False and listed["dense"]["builtin"] is True
    assert main(["schedules", "list", "--state-dir", str(state_dir)]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("mine ")][0].endswith("registered")
    assert main(["schedules", "show", "mine", "--state-dir", str(state_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budgets_tokens"] == [512, 1024]


def test_persist_dir_is_a_deprecated_spelling(capsys, state_dir):
    assert rows(capsys, "--persist-dir", str(state_dir / "schedules")) == rows(capsys, "--state-dir", str(state_dir))
    main(["schedules", "list", "--persist-dir", str(state_dir / "schedules")])
    assert "--persist-dir is deprecated" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["list"], ["show", "mine"]])
@pytest.mark.parametrize("flag", ["--state-dir", "--persist-dir"])
def test_a_missing_folder_is_an_error_naming_it_and_is_not_created(capsys, tmp_path, command, flag):
    missing = tmp_path / "typo" / "state"
    assert main(["schedules", *command, flag, str(missing)]) == 2
    assert f"{flag} {str(missing)!r}: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_a_folder_that_is_not_a_state_dir_is_an_error(capsys, tmp_path):
    assert main(["schedules", "list", "--state-dir", str(tmp_path)]) == 2
    assert "not a server state dir" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_server_lists_what_it_resolves_and_marks_its_default(capsys, server):
    listed = rows(capsys, "--server", server.url)
    assert listed["remote-one"]["budgets_tokens"] == [256, 512] and listed["remote-one"]["builtin"] is False
    assert listed["remote-one"]["default"] is True and listed["dense"]["default"] is False
    assert len(listed) == len(ScheduleRegistry().names()) + 1
    assert main(["schedules", "list", "--server", server.url]) == 0
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("remote-one ")][0]
    assert line.endswith("registered, default")


def test_server_shows_one_schedule_and_names_an_unknown_one(capsys, server):
    assert main(["schedules", "show", "remote-one", "--server", server.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budgets_tokens"] == [256, 512]
    assert main(["schedules", "show", "nope", "--server", server.url]) == 2
    assert "unknown schedule 'nope'" in capsys.readouterr().err


def test_an_unreachable_server_is_an_error_naming_it(capsys):
    with refused_url() as url:
        assert main(["schedules", "list", "--server", url]) == 2
    assert f"--server {url}: cannot reach it" in capsys.readouterr().err


def test_one_source_at_a_time(capsys, state_dir):
    with pytest.raises(SystemExit):
        main(["schedules", "list", "--state-dir", str(state_dir), "--server", "http://127.0.0.1:1"])
    assert "not allowed with argument" in capsys.readouterr().err
