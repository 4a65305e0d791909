"""Exact acceptance on kept positions (issue 25) on the GPU: the values the plug-in's scheduler computes
(sparse rows stored at decode, compared in the dense verify prefill) against an independent computation
from SGLang's own full-vocabulary logprobs of the same two passes.

Tiny random Qwen3 (vocab 4,096, ``lm_head_std`` 0.15, ``attn_scale`` 2), served with the ``sparrow``
backend, under CUDA graphs and eagerly. One 1.5K-token prompt under a fixed 64-token budget, sampled at temperature 1 with ``top_logprobs_num`` = the vocabulary (the sparse distribution of
every generated token), kept positions every 4th from offset 1; then the dense verify prefill of prompt +
completion with the same full top logprobs (the dense distribution predicting each completion token).
The independent value is ``Σ min(p_sparse, p_dense)`` in float64 over those full lists; the plug-in's must
match it within ``TOL`` at every kept position, none missing, and an off-by-one comparison must not (the
check has teeth). A second verify request for the same rollout finds its rows freed. The same prompt under
the dense schedule scores 1 at every kept position (the dense step), where the decode's and the verify's full
logprobs differ. Beside each value, the top-20 lower bound of the same two rows, against the same
independent lists. Results go to ``$OUT/exact_acceptance.json``. Breaks ``exact_capture_off_by_one`` and
``exact_dense_step_measured`` (``benchmarks/gpu_host/breaks.py``).
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sparrow_server.sparsity import wire  # noqa: E402
from sparrow_server.sparsity.schedule import Schedule, dense_schedule  # noqa: E402
from sparrow_server.stats import exact_wire  # noqa: E402
from sparrow_server.stats.exact_subsample import KeptPositions  # noqa: E402

pytestmark = pytest.mark.gpu

VOCAB = 4096  # benchmarks/sglang_server.write_tiny_checkpoint
ATTN_SCALE = 2.0
# Why these and not the serving tests' lm_head_std 0.5 under the 512-token preset: at temperature 1 that
# model samples one token over and over (every row nearly one-hot on it), so sparse and dense agree to 0.997
# and so do neighbouring positions: the GPU run of 2026-11-26 matched within TOL but proved nothing (both
# teeth checks below failed). In float32 on CPU, lm_head_std 0.15 samples 30 distinct tokens in 64, the
# 64-token budget gives sum-min down to 0.97 (the preset: 0.999), and neighbouring positions differ by up
# to 0.23 (benchmarks/gpu_host/tiny_model_probe.py exact-teeth).
LM_HEAD_STD = 0.15
SPARSE = Schedule(name="exact-test-fixed-64", budgets_tokens=(64,) * 4)
PROMPT_TOKENS, NEW = 1500, 64
KEPT = KeptPositions(offset=1, stride=4)
TOL = 5e-3  # both sides from the same float32 logits; the stored row is float16 logits - max
COMMON = ["--page-size", "16", "--mem-fraction-static", "0.8", "--max-total-tokens", "32768", "--cuda-graph-max-bs", "8",
          "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--max-running-requests", "8",
          "--attention-backend", "sparrow"]
PORT = 31700 + int(os.environ.get("SPARROW_GPU_PORT_OFFSET", "0"))


def _out(tmp) -> Path:
    return Path(os.environ.get("OUT", tmp))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("exact_acceptance")


@pytest.fixture(scope="module")
def model(tmp):
    import sglang_server as S

    return S.write_tiny_checkpoint(tmp / "tiny-qwen3", seed=0, lm_head_std=LM_HEAD_STD, attn_scale=ATTN_SCALE)


def _post(base: str, payload: dict) -> dict:
    req = urllib.request.Request(base + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def _probs(entries) -> dict[int, float]:
    return {int(e[1]): math.exp(float(e[0])) for e in entries}


def _sigma_min(sparse: dict[int, float], dense: dict[int, float]) -> float:
    return sum(min(p, dense.get(i, 0.0)) for i, p in sparse.items())


def _top(probs: dict[int, float], k: int = exact_wire.BOUND_TOPK) -> dict[int, float]:
    return dict(sorted(probs.items(), key=lambda item: item[1], reverse=True)[:k])


def _topk_bound(sparse: dict[int, float], dense: dict[int, float]) -> float:
    """The top-k lower bound of the two distributions: ids in both top-k lists, min of their probabilities."""
    top_s, top_d = _top(sparse), _top(dense)
    return sum(min(p, top_d[i]) for i, p in top_s.items() if i in top_d)


def _rollout(base: str, rid: str, prompt: list[int], schedule) -> dict:
    """``NEW`` tokens at temperature 1 under ``schedule``, kept positions ``KEPT``, full top logprobs."""
    return _post(base, {"rid": rid, "input_ids": prompt, "return_logprob": True, "top_logprobs_num": VOCAB,
                        "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True,
                                            "sampling_seed": 7, "custom_params": {**wire.encode_schedule(schedule),
                                                                                  **exact_wire.encode_keep(KEPT)}}})


def _verify(base: str, rid: str, prompt: list[int], completion: list[int]) -> dict:
    """The dense verify prefill of prompt + completion for rollout ``rid``, with the full input top logprobs."""
    verify = exact_wire.ExactVerify(rid, len(prompt), len(completion), KEPT)
    return _post(base, {"input_ids": prompt + completion, "return_logprob": True, "top_logprobs_num": VOCAB,
                        "logprob_start_len": len(prompt) - 1,
                        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0,
                                            "custom_params": {**wire.encode_schedule(dense_schedule()),
                                                              **exact_wire.encode_verify(verify)}}})


def _rows(rollout: dict, verify: dict, n: int) -> tuple[list[dict[int, float]], list[dict[int, float]]]:
    """(decode's distribution per generated position, the verify prefill's for the same positions)."""
    return ([_probs(row) for row in rollout["meta_info"]["output_top_logprobs"]],
            [_probs(row) for row in verify["meta_info"]["input_top_logprobs"][-n:]])


def _run(base: str, rid: str) -> dict:
    prompt = [random.Random(25).randrange(10, 4000) for _ in range(PROMPT_TOKENS)]
    sparse = _rollout(base, rid, prompt, SPARSE)
    completion = list(sparse["output_ids"])
    dense = _verify(base, rid, prompt, completion)
    again = _verify(base, rid, prompt, completion)  # the rows were freed by the first: every kept position missing
    sparse_rows, dense_rows = _rows(sparse, dense, len(completion))
    return {"n": len(completion), "payload": dense["meta_info"].get(exact_wire.RESULT_KEY),
            "again": again["meta_info"].get(exact_wire.RESULT_KEY),
            "independent": [_sigma_min(s, d) for s, d in zip(sparse_rows, dense_rows)],
            "independent_bound": [_topk_bound(s, d) for s, d in zip(sparse_rows, dense_rows)],
            "shifted": [_sigma_min(s, d) for s, d in zip(sparse_rows[1:], dense_rows[:-1])],
            "dense_schedule": _run_dense(base, rid + "-dense", prompt)}


def _run_dense(base: str, rid: str, prompt: list[int]) -> dict:
    """The same prompt under the dense schedule (every step attends every page): the plug-in scores its kept
    positions 1 without comparing rows; the full logprobs of decode and verify say what measuring would give."""
    rollout = _rollout(base, rid, prompt, dense_schedule())
    completion = list(rollout["output_ids"])
    verify = _verify(base, rid, prompt, completion)
    decode_rows, verify_rows = _rows(rollout, verify, len(completion))
    return {"n": len(completion), "payload": verify["meta_info"].get(exact_wire.RESULT_KEY),
            "measured": [_sigma_min(s, d) for s, d in zip(decode_rows, verify_rows)],
            "verify_top_mass": [_topk_bound(d, d) for d in verify_rows]}


def _serve(tmp, model, name: str, args: list[str]) -> dict:
    import sglang_server as S

    with S.Server(model, COMMON + args, _out(tmp) / f"server-{name}.log", port=PORT) as srv:
        res = _run(srv.base, f"exact-{name}")
    out = _out(tmp) / "exact_acceptance.json"
    saved = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps(saved | {name: res}))
    return res


@pytest.fixture(scope="module", params=["graph", "eager"])
def result(request, tmp, model):
    return _serve(tmp, model, request.param, [] if request.param == "graph" else ["--disable-cuda-graph"])


def test_exact_values_match_the_full_logprobs_at_every_kept_position(result):
    payload = result["payload"]
    assert isinstance(payload, list) and len(payload) == 1, f"no exact payload in meta_info: {payload!r}"
    got = payload[0]
    kept = KEPT.positions(result["n"]).tolist()
    assert got["positions"] == kept and got["missing"] == []
    want = [result["independent"][g] for g in kept]
    diffs = [abs(a - b) for a, b in zip(got["acceptance"], want)]
    assert max(diffs) < TOL, list(zip(kept, got["acceptance"], want))
    assert min(want) < 0.99  # the sparse rollout really differs from dense somewhere: the check is not vacuous


def test_the_bound_beside_each_value_is_the_top_k_bound_of_the_same_rows(result):
    """The payload's ``bound``: the top-20 lower bound of the stored sparse row and the dense row, what a trainer
    comparing top-20 lists computes; below the value, and far enough from it somewhere that reporting the value
    as its bound would fail."""
    got = result["payload"][0]
    want = [result["independent_bound"][g] for g in got["positions"]]
    assert max(abs(a - b) for a, b in zip(got["bound"], want)) < TOL, list(zip(got["positions"], got["bound"], want))
    assert all(b <= a + TOL for a, b in zip(got["acceptance"], got["bound"]))
    assert max(a - b for a, b in zip(got["acceptance"], got["bound"])) > 10 * TOL


def test_an_off_by_one_comparison_would_fail(result):
    got = result["payload"][0]
    shifted = [result["shifted"][g - 1] for g in got["positions"] if g >= 1]
    values = [a for g, a in zip(got["positions"], got["acceptance"]) if g >= 1]
    assert max(abs(a - b) for a, b in zip(values, shifted)) > 10 * TOL


def test_the_verify_pass_frees_the_rows(result):
    again = result["again"][0]
    assert again["positions"] == [] and again["missing"] == KEPT.positions(result["n"]).tolist()


def test_a_dense_step_scores_one_where_measuring_would_not(result):
    """Under the dense schedule every kept position is the dense step: its value is 1, none missing (break
    ``exact_dense_step_measured`` compares the rows instead). The full logprobs of the decode and the verify
    prefill differ somewhere, so comparing them would not give 1: the check can fail."""
    dense = result["dense_schedule"]
    payload = dense["payload"]
    assert isinstance(payload, list) and len(payload) == 1, f"no exact payload in meta_info: {payload!r}"
    kept = KEPT.positions(dense["n"]).tolist()
    assert payload[0]["positions"] == kept and payload[0]["missing"] == []
    assert payload[0]["acceptance"] == [1.0] * len(kept)
    # the bound of a dense step: both lists are the dense row's, so it is that row's top-20 mass
    assert max(abs(b - dense["verify_top_mass"][g]) for g, b in zip(kept, payload[0]["bound"])) < TOL
    assert min(dense["measured"][g] for g in kept) < 1.0 - 1e-6, "decode and verify agree exactly: the check is vacuous"
