"""The sparse decode in sub-rows, served (``SPARROW_SUB_ROWS``; issue 24): under CUDA graphs each (request, KV head)
row's selected pages are attended as N rows of their own, unsplit on FlashInfer's tensor cores, and merged by
``kernels.merge``, where the default plan lets FlashInfer's CUDA-core kernel split each row itself.

A tiny random Qwen3 with peaked, varied outputs (the serving tests' model: untied output layer of std 0.5, attention
scale 2) decodes the same prompts on a server with sub-rows off and with 2 and 8 sub-rows (8: rows of fewer pages
than sub-rows leave sub-rows empty at short lengths). Two kernels, so two roundings: as the tensor-core against the
CUDA-core comparison of ``test_grouped_query_heads.py``, every divergence must be at a near-tie and the positions
before it within the tolerance bf16 explains (a wrong page, a sub-row over-read or a wrong merge weight moves them
by ~0.2 nats). A mixed batch of dense and sparse requests must equal the uniform ones, and each server's log must
name its sub-rows, so the comparison is of two plans, not one twice."""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sparrow_server.stats import greedy_agreement as C  # noqa: E402

pytestmark = pytest.mark.gpu

SPARSE = "qwen3-1.7b-0.86"   # 512-token budget below 2000 tokens: 1.5K-token prompts decode sparsely
NEW = 48
ATTN_SCALE = 2.0
COMMON = ["--page-size", "16", "--mem-fraction-static", "0.8", "--max-total-tokens", "131072",
          "--cuda-graph-max-bs", "8", "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled",
          "--max-running-requests", "8", "--attention-backend", "sparrow"]
PORT = 32000 + int(os.environ.get("SPARROW_GPU_PORT_OFFSET", "0"))
QUERIES = {"dense": "dense", "sparse": SPARSE, "mixed": ["dense", SPARSE, SPARSE, "dense"]}


def _prompts():
    rng = random.Random(0)
    return [[rng.randrange(10, 4000) for _ in range(1500 + 5 * i)] for i in range(4)]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("sub_rows")


@pytest.fixture(scope="module")
def model(tmp):
    import sglang_server as S

    return S.write_tiny_checkpoint(tmp / "tiny-qwen3", seed=0, lm_head_std=0.5, attn_scale=ATTN_SCALE)


def _serve(tmp, model, sub_rows: int):
    """({query: Run}, the server log's text) of a server at ``sub_rows``."""
    import sglang_server as S

    log = Path(os.environ.get("OUT", tmp)) / f"server-sub-rows-{sub_rows}.log"
    env = {"SPARROW_DEFAULT_SCHEDULE": "dense", "SPARROW_SUB_ROWS": str(sub_rows)}
    srv = S.Server(model, COMMON, log, port=PORT, env=env)
    with srv:
        runs = {key: C.run_from_outputs(S.generate(srv.base, _prompts(), NEW, schedule=sched, return_logprob=True,
                                                    top_logprobs_num=2))
                for key, sched in QUERIES.items()}
    return runs, log.read_text(errors="replace")


@pytest.fixture(scope="module")
def servers(tmp, model):
    return {n: _serve(tmp, model, n) for n in (1, 2, 8)}


def test_outputs_are_informative(servers):
    runs = servers[1][0]
    assert not C.informative_problems(runs["dense"], min_distinct_total=20, min_distinct_per_request=4)
    assert C.agreement_problems(runs["dense"], runs["sparse"]), "sparse decodes like dense: nothing to test"


def test_each_server_names_its_sub_rows(servers):
    for n, (_, log) in servers.items():
        assert f"graph sub-rows {n}," in log, n


@pytest.mark.parametrize("sub_rows", [2, 8])
def test_sub_rows_decode_as_flashinfer_s_own_split(servers, sub_rows):
    C.assert_agree(servers[1][0]["sparse"], servers[sub_rows][0]["sparse"],
                   f"{sub_rows} sub-rows vs FlashInfer's split, sparse", min_compared=0.0)


@pytest.mark.parametrize("sub_rows", [2, 8])
def test_the_dense_layers_are_untouched(servers, sub_rows):
    C.assert_agree(servers[1][0]["dense"], servers[sub_rows][0]["dense"], f"{sub_rows} sub-rows, dense schedule")


@pytest.mark.parametrize("sub_rows", [2, 8])
def test_mixed_batch_equals_uniform_batches(servers, sub_rows):
    runs = servers[sub_rows][0]
    uniform = C.Run(*[[getattr(runs["dense" if s == "dense" else "sparse"], f)[i]
                       for i, s in enumerate(QUERIES["mixed"])] for f in ("tokens", "logprobs", "top2_gap")])
    C.assert_agree(uniform, runs["mixed"], f"mixed batch vs uniform batches, {sub_rows} sub-rows")
