"""Per-request dense layers on the GPU: a request whose schedule keeps more layers dense than the
server's default gets them dense in a mixed batch, under CUDA graphs and without, and changes no other
request's outputs.

Tiny random Qwen3 (6 layers, ``attn_scale`` 2: outputs depend on the pages attended), served with the
``sparrow`` backend and the default ``dense`` schedule (layers 0-1 on the stock path, 2-5 sparse).
The case (``tests/helpers/dense_layers_case.py``): four 1.5K-token prompts under the 512-token preset;
in the mixed batch request 1 asks for the preset with layers 2-4 dense as well. A third server, whose
default is that schedule (layers 0-4 on the stock dense path), is the reference for what the request
must get. Every comparison is of greedy tokens and logprobs with the bf16 tolerance
(``sparrow_server/stats/greedy_agreement.py``). Results go to ``$OUT/dense_layers_tokens.json``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from helpers import dense_layers_case as D  # noqa: E402
from sparrow_server.stats import greedy_agreement as C  # noqa: E402

pytestmark = pytest.mark.gpu

ATTN_SCALE = 2.0
COMMON = ["--page-size", "16", "--mem-fraction-static", "0.8", "--max-total-tokens", "65536", "--cuda-graph-max-bs", "8",
          "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--max-running-requests", "8",
          "--attention-backend", "sparrow"]
PORT = 31600 + int(os.environ.get("SPARROW_GPU_PORT_OFFSET", "0"))  # beside the other modules of a suite part
OTHERS = [i for i in range(4) if i != D.ODD_AT]


def _out(tmp) -> Path:
    return Path(os.environ.get("OUT", tmp))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("dense_layers")


@pytest.fixture(scope="module")
def model(tmp):
    import sglang_server as S

    return S.write_tiny_checkpoint(tmp / "tiny-qwen3", seed=0, lm_head_std=0.5, attn_scale=ATTN_SCALE)


def _serve(tmp, model, name, args, default="dense", only=None) -> dict[str, C.Run]:
    import sglang_server as S

    env = {"SPARROW_DEFAULT_SCHEDULE": default, "SPARROW_SCHEDULE_DIR": str(D.write_schedule_dir(tmp / "schedules"))}
    with S.Server(model, COMMON + args, _out(tmp) / f"server-{name}.log", port=PORT, env=env) as srv:
        res = {key: C.run_from_outputs(S.generate(srv.base, ids, D.NEW, schedule=sched, return_logprob=True,
                                                   top_logprobs_num=2))
               for key, (ids, sched) in D.queries().items() if only is None or key in only}
    out = _out(tmp) / "dense_layers_tokens.json"
    saved = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps(saved | {name: {k: v.to_json() for k, v in res.items()}}))
    return res


@pytest.fixture(scope="module")
def graph(tmp, model):
    return _serve(tmp, model, "graph", [])


@pytest.fixture(scope="module")
def eager(tmp, model):
    return _serve(tmp, model, "eager", ["--disable-cuda-graph"])


@pytest.fixture(scope="module")
def reference(tmp, model):
    """The odd schedule as the server's default: layers 0-4 on the stock dense path, layer 5 sparse."""
    return _serve(tmp, model, "reference", [], default=D.ODD, only=("odd_alone", "odd"))


def test_the_odd_schedule_changes_the_requests_outputs(graph):
    """The test could fail: the request's dense layers move its outputs beyond the tolerance, and the
    outputs are informative."""
    assert not C.informative_problems(graph["base"], min_distinct_total=20, min_distinct_per_request=4)
    assert C.agreement_problems(graph["base"].select([D.ODD_AT]), graph["odd_alone"]), \
        "layers 2-4 dense decode like sparse: nothing to test"


def test_dense_by_budget_equals_the_stock_dense_layers(graph, reference):
    """What the request gets on the default server (layers 2-4 dense by budget) is what a server whose
    default keeps them dense (the stock path) gives it."""
    for key in ("odd_alone", "odd"):
        C.assert_agree(reference[key], graph[key], f"{key}: dense by budget vs the stock dense layers")


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_request_gets_its_own_dense_layers_in_a_mixed_batch(graph, eager, mode):
    run = {"graph": graph, "eager": eager}[mode]
    C.assert_agree(run["odd_alone"], run["mixed"].select([D.ODD_AT]), f"{mode}: odd request in the batch vs alone")
    C.assert_agree(run["odd_alone"], run["odd"].select([D.ODD_AT]), f"{mode}: odd request in an all-odd batch")


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_the_other_requests_are_unchanged(graph, eager, mode):
    run = {"graph": graph, "eager": eager}[mode]
    C.assert_agree(run["base"].select(OTHERS), run["mixed"].select(OTHERS), f"{mode}: others with vs without it")


def test_cuda_graph_on_off_agree(graph, eager):
    for key in ("mixed", "odd"):
        C.assert_agree(eager[key], graph[key], f"{key}: CUDA graph on vs off")
