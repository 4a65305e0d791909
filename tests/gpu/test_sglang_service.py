"""End-to-end on the GPU: ``sparrow-server serve --engine sglang`` (SGLang 0.5.17's HTTP server, the
sparrow backend, the sparrow app mounted) serving a tiny random Qwen3 with peaked next-token
distributions (untied output layer, std 0.5) and attention that depends on the pages read
(``attn_scale`` 2, as ``test_sglang_serving``), LoRA enabled and an admin key. The token-for-token
checks below assert first that their rollouts are informative (varied tokens; the sparse schedule
decodes unlike the dense one), so a model whose outputs ignore the context cannot pass them.

The tests run in file order against one server (the last one changes its weights):
- ``/rollout`` and SGLang's own ``/generate`` give the same greedy tokens; meta reports the
  schedule and the mean KV budget; ``/metrics`` carries sparrow's and SGLang's series;
- adapter hot swap while 8 streaming rollouts run (issue 5): zero failures, each request reports
  the version it started with, the old version unloads only after its last request ends;
- dense verification (issue 4) runs adapter-free: the dense schedule verifies at ~1 without an
  adapter, and far lower for the same request with an adapter (the adapter is in the sparse actor only);
- weight update from disk while rollouts stream (issue 8): bad path / other architecture -> 4xx and
  the old weights keep serving; in-flight requests finish on the old version; the first rollout
  after the update agrees with a fresh server started on the new weights (tokens up to a near-tie,
  logprobs within what bf16 explains: ``sparrow_server/stats/greedy_agreement.py``; exact equality is recorded).
Results go to ``$OUT/service_results.json``.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sparrow_server.stats import greedy_agreement as C  # noqa: E402
from sparrow_server.stats.exact_subsample import DEFAULT_STRIDE  # noqa: E402

pytestmark = pytest.mark.gpu

KEY = "gpu-test-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
SPARSE = "qwen3-1.7b-0.86"  # 512-token budget below 2000 tokens: 1500-token prompts decode sparsely
PORT = 31200 + int(os.environ.get("SPARROW_GPU_PORT_OFFSET", "0"))  # the breaks run copies beside it
ATTN_SCALE = 2.0
MIN_DISTINCT = 4  # distinct tokens a 48-token rollout compared token for token must hold
ARGS = ["--api-key", KEY, "--max-batch-size", "16", "--max-lora-rank", "8", "--enable-lora",
        "--lora-target-modules", "q_proj", "k_proj", "v_proj", "o_proj", "--max-loras-per-batch", "4",
        "--mem-fraction-static", "0.8", "--max-total-tokens", "131072", "--cuda-graph-max-bs", "16", "--cuda-graph-backend-prefill", "disabled",
        "--enable-metrics", "--disable-radix-cache",  # no prefix reuse: no extra FlashInfer JIT builds
        "--verify-fraction", "0"]  # token-for-token comparisons need each request alone: a background
# verification (5 % of /rollout requests by default) batched beside the next request changes its bf16 rounding
# (gpu_call18 call 1: /rollout and /generate parted at token 45 while a verify prefill was running)
# (a capped KV pool: the suite runs this module beside others on one card, see test_sglang_serving)
RESULTS: dict = {}


def _out_dir(tmp) -> Path:
    return Path(os.environ.get("OUT", tmp))


def _record(key, value):
    RESULTS[key] = value


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    import sglang_server as S

    tmp = tmp_path_factory.mktemp("service")
    p = {"tmp": tmp, "a": S.write_tiny_checkpoint(tmp / "weights-a", seed=0, lm_head_std=0.5, attn_scale=ATTN_SCALE),
         "b": S.write_tiny_checkpoint(tmp / "weights-b", seed=1, lm_head_std=0.5, attn_scale=ATTN_SCALE),
         "v1": S.write_lora_adapter(tmp / "adapters" / "distill-v1", tmp / "weights-a", seed=11),
         "v2": S.write_lora_adapter(tmp / "adapters" / "distill-v2", tmp / "weights-a", seed=12)}
    other = json.loads((p["a"] / "config.json").read_text())
    other["num_hidden_layers"] = 4  # another architecture: must be refused
    p["other"] = tmp / "weights-other"
    S.write_config(p["other"], other)
    (p["other"] / "model.safetensors").write_bytes((p["a"] / "model.safetensors").read_bytes())
    yield p
    (_out_dir(tmp) / "service_results.json").write_text(json.dumps(RESULTS, indent=1))


def _server(paths, model, name, port):
    import sglang_server as S

    return S.Server(model, ARGS + ["--state-dir", str(paths["tmp"] / f"state-{name}"),
                                  "--adapter-root", str(paths["tmp"] / "adapters")],
                    _out_dir(paths["tmp"]) / f"server-{name}.log", port=port, sparrow=True)


@pytest.fixture(scope="module")
def server(paths):
    srv = _server(paths, paths["a"], "sparrow-serve", PORT)
    _record("startup_s", srv.start(timeout_s=500))
    yield srv
    srv.stop()


def _prompt(seed, n=1500):
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


def _post(base, path, body, headers=None, timeout=600):
    import httpx

    return httpx.post(base + path, json=body, headers=headers or {}, timeout=timeout)


def _rollout(base, prompt, new=48, schedule=SPARSE, adapter=None, temperature=0.0, **extra):
    body = {"input_ids": prompt, "schedule": schedule, "adapter": adapter,
            "sampling_params": {"max_new_tokens": new, "temperature": temperature, "ignore_eos": True}, **extra}
    r = _post(base, "/rollout", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_rollout_matches_sglang_generate_and_reports_budget(server):
    import sglang_server as S

    prompt = _prompt(1)
    sparse = _rollout(server.base, prompt)
    dense = _rollout(server.base, prompt, schedule="dense")
    via_sglang = S.generate(server.base, [prompt], 48, schedule=SPARSE)[0]["output_ids"]
    assert len(set(sparse["token_ids"])) >= MIN_DISTINCT and len(set(dense["token_ids"])) >= MIN_DISTINCT, (sparse, dense)
    # the budget changes what is decoded: the comparisons below could tell a wrong page from a right one
    assert sparse["token_ids"] != dense["token_ids"] or max(
        abs(a - b) for a, b in zip(sparse["logprobs"], dense["logprobs"])) > 0.5, (sparse, dense)
    assert sparse["token_ids"] == via_sglang
    m_sparse, m_dense = sparse["meta"], dense["meta"]
    assert m_sparse["schedule"] == SPARSE and m_dense["schedule"] == "dense"
    assert 0 < m_sparse["kv_budget_tokens_mean"] <= 512 < len(prompt) < m_dense["kv_budget_tokens_mean"]
    _record("rollout", {"sparse_kv_budget_mean": m_sparse["kv_budget_tokens_mean"],
                        "dense_kv_budget_mean": m_dense["kv_budget_tokens_mean"],
                        "sparse_equals_dense_tokens": sparse["token_ids"] == dense["token_ids"],
                        "weight_version": m_sparse["weight_version"]})


def test_sglang_endpoints_and_merged_metrics(server):
    import httpx

    assert httpx.get(server.base + "/model_info", timeout=30).json()["weight_version"] == "default"  # SGLang's route
    assert httpx.get(server.base + "/server_info", timeout=30).json().get("attention_backend") == "sparrow"
    text = httpx.get(server.base + "/metrics", timeout=30).text
    assert "sparrow_requests_total" in text and "sglang:" in text
    # SGLang's own admin endpoints take the same key (it is SGLang's admin_api_key)
    r = _post(server.base, "/update_weights_from_disk", {"model_path": "/nonexistent"})
    assert r.status_code in (401, 403), r.text


async def _stream(client, base, prompt, adapter, new, events):
    body = {"input_ids": prompt, "schedule": SPARSE, "adapter": adapter, "stream": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True}}
    tokens, meta = [], None
    async with client.stream("POST", base + "/rollout", json=body, headers={"Accept": "application/x-ndjson"}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.strip():
                continue
            event = json.loads(line)
            assert "error" not in event, event
            tokens += event["token_ids"]
            if event.get("done"):
                meta = event["meta"]
    events.append(("end", meta["adapter"], time.monotonic()))
    return tokens, meta


def test_adapter_hot_swap_under_streaming(server, paths):
    import httpx

    base = server.base
    for name in ("distill-v1",):
        r = _post(base, "/adapters", {"name": name, "path": str(paths["v1"])}, AUTH)
        assert r.status_code == 200, r.text
    assert httpx.put(base + "/adapters/aliases/distill-latest", json={"name": "distill-v1"}, headers=AUTH,
                     timeout=60).status_code == 200
    prompt = _prompt(2)
    base_tokens = _rollout(base, prompt, new=64)["token_ids"]
    v1_alone = _rollout(base, prompt, new=64, adapter="distill-v1")
    assert v1_alone["meta"]["adapter"] == "distill-v1" and v1_alone["token_ids"] != base_tokens  # the adapter acts

    async def scenario():
        events = []
        async with httpx.AsyncClient(timeout=600) as client:
            first = [asyncio.create_task(_stream(client, base, prompt, "distill-latest", 400, events)) for _ in range(8)]
            await asyncio.sleep(1.0)  # all 8 admitted on v1
            r = await client.post(base + "/adapters", json={"name": "distill-v2", "path": str(paths["v2"])}, headers=AUTH)
            assert r.status_code == 200, r.text
            r = await client.put(base + "/adapters/aliases/distill-latest", json={"name": "distill-v2"}, headers=AUTH)
            assert r.status_code == 200, r.text
            second = [asyncio.create_task(_stream(client, base, prompt, "distill-latest", 64, events)) for _ in range(4)]
            delete = await client.delete(base + "/adapters/distill-v1", headers=AUTH)
            events.append(("unloaded", "distill-v1", time.monotonic()))
            return await asyncio.gather(*first), await asyncio.gather(*second), delete, events

    first, second, delete, events = asyncio.run(scenario())
    assert delete.status_code == 200, delete.text
    assert all(m["adapter"] == "distill-v1" and len(t) == 400 for t, m in first)
    # Same first token as v1 alone (the prefill ran on v1). Later tokens of a batch of 8 (mixed with v2
    # requests) may drift from a request decoded alone in bf16, so they are recorded, not asserted.
    assert all(t[0] == v1_alone["token_ids"][0] for t, _ in first)
    v2_alone = _rollout(base, prompt, new=64, adapter="distill-v2")["token_ids"]
    agree = {name: [_agreement(t, ref) for t, _ in first]
             for name, ref in (("v1_alone", v1_alone["token_ids"]), ("v2_alone", v2_alone), ("base", base_tokens))}
    assert all(m["adapter"] == "distill-v2" and len(t) == 64 for t, m in second)
    last_v1_end = max(t for kind, a, t in events if kind == "end" and a == "distill-v1")
    unloaded = next(t for kind, _, t in events if kind == "unloaded")
    assert unloaded >= last_v1_end  # DELETE returned (SGLang unloaded) only after the last v1 request ended
    listing = httpx.get(base + "/adapters", timeout=30).json()
    assert [a["name"] for a in listing["adapters"]] == ["distill-v2"] and listing["aliases"] == {"distill-latest": "distill-v2"}
    gone = _post(base, "/rollout", {"input_ids": prompt, "adapter": "distill-v1",
                                    "sampling_params": {"max_new_tokens": 4}})
    assert gone.status_code in (400, 404, 422), gone.text
    _record("hot_swap", {"v1_streams": len(first), "v2_streams": len(second), "failed": 0,
                         "unload_after_last_v1_s": unloaded - last_v1_end,
                         "v1_stream_prefix_agreement_tokens": agree})


def _agreement(a, b) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_dense_verification_ignores_the_adapter(server):
    prompt = _prompt(3, n=600)
    plain = _rollout(server.base, prompt, new=96, schedule="dense", temperature=1.0, verify=True)
    with_adapter = _rollout(server.base, prompt, new=96, schedule="dense", adapter="distill-v2", temperature=1.0,
                            verify=True)
    sparse = _rollout(server.base, _prompt(4), new=96, temperature=1.0, verify=True)
    _record("verification", {"dense_no_adapter": plain["meta"], "dense_with_adapter": with_adapter["meta"],
                             "sparse_no_adapter": sparse["meta"]})
    # on SGLang the verifier measures exact acceptance on the kept positions (issue 25: one generated token per
    # block of DEFAULT_STRIDE, jittered; 96 tokens are 6 whole blocks); the top-k bound is what it reported
    # before, and a server that fell back to it would not say "exact"
    assert plain["meta"]["acceptance_kind"] == "exact" and plain["meta"]["verified_tokens"] == 96 // DEFAULT_STRIDE
    assert plain["meta"]["acceptance_p5"] >= 0.9, plain["meta"]
    # the dense schedule without an adapter attends every page at every step: each kept value is 1 by
    # construction (exact_rows), not the decode and verify kernels' bf16 difference
    assert plain["meta"]["exact_subsample"]["acceptance"] == [1.0] * (96 // DEFAULT_STRIDE), plain["meta"]
    assert with_adapter["meta"]["acceptance_mean"] < plain["meta"]["acceptance_mean"] - 0.1, with_adapter["meta"]


def test_weight_update_while_streaming(server, paths):
    import httpx

    base = server.base
    prompt = _prompt(7)  # 14 distinct greedy tokens in 48 on weights A and on B (float32 on CPU)
    before = _rollout(base, prompt)["token_ids"]
    assert len(set(before)) >= MIN_DISTINCT, before
    for bad in ("/nonexistent/weights", str(paths["other"])):
        r = _post(base, "/update_weights_from_disk", {"model_path": bad}, AUTH)
        assert 400 <= r.status_code < 500 and r.json().get("success") is False, r.text
        assert _rollout(base, prompt)["token_ids"] == before  # still serving the old weights

    async def scenario():
        async with httpx.AsyncClient(timeout=600) as client:
            streams = [asyncio.create_task(_stream(client, base, _prompt(10 + i), None, 300, [])) for i in range(4)]
            await asyncio.sleep(1.0)
            r = await client.post(base + "/update_weights_from_disk", headers=AUTH, json={
                "model_path": str(paths["b"]), "abort_all_requests": False, "weight_version": "step-2"})
            return await asyncio.gather(*streams), r

    streams, update = asyncio.run(scenario())
    assert update.status_code == 200 and update.json()["success"], update.text
    assert all(len(t) == 300 and m["weight_version"] != "step-2" for t, m in streams)
    after = _rollout(base, prompt, top_logprobs=2)
    again = _rollout(base, prompt, top_logprobs=2)  # the updated server against itself: is it deterministic?
    assert after["meta"]["weight_version"] == "step-2" and after["token_ids"] != before
    fresh = _server(paths, paths["b"], "fresh-b", PORT + 1)
    with fresh:
        on_b = _rollout(fresh.base, prompt, top_logprobs=2)
    assert len(set(on_b["token_ids"])) >= MIN_DISTINCT, on_b
    ref, got = C.run_from_rollouts([on_b]), C.run_from_rollouts([after])
    _record("weight_update", {"in_flight_finished_on_old": len(streams), "bad_updates_refused": 2,
                              "tokens_equal_fresh_server": after["token_ids"] == on_b["token_ids"],
                              "repeat_equal": again["token_ids"] == after["token_ids"] and again["logprobs"] == after["logprobs"],
                              "vs_fresh": C.summary(ref, got), "fresh": ref.to_json(), "updated": got.to_json()})
    # The same weights on another server: tokens equal up to a near-tie, logprobs within what bf16
    # explains (a weight or landmark left from weights A moves every position by far more).
    C.assert_agree(ref, got, "updated server vs a fresh server on the new weights")
