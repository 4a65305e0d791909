"""End to end: the real server in a subprocess on a free loopback port, serving a tiny random
model (token ids only), driven over HTTP by the trainer client and by raw httpx."""
from __future__ import annotations

import io
import json
import time

import httpx
import pytest
import torch

from helpers.pause_util import continue_generation, pause_in_place
from helpers.server_util import ServerProcess
from helpers.tiny_models import TINY_VOCAB, load_plain, teacher_forced_logprobs
from sparrow_server.client import AsyncSparrowClient, SparrowClient, SparrowError

PROMPT = [(i * 5 + 2) % (TINY_VOCAB - 1) for i in range(90)]
SPARSE = {"budgets_tokens": [64], "dense_layers": [0], "description": "e2e"}
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(model_dir):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_plain(model_dir)
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    proc = ServerProcess(model_dir, tmp_path_factory.mktemp("e2e") / "state")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with SparrowClient(server.url, timeout=60) as c:
        yield c


def test_dense_sse_equals_teacher_forced_hf(client, reference):
    result, = client.stream_result(input_ids=PROMPT, schedule="dense",
                                   sampling_params={"max_new_tokens": 30, "temperature": 1.0, "seed": 11, "ignore_eos": True})
    assert len(result.token_ids) == 30 and result.meta.schedule == "dense"
    expected = teacher_forced_logprobs(reference, PROMPT, result.token_ids, 1.0)
    assert max(abs(a - b) for a, b in zip(result.logprobs, expected)) < TOL


def test_sparse_ndjson_equals_recomputation_under_same_selections(client, reference):
    client.put_schedule("e2e-sparse", SPARSE)
    result, = client.stream_result(input_ids=PROMPT, schedule="e2e-sparse", ndjson=True, return_selected_pages=True,
                                   sampling_params={"max_new_tokens": 40, "temperature": 0.8, "seed": 2, "ignore_eos": True})
    masked = teacher_forced_logprobs(reference, PROMPT, result.token_ids, 0.8, selections=result.selected_pages)
    assert max(abs(a - b) for a, b in zip(result.logprobs, masked)) < TOL
    dense = teacher_forced_logprobs(reference, PROMPT, result.token_ids, 0.8)
    assert max(abs(a - b) for a, b in zip(result.logprobs, dense)) > 1e-3  # sparsity did change the distribution
    # kv_budget_tokens = tokens attended: the 4 selected pages, the current (partial) one by its real tokens
    attended = [(len(sel[1][0]) - 1) * 16 + (len(PROMPT) + i - 1) % 16 + 1
                for i, sel in enumerate(result.selected_pages[1:], start=1)]
    assert result.meta.schedule == "e2e-sparse" and result.kv_budget_tokens[1:] == attended
    assert result.meta.kv_budget_tokens_mean == pytest.approx(sum(attended) / len(attended))
    assert result.meta.kv_budget_tokens_mean < 64  # the old min(budget, length) over-counted partial pages


def test_generate_in_sglang_shape(server, reference):
    body = {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    out = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
    logprobs = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    expected = teacher_forced_logprobs(reference, PROMPT, out["output_ids"], 1.0)
    assert max(abs(a - b) for a, b in zip(logprobs, expected)) < TOL
    with httpx.stream("POST", f"{server.url}/generate", json={**body, "stream": True}, timeout=60) as r:
        lines = [l for l in r.iter_lines() if l]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["output_ids"] == out["output_ids"]


def aborted_rollouts(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "sparrow_requests_total" and s.labels["endpoint"] == "rollout"
               and s.labels["status"] == "aborted")


def test_disconnect_mid_stream_aborts_and_frees_pages(server):
    """The stream is cut while its request is frozen mid-generation (paused in place after its first
    event: no step runs, so it cannot run out its 900 tokens however slow the client is); the abort
    the disconnect makes must land while generation stays paused, and free the request's pages."""
    before = httpx.get(f"{server.url}/health", timeout=30).json()
    aborted_before = aborted_rollouts(server.url)
    body = {"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    try:
        with httpx.stream("POST", f"{server.url}/rollout", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert json.loads(next(l for l in lines if l)[6:])["done"] is False
            assert pause_in_place(server.url)["running_requests"] == 1
            held = httpx.get(f"{server.url}/health", timeout=30).json()  # 503 while paused, same fields
            assert held["live_requests"] == 1 and held["free_pages"] < before["total_pages"]
        # Disconnected. Wait for the engine to forget the request and for its "aborted" count: the engine
        # thread and the event loop that counts it run apart, so either may come first. The deadline only
        # bounds a hang (a loaded 2-core CI box can take seconds); paused, the request cannot end otherwise.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            health = httpx.get(f"{server.url}/health", timeout=30).json()
            if health["live_requests"] == 0 and aborted_rollouts(server.url) > aborted_before:
                break
            time.sleep(0.1)
        assert health["live_requests"] == 0 and health["status"] == "paused", health  # landed while paused
        assert health["free_pages"] == health["total_pages"] == before["total_pages"]
        assert aborted_rollouts(server.url) == aborted_before + 1
    finally:
        continue_generation(server.url)
    after = httpx.get(f"{server.url}/health", timeout=30).json()
    assert after["status"] == "ok" and after["live_requests"] == 0 and after["free_pages"] == before["total_pages"]


def test_batch_helper_and_async_client(server):
    requests = [dict(input_ids=PROMPT[: 20 + i], sampling_params={"max_new_tokens": 4, "temperature": 0}) for i in range(6)]
    with SparrowClient(server.url) as c:
        results = c.rollout_batch(requests, concurrency=3)
    assert [r.meta.prompt_tokens for r in results] == [20 + i for i in range(6)]

    async def main():
        async with AsyncSparrowClient(server.url) as ac:
            batch = await ac.rollout_batch(requests[:3], concurrency=2)
            events = [e async for e in ac.stream(input_ids=PROMPT, sampling_params={"max_new_tokens": 3, "temperature": 0})]
            return batch, events

    import asyncio

    batch, events = asyncio.run(main())
    assert [r.token_ids for r in batch] == [r.token_ids for r in results[:3]]
    assert events[-1].done and events[-1].meta.completion_tokens == 3
    with pytest.raises(SparrowError) as e:
        SparrowClient(server.url).rollout(input_ids=PROMPT, schedule="missing")
    assert e.value.status == 404


def test_rollout_command_prints_tokens_and_summary(server, capsys):
    from sparrow_server.cli import main

    rc = main(["rollout", "--url", server.url, "--input-ids", ",".join(map(str, PROMPT[:30])), "--max-new-tokens", "5",
               "--temperature", "0"])
    out = capsys.readouterr().out
    assert rc == 0 and "--- 5 tokens in" in out and "schedule dense" in out


def test_rollout_printer_shows_each_sparse_logprob(client):
    """What the demo prints (README: the streamed tokens, the sparse logprobs and the summary)."""
    from sparrow_server.commands.rollout import LOGPROBS_HEADING, stream_and_print

    kwargs = dict(input_ids=PROMPT[:30], sampling_params={"max_new_tokens": 5, "temperature": 0})
    out = io.StringIO()
    assert stream_and_print(client, kwargs, out=out, logprobs=True) == 0
    printed = out.getvalue().split(f"\n{LOGPROBS_HEADING}\n")[1].split("\n--- ")[0].split()
    assert [float(v) for v in printed] == pytest.approx(client.rollout(**kwargs).logprobs, abs=0.005 + 1e-6)


def test_schedules_survive_restart(server, model_dir):
    """Runs last: restarts the module's server on the same state directory."""
    assert httpx.put(f"{server.url}/schedules/kept", json=SPARSE).status_code == 200
    server.stop()
    second = ServerProcess(model_dir, server.state_dir, "--default-schedule", "kept")
    try:
        got = httpx.get(f"{second.url}/schedules/kept").json()
        assert got["budgets_tokens"] == [64] and got["description"] == "e2e"
        assert httpx.get(f"{second.url}/schedules/e2e-sparse").status_code == 200  # registered by an earlier test
        out = httpx.post(f"{second.url}/rollout", json={"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}}).json()
        assert out["meta"]["schedule"] == "kept"
    finally:
        second.stop()
