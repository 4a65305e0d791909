"""Calibration end to end on a tiny model: the CLI calibrates in-process, writes a schedule and a
report consistent with each other, registers the schedule on a running server, which then serves
a rollout with it; calibration also runs against the server (``--server``). Plus input errors."""
from __future__ import annotations

import json
import math

import httpx
import pytest

from helpers.server_util import ServerProcess
from helpers.tiny_models import TINY_VOCAB, save_tiny_model
from sparrow_server.calibrate.pipeline import CalibrationConfig, CalibrationError
from sparrow_server.calibrate.prompts import PromptError, load_prompts
from sparrow_server.cli import main
from sparrow_server.sparsity.schedule import kv_budget_tokens, load_schedule

BUDGETS = (64, 96, 128)
BIN_TOKENS = 40
NEW_TOKENS = 90
THRESHOLD = 0.95


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("calib")
    save_tiny_model(root / "model")
    with open(root / "prompts.jsonl", "w") as f:
        for i in range(3):
            f.write(json.dumps({"input_ids": [(i * 11 + j * 7 + 3) % (TINY_VOCAB - 2) + 1 for j in range(20)]}) + "\n")
    return root


@pytest.fixture(scope="module")
def server(workdir):
    (workdir / "state").mkdir()
    proc = ServerProcess(workdir / "model", workdir / "state", timeout_s=400)
    yield proc
    proc.stop()


def calibrate(workdir, out_name: str, *extra: str) -> int:
    return main(["calibrate", "--model", str(workdir / "model"), "--prompts", str(workdir / "prompts.jsonl"),
                 "--threshold", str(THRESHOLD), "--budgets", ",".join(map(str, BUDGETS)),
                 "--max-new-tokens", str(NEW_TOKENS), "--bin-tokens", str(BIN_TOKENS), "--ignore-eos",
                 "--n-boot", "50", "--no-progress", "--threads", "1", "--out", str(workdir / out_name), *extra])


def cheapest_nondecreasing(report: dict) -> list[int]:
    """The search rule, recomputed from the report's p5 table."""
    table = {b["budget_tokens"]: [x["p5"] for x in b["bins"]] for b in report["budgets"]}
    budgets = sorted(table)
    chosen, running = [], budgets[0]
    for i in range(max(len(v) for v in table.values())):
        ok = [b for b in budgets if b >= running and table[b][i] is not None and table[b][i] >= THRESHOLD]
        running = ok[0] if ok else budgets[-1]
        chosen.append(running)
    return chosen


def test_calibrate_register_and_serve(workdir, server):
    assert calibrate(workdir, "tiny-cal.json", "--register", server.url) == 0
    schedule = load_schedule(workdir / "tiny-cal.json")
    report = json.loads((workdir / "tiny-cal-report" / "report.json").read_text())
    for png in ("p5_vs_length.png", "acceptance_histogram.png", "cost_vs_budget.png"):
        assert (workdir / "tiny-cal-report" / png).stat().st_size > 1000
    assert schedule.name == "tiny-cal" and schedule.threshold == THRESHOLD and schedule.bin_tokens == BIN_TOKENS
    assert list(schedule.budgets_tokens) == cheapest_nondecreasing(report)
    for entry in report["budgets"]:
        assert sum(b["tokens"] for b in entry["bins"]) == 3 * NEW_TOKENS
        for b in entry["bins"]:
            assert b["p5_ci"][0] <= b["p5"] + 1e-9 and b["p5"] <= b["p5_ci"][1] + 1e-9
            assert 0.0 <= b["p5"] <= b["mean"] <= 1.0
    small = report["budgets"][0]["summary"]
    assert math.isclose(small["tokens"], 3 * NEW_TOKENS) and small["p5"] < 1.0  # really sparse
    # Registered: the server knows it and serves with it (per-token budgets follow the schedule).
    with httpx.Client(base_url=server.url, timeout=120) as http:
        assert http.get("/schedules/tiny-cal").json()["budgets_tokens"] == list(schedule.budgets_tokens)
        prompt = list(range(1, 21))
        r = http.post("/rollout", json={"input_ids": prompt, "schedule": "tiny-cal", "verify": True,
                                        "sampling_params": {"max_new_tokens": 80, "seed": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["schedule"] == "tiny-cal" and 0 < body["meta"]["acceptance_p5"] <= 1
    for i, budget in enumerate(body["kv_budget_tokens"][1:], start=1):  # token 0 comes from the prefill
        length = len(prompt) + i
        assert budget == kv_budget_tokens(schedule, length)


def test_calibrate_against_a_running_server(workdir, server):
    assert calibrate(workdir, "tiny-remote.json", "--server", server.url, "--no-plots") == 0
    report = json.loads((workdir / "tiny-remote-report" / "report.json").read_text())
    assert list(load_schedule(workdir / "tiny-remote.json").budgets_tokens) == cheapest_nondecreasing(report)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        names = {s["name"] for s in http.get("/schedules").json()["schedules"]}
    assert {f"tiny-remote-fixed-{b}" for b in BUDGETS} <= names  # the fixed-budget rollouts ran there


def test_config_and_prompt_errors_name_the_field(tmp_path, capsys):
    with pytest.raises(CalibrationError, match="budgets = 40"):
        CalibrationConfig(name="x", budgets=(40,))
    with pytest.raises(CalibrationError, match="threshold"):
        CalibrationConfig(name="x", threshold=1.5)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n{"question": "hi"}\n')
    with pytest.raises(PromptError, match="p.jsonl:2"):
        load_prompts(bad, None)
    assert main(["calibrate", "--prompts", str(bad), "--budgets", "64,x", "--out", str(tmp_path / "s.json")]) == 2
    assert "--budgets" in capsys.readouterr().err
