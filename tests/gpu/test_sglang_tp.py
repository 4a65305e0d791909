"""Tensor parallelism on two GPUs: SGLang 0.5.17 at ``--tp-size 2`` with the stock FlashInfer backend
and with the ``sparrow`` backend, against ``sparrow`` at TP 1 (skipped with fewer than 2 GPUs).

Model: the tiny random Qwen3 of ``test_sglang_serving`` (8 KV heads, G = 2: 4 KV heads per rank),
or, with ``SPARROW_TP_MODEL=qwen3-8b`` (any ``sglang_server.QWEN3_SIZES`` key), that architecture on
dummy weights. NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``). Token lists, the TP 2 vs TP 1
agreement of the sparse schedule and each rank's selection records go to ``$OUT/tp_tokens.json``.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytestmark = pytest.mark.gpu

SPARSE = "qwen3-1.7b-0.86"   # 512-token budget below 2000 tokens: 1500-token prompts decode sparsely
NEW = 48
MODEL = os.environ.get("SPARROW_TP_MODEL", "tiny")
COMMON = ["--page-size", "16", "--mem-fraction-static", "0.5", "--cuda-graph-max-bs", "8",
          "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--max-running-requests", "8"]
ENV = {"SPARROW_DEFAULT_SCHEDULE": "dense", "NCCL_NVLS_ENABLE": "0"}
BACKEND_LINE = re.compile(r"rows = request x (\d+) KV heads \(global \[([\d, ]+)\]\)")


def _need_two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")


def _prompts():
    import random

    rng = random.Random(0)
    long = [[rng.randrange(10, 4000) for _ in range(1500)] for _ in range(4)]
    return long


def _out_dir(tmp) -> Path:
    return Path(os.environ.get("OUT", tmp))


def _save(tmp, name, value):
    out = _out_dir(tmp) / "tp_tokens.json"
    saved = json.loads(out.read_text()) if out.exists() else {}
    saved[name] = value
    out.write_text(json.dumps(saved))


def _model(tmp) -> tuple[Path, list[str]]:
    import sglang_server as S

    if MODEL == "tiny":
        model = tmp / "tiny-qwen3"
        if not (model / "model.safetensors").exists():
            S.write_tiny_checkpoint(model)
        return model, []
    return S.write_config(tmp / MODEL, S.qwen3_config(MODEL)), ["--load-format", "dummy"]


def _run_server(tmp, name, args, queries, env=None):
    """One server: {query: tokens, query_lp: chosen-token logprobs}; the log is ``server-<name>.log``."""
    import sglang_server as S

    _need_two_gpus()
    model, model_args = _model(tmp)
    log = _out_dir(tmp) / f"server-{name}.log"
    srv = S.Server(model, COMMON + model_args + args, log, port=31100, env=dict(ENV, **(env or {})))
    with srv:
        res = {}
        for key, (ids, sched) in queries.items():
            outs = S.generate(srv.base, ids, NEW, schedule=sched, return_logprob=True)
            res[key] = [o["output_ids"] for o in outs]
            res[key + "_lp"] = [[x[0] for x in o["meta_info"]["output_token_logprobs"]] for o in outs]
    res["log"] = str(log)
    _save(tmp, name, {k: v for k, v in res.items() if k != "log"})
    return res


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("tp")


def _sparrow_queries():
    long = _prompts()
    mixed = ["dense", SPARSE, "dense", SPARSE]
    q = {"dense": (long, "dense"), "sparse": (long, SPARSE), "mixed": (long, mixed)}
    q.update({f"alone{i}": ([long[i]], mixed[i]) for i in range(4)})
    return q


@pytest.fixture(scope="module")
def stock_tp2(tmp):
    return _run_server(tmp, "stock-tp2", ["--attention-backend", "flashinfer", "--tp-size", "2"],
                       {"batch": (_prompts(), None)})


@pytest.fixture(scope="module")
def sparrow_tp2(tmp):
    return _run_server(tmp, "sparrow-tp2", ["--attention-backend", "sparrow", "--tp-size", "2"], _sparrow_queries())


@pytest.fixture(scope="module")
def sparrow_tp1(tmp):
    return _run_server(tmp, "sparrow-tp1", ["--attention-backend", "sparrow"],
                       {"dense": (_prompts(), "dense"), "sparse": (_prompts(), SPARSE)})


@pytest.fixture(scope="module")
def sparrow_tp2_eager(tmp):
    """Eager TP 2 with the selection debug hook: each rank records the pages it selects."""
    sel = tmp / "tp2-selections"  # not under $OUT: a device call returns few files; a summary is saved
    res = _run_server(tmp, "sparrow-tp2-nograph", ["--attention-backend", "sparrow", "--tp-size", "2",
                                                   "--disable-cuda-graph"],
                      {"sparse": (_prompts(), SPARSE)}, env={"SPARROW_DEBUG_SELECTIONS": str(sel)})
    res["selections"] = sel
    return res


def test_each_rank_builds_the_backend_over_its_own_kv_heads(sparrow_tp2):
    lines = BACKEND_LINE.findall(Path(sparrow_tp2["log"]).read_text(errors="replace"))
    heads = sorted(tuple(int(h) for h in g.split(",")) for _, g in lines)
    assert heads == [(0, 1, 2, 3), (4, 5, 6, 7)], lines
    assert all(int(n) == 4 for n, _ in lines)


def test_dense_schedule_equals_stock_at_tp2(stock_tp2, sparrow_tp2):
    assert sparrow_tp2["dense"] == stock_tp2["batch"]


def test_mixed_batch_equals_alone_at_tp2(sparrow_tp2):
    assert sparrow_tp2["mixed"] == [sparrow_tp2[f"alone{i}"][0] for i in range(4)]


def test_cuda_graph_on_off_same_sparse_tokens_at_tp2(sparrow_tp2, sparrow_tp2_eager):
    assert sparrow_tp2_eager["sparse"] == sparrow_tp2["sparse"]


def _max_lp_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_sparse_schedule_takes_effect_at_tp2(stock_tp2, sparrow_tp2):
    """The sparse schedule moves logprobs far beyond the dense schedule's difference from stock."""
    noise = _max_lp_diff(sparrow_tp2["dense_lp"], stock_tp2["batch_lp"])
    effect = _max_lp_diff(sparrow_tp2["sparse_lp"], sparrow_tp2["dense_lp"])
    assert effect > max(10 * noise, 1e-3), (effect, noise)


def test_every_rank_selects_sparsely_for_its_heads(tmp, sparrow_tp2_eager):
    """Both ranks' side tables hold the sparse schedule: each rank's records name its own global
    KV heads and attend the budget (32 pages), not every page."""
    from sparrow_server.sglang_plugin.scheduler.selection_debug import load_records

    folder = Path(sparrow_tp2_eager["selections"])
    by_pid = {}
    for path in folder.glob("sel-*.npz"):
        by_pid.setdefault(path.name.split("-")[1], []).append(path)
    assert len(by_pid) == 2, sorted(by_pid)
    heads, summary = [], {}
    for pid, paths in by_pid.items():
        one = folder / f"rank-{pid}"
        one.mkdir()
        for p in paths:
            p.rename(one / p.name)
        rec = load_records(one)
        long = rec["prompt_len"] == 1500
        assert long.any()
        n_pages = -(-rec["length"][long] // 16)
        sizes = np.array([len(p) for p, keep in zip(rec["pages"], long) if keep])
        heads.append(tuple(sorted(set(rec["head"].tolist()))))
        summary[pid] = {"heads": list(heads[-1]), "records": int(long.sum()), "pages": sorted(set(sizes.tolist())),
                        "n_pages": sorted(set(n_pages.tolist()))}
        _save(tmp, "tp2_selections", summary)
        assert (sizes == 32).all() and (n_pages > 32).all(), (pid, summary[pid])
    assert sorted(heads) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_report_sparse_agreement_tp2_vs_tp1(tmp, sparrow_tp1, sparrow_tp2):
    """Reported, not required equal: bf16 all-reduce order differs between TP 1 and TP 2. Each
    request's tokens up to its first divergence, and the share of equal positions, go to the log."""
    report = {}
    for key in ("dense", "sparse"):
        a, b = sparrow_tp1[key], sparrow_tp2[key]
        first = [next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), len(ra)) for ra, rb in zip(a, b)]
        equal = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / sum(len(r) for r in a)
        report[key] = {"first_divergence": first, "equal_share": round(equal, 4),
                       "max_lp_diff": round(_max_lp_diff(sparrow_tp1[key + "_lp"], sparrow_tp2[key + "_lp"]), 5)}
    _save(tmp, "agreement_tp2_vs_tp1", report)
    print("sparse/dense TP 2 vs TP 1:", json.dumps(report))
    assert all(len(r) == NEW for r in sparrow_tp2["sparse"])
    # The first token comes from the (dense) prefill at both TP sizes.
    assert [r[0] for r in sparrow_tp2["sparse"]] == [r[0] for r in sparrow_tp1["sparse"]]
