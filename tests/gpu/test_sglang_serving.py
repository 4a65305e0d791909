"""End-to-end on the GPU: SGLang 0.5.17 serving a tiny random Qwen3 (real weights, std 0.02) with
the stock FlashInfer backend and with the ``sparrow`` plug-in backend (CUDA graphs on and off).

Each server runs once (module fixtures) and answers every query the tests need; the token lists
are also written to ``$OUT/serving_tokens.json`` (or the temp dir) for the log.
"""
from __future__ import annotations

import json
import os
import random
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytestmark = pytest.mark.gpu

SPARSE = "qwen3-1.7b-0.86"   # 512-token budget below 2000 tokens: 1500-token prompts decode sparsely
NEW = 48
COMMON = ["--page-size", "16", "--mem-fraction-static", "0.5", "--cuda-graph-max-bs", "8",
          "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--max-running-requests", "8"]


def _prompts():
    rng = random.Random(0)
    long = [[rng.randrange(10, 4000) for _ in range(1500)] for _ in range(4)]
    short = [rng.randrange(10, 4000) for _ in range(300)]
    return long, short


def _tokens(outs):
    return [o["output_ids"] for o in outs]


def _run_server(tmp, name, args, queries):
    import sglang_server as S

    model = tmp / "tiny-qwen3"
    if not (model / "model.safetensors").exists():
        S.write_tiny_checkpoint(model)
    log_dir = Path(os.environ.get("OUT", tmp))
    srv = S.Server(model, COMMON + args, log_dir / f"server-{name}.log", port=31000,
                   env={"SPARROW_DEFAULT_SCHEDULE": "dense"})
    with srv:
        res = {}
        for key, (ids, sched) in queries.items():
            outs = S.generate(srv.base, ids, NEW, schedule=sched, return_logprob=True)
            res[key] = _tokens(outs)
            res[key + "_lp"] = [[x[0] for x in o["meta_info"]["output_token_logprobs"]] for o in outs]
    out = log_dir / "serving_tokens.json"
    saved = json.loads(out.read_text()) if out.exists() else {}
    saved[name] = res
    out.write_text(json.dumps(saved))
    return res


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="module")
def stock(tmp):
    long, short = _prompts()
    return _run_server(tmp, "stock", ["--attention-backend", "flashinfer"], {
        "batch": (long, None), "alone0": ([long[0]], None), "short": ([short], None)})


def _sparrow_queries():
    long, short = _prompts()
    mixed = ["dense", SPARSE, "dense", SPARSE]
    q = {"dense": (long, "dense"), "sparse": (long, SPARSE), "mixed": (long, mixed),
         "short_sparse": ([short], SPARSE)}
    q.update({f"alone{i}": ([long[i]], mixed[i]) for i in range(4)})
    return q


@pytest.fixture(scope="module")
def sparrow(tmp):
    return _run_server(tmp, "sparrow", ["--attention-backend", "sparrow"], _sparrow_queries())


@pytest.fixture(scope="module")
def sparrow_eager(tmp):
    return _run_server(tmp, "sparrow-nograph", ["--attention-backend", "sparrow", "--disable-cuda-graph"],
                       _sparrow_queries())


def test_entry_point_visible():
    assert "sparrow" in [e.name for e in entry_points(group="sglang.srt.plugins")]


def test_stock_is_batch_invariant(stock):
    """Control: the stock backend gives a request the same tokens alone and in a batch."""
    assert stock["alone0"][0] == stock["batch"][0]


def test_dense_schedule_equals_stock(stock, sparrow):
    assert sparrow["dense"] == stock["batch"]


def test_sparse_schedule_decodes(stock, sparrow):
    for got, dense in zip(sparrow["sparse"], stock["batch"]):
        assert len(got) == NEW
        assert got[0] == dense[0]  # the first token comes from the (dense) prefill


def test_budget_above_length_equals_dense(stock, sparrow):
    """300 + 48 tokens stay under the 512-token budget: the sparse schedule attends densely."""
    assert sparrow["short_sparse"] == stock["short"]


def test_mixed_batch_equals_alone(sparrow):
    assert sparrow["mixed"] == [sparrow[f"alone{i}"][0] for i in range(4)]


def test_mixed_batch_equals_uniform_batches(sparrow):
    assert sparrow["mixed"][0] == sparrow["dense"][0] and sparrow["mixed"][1] == sparrow["sparse"][1]


def test_cuda_graph_on_off_same_tokens(sparrow, sparrow_eager):
    for key in ("dense", "sparse", "mixed"):
        assert sparrow_eager[key] == sparrow[key], key


def _max_lp_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_sparse_schedule_changes_logprobs_beyond_noise(stock, sparrow):
    """Evidence that sparse layers attend fewer pages: the sparse schedule moves the chosen tokens'
    logprobs far more than the dense schedule differs from stock (kernel rounding)."""
    noise = _max_lp_diff(sparrow["dense_lp"], stock["batch_lp"])
    effect = _max_lp_diff(sparrow["sparse_lp"], sparrow["dense_lp"])
    assert effect > max(10 * noise, 1e-3), (effect, noise)
