"""End-to-end on the GPU: SGLang 0.5.17 serving a tiny random Qwen3 with the stock FlashInfer backend
and with the ``sparrow`` plug-in backend (CUDA graphs on and off), on outputs that can differ.

The checkpoint has peaked next-token distributions (untied output layer, std 0.5) and attention
that depends on which pages are read (``attn_scale`` 2): greedy outputs vary and a 512-token budget
over 1.5K-token prompts moves the chosen tokens' logprobs (``sglang_server.write_tiny_checkpoint``).
Every comparison is of tokens and logprobs with the tolerance bf16 explains
(``sparrow_server/stats/greedy_agreement.py``), and asserts first that its inputs are informative. Page
selection is checked against the float32 oracle's on the same tokens (eager server with the
selection debug hook, fp32 landmarks). Each server runs once (module fixtures); tokens, logprobs
and the agreement figures go to ``$OUT/serving_tokens.json`` (or the temp dir).
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

from sparrow_server.stats import greedy_agreement as C  # noqa: E402
from helpers import gpu_oracle as O  # noqa: E402

pytestmark = pytest.mark.gpu

SPARSE = "qwen3-1.7b-0.86"   # 512-token budget below 2000 tokens: 1.5K-token prompts decode sparsely
NEW = 48
ATTN_SCALE = 2.0
# A capped KV pool (3 GiB) with a high static fraction: the suite runs this module beside others on one
# card (benchmarks/gpu_host/run_gpu_suite.sh), and SGLang sizes the pool from the memory free at start.
COMMON = ["--page-size", "16", "--mem-fraction-static", "0.8", "--max-total-tokens", "131072", "--cuda-graph-max-bs", "8",
          "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--max-running-requests", "8"]
PORT = 31000 + int(os.environ.get("SPARROW_GPU_PORT_OFFSET", "0"))  # the breaks run two copies at once
SELECTION_ENV = {"SPARROW_DEBUG_SELECTIONS_EVERY": "4"}


def _prompts():
    """Four long prompts of distinct lengths (the selection check keys records by prompt length), one short."""
    rng = random.Random(0)
    long = [[rng.randrange(10, 4000) for _ in range(1500 + 5 * i)] for i in range(4)]
    short = [rng.randrange(10, 4000) for _ in range(300)]
    return long, short


def _out(tmp) -> Path:
    return Path(os.environ.get("OUT", tmp))


def _save(tmp, name, value):
    out = _out(tmp) / "serving_tokens.json"
    saved = json.loads(out.read_text()) if out.exists() else {}
    saved[name] = value
    out.write_text(json.dumps(saved))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("serving")


@pytest.fixture(scope="module")
def model(tmp):
    import sglang_server as S

    return S.write_tiny_checkpoint(tmp / "tiny-qwen3", seed=0, lm_head_std=0.5, attn_scale=ATTN_SCALE)


def _run_server(tmp, model, name, args, queries, env=None) -> dict[str, C.Run]:
    import sglang_server as S

    srv = S.Server(model, COMMON + args, _out(tmp) / f"server-{name}.log", port=PORT,
                   env={"SPARROW_DEFAULT_SCHEDULE": "dense", **(env or {})})
    with srv:
        res = {key: C.run_from_outputs(S.generate(srv.base, ids, NEW, schedule=sched, return_logprob=True,
                                                   top_logprobs_num=2))
               for key, (ids, sched) in queries.items()}
    _save(tmp, name, {k: v.to_json() for k, v in res.items()})
    return res


@pytest.fixture(scope="module")
def stock(tmp, model):
    long, short = _prompts()
    return _run_server(tmp, model, "stock", ["--attention-backend", "flashinfer"], {
        "batch": (long, None), "alone0": ([long[0]], None), "short": ([short], None)})


MIXED = ["dense", SPARSE, "dense", SPARSE]


def _sparrow_queries():
    long, short = _prompts()
    q = {"dense": (long, "dense"), "sparse": (long, SPARSE), "mixed": (long, MIXED),
         "short_sparse": ([short], SPARSE)}
    q.update({f"alone{i}": ([long[i]], MIXED[i]) for i in range(4)})
    return q


@pytest.fixture(scope="module")
def sparrow(tmp, model):
    return _run_server(tmp, model, "sparrow", ["--attention-backend", "sparrow"], _sparrow_queries())


@pytest.fixture(scope="module")
def sparrow_eager(tmp, model):
    return _run_server(tmp, model, "sparrow-nograph", ["--attention-backend", "sparrow", "--disable-cuda-graph"],
                       _sparrow_queries())


@pytest.fixture(scope="module")
def selections(tmp, model):
    """Eager server with the debug hook and fp32 landmarks: the pages each sparse layer's KV heads read."""
    return _selection_run(tmp, model, "float32")


@pytest.fixture(scope="module")
def selections_float8(tmp, model):
    """The same with float8 landmarks (each page and head's scaled by a power of two)."""
    return _selection_run(tmp, model, "float8_e4m3fn")


def _selection_run(tmp, model, landmark_dtype: str):
    from sparrow_server.sglang_plugin.scheduler.selection_debug import load_records

    name = "selections" if landmark_dtype == "float32" else f"selections-{landmark_dtype}"
    folder = tmp / name
    long, _ = _prompts()
    env = {"SPARROW_DEBUG_SELECTIONS": str(folder), "SPARROW_LANDMARK_DTYPE": landmark_dtype, **SELECTION_ENV}
    res = _run_server(tmp, model, f"sparrow-{name}", ["--attention-backend", "sparrow", "--disable-cuda-graph"],
                      {"sparse": (long, SPARSE)}, env=env)
    return res["sparse"], load_records(folder)


@pytest.fixture(scope="module")
def oracle(model):
    return O.load_oracle(model)


def _alone(run: dict[str, C.Run]) -> C.Run:
    parts = [run[f"alone{i}"] for i in range(4)]
    return C.Run([p.tokens[0] for p in parts], [p.logprobs[0] for p in parts],
                 [p.top2_gap[0] for p in parts] if all(p.top2_gap for p in parts) else [])


def test_entry_point_visible():
    assert "sparrow" in [e.name for e in entry_points(group="sglang.srt.plugins")]


def test_outputs_are_informative(stock, sparrow):
    """A degenerate model (one token repeated, sparse == dense) would make every comparison below pass
    for any bug: the outputs vary, and the sparse schedule moves them beyond the tolerance."""
    assert not C.informative_problems(stock["batch"], min_distinct_total=20, min_distinct_per_request=4)
    assert C.agreement_problems(sparrow["dense"], sparrow["sparse"]), "sparse decodes like dense: nothing to test"


def test_stock_is_batch_invariant(stock):
    """Control: the stock backend gives a request the same tokens and logprobs alone and in a batch."""
    C.assert_agree(stock["batch"].select([0]), stock["alone0"], "stock alone vs batch")


def test_dense_schedule_equals_stock(stock, sparrow):
    C.assert_agree(stock["batch"], sparrow["dense"], "sparrow dense vs stock")


def test_dense_schedule_matches_the_float32_oracle(tmp, stock, sparrow, oracle):
    long, _ = _prompts()
    d = O.dense_difference(oracle, long, sparrow["dense"].tokens, sparrow["dense"].logprobs)
    _save(tmp, "dense_vs_oracle", d)
    assert d["median"] <= O.DENSE_MEDIAN_NATS and d["p99"] <= O.DENSE_P99_NATS, d


def test_budget_above_length_equals_dense(stock, sparrow):
    """300 + 48 tokens stay under the 512-token budget: the sparse schedule attends densely."""
    assert not C.informative_problems(stock["short"], min_distinct_total=4, min_distinct_per_request=4)
    C.assert_agree(stock["short"], sparrow["short_sparse"], "short sparse vs stock")


def test_mixed_batch_equals_alone(sparrow):
    C.assert_agree(_alone(sparrow), sparrow["mixed"], "mixed batch vs each request alone")


def test_mixed_batch_equals_uniform_batches(sparrow):
    uniform = C.Run(*[[getattr(sparrow["dense" if s == "dense" else "sparse"], f)[i] for i, s in enumerate(MIXED)]
                      for f in ("tokens", "logprobs", "top2_gap")])
    C.assert_agree(uniform, sparrow["mixed"], "mixed batch vs uniform batches")


@pytest.mark.parametrize("key", ["dense", "sparse", "mixed"])
def test_cuda_graph_on_off_agree(sparrow, sparrow_eager, key):
    C.assert_agree(sparrow_eager[key], sparrow[key], f"{key}: CUDA graph on vs off")


def test_sparse_selections_agree_with_the_oracle(tmp, model, selections):
    """Sink, recent and top-k pages of every sparse layer and KV head, against the float32 reference's
    selection on the same tokens, as well as the reference run in bf16 agrees with it; and the eager
    fp32-landmark server's outputs are informative."""
    _check_selections(tmp, model, selections, "float32", "selections_vs_oracle")


def test_float8_selections_agree_with_the_oracle(tmp, model, selections_float8):
    """The same with float8 landmarks (SPARROW_LANDMARK_DTYPE=float8_e4m3fn): the prefill's and the decode steps'
    landmarks, each with its scale, against the reference storing its landmarks the same way
    (``kernels.reference.store_landmarks``)."""
    _check_selections(tmp, model, selections_float8, "float8_e4m3fn", "float8_selections_vs_oracle")


def _check_selections(tmp, model, selections, landmark_dtype: str, name: str):
    from sparrow_server.sparsity.registry import builtin_schedules

    run, records = selections
    assert not C.informative_problems(run, min_distinct_total=20, min_distinct_per_request=4)
    schedule = {s.name: s for s in builtin_schedules()}[SPARSE]
    long, _ = _prompts()
    check = O.selection_check(model, long, run.tokens, schedule, records, landmark_dtype)
    _save(tmp, name, check)
    assert check["server"]["records"] >= 4 * 4 * 8, check  # 4 requests x 4 sparse layers x 8 KV heads, at least once
    assert not O.selection_problems(check), check
