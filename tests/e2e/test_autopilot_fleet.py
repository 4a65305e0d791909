"""``sparrow-server autopilot --servers A,B``: two reference servers on loopback. The fleet autopilot pools
both servers' verified tokens into one decision and publishes the same new version to both; a server
that missed a version is brought up to it."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from helpers.server_util import REPO, ServerProcess
from helpers.tiny_models import TINY_VOCAB, save_tiny_model
from sparrow_server.autopilot.controller import AutopilotConfig
from sparrow_server.autopilot.fleet import FleetAutopilot

NAME = "fleet-steered"
SCHEDULE = {"budgets_tokens": [64, 64, 64], "bin_tokens": 32, "dense_layers": [0]}
PROMPT = [(i * 11 + 5) % (TINY_VOCAB - 1) for i in range(40)]
NEW_TOKENS = 40  # with the 40-token prompt: bins 1 (32-63) and 2 (64+) get 24 and 16 tokens per rollout


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    model_dir = save_tiny_model(root / "model")
    procs = []
    try:
        for i in range(2):
            (root / f"state{i}").mkdir()
            procs.append(ServerProcess(model_dir, root / f"state{i}", "--verify-fraction", "0", timeout_s=400))
        yield procs
    finally:
        for p in procs:
            p.stop()


def verified_rollouts(url: str, count: int, seed0: int) -> None:
    with httpx.Client(base_url=url, timeout=300) as http:
        for seed in range(seed0, seed0 + count):
            r = http.post("/rollout", json={"input_ids": PROMPT, "schedule": NAME, "verify": True,
                                            "sampling_params": {"max_new_tokens": NEW_TOKENS, "seed": seed,
                                                                "ignore_eos": True}})
            assert r.status_code == 200 and "acceptance_p5" in r.json()["meta"], r.text


def test_fleet_autopilot_pools_both_servers_and_publishes_to_each(servers):
    urls = [s.url for s in servers]
    for url in urls:
        assert httpx.put(f"{url}/schedules/{NAME}", json=SCHEDULE).status_code == 200
    # Bin 2 gets 16 tokens per rollout: 3 rollouts per server = 48 tokens each, a decision needs 80,
    # so neither server's data alone decides bin 2, and the pooled 96 tokens do.
    for i, url in enumerate(urls):
        verified_rollouts(url, 3, 10 * i)
    pilot = FleetAutopilot(urls, NAME, AutopilotConfig(target=0.999, margin=0.0005, min_tokens=80, ceiling_tokens=160))
    try:
        changes = pilot.poll()
    finally:
        pilot.close()
    by_bin = {c.bin_index: c for c in changes}
    assert by_bin[2].reason == "raise" and by_bin[2].evidence.n_tokens == 2 * 3 * 16  # both servers' tokens
    served = [httpx.get(f"{url}/schedules/{NAME}").json() for url in urls]
    assert served[0] == served[1] and served[0]["version"] == 2 and served[0]["budgets_tokens"][2] > 64
    for url in urls:
        last = httpx.get(f"{url}/schedules/{NAME}/history").json()["versions"][-1]
        assert last["source"] == "fleet" and last["version"] == 2
        assert {c["bin_index"] for c in last["changes"]} == set(by_bin)


def test_the_cli_brings_a_server_that_missed_a_version_up_to_date(servers):
    urls = [s.url for s in servers]
    newest = httpx.get(f"{urls[0]}/schedules/{NAME}").json()
    r = httpx.post(f"{urls[0]}/schedules/{NAME}/versions",
                   json={"version": newest["version"] + 1, "budgets_tokens": [64, 64, 160]})
    assert r.status_code == 200
    out = subprocess.run([sys.executable, "-m", "sparrow_server.cli", "autopilot", "--servers", ",".join(urls),
                          "--schedule", NAME, "--target", "0.5", "--min-tokens", "20000", "--iterations", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # bins 0 and 1 are already at their dense-equivalent size, and no bin has enough tokens to decide
    assert out.stdout == ""
    served = [httpx.get(f"{url}/schedules/{NAME}").json() for url in urls]
    assert served[0] == served[1] and served[1]["budgets_tokens"] == [64, 64, 160]
    bad = subprocess.run([sys.executable, "-m", "sparrow_server.cli", "autopilot", "--servers", urls[0],
                          "--schedule", NAME, "--target", "1.5"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--target 1.5" in bad.stderr
