"""benchmarks/gpu_host/cross_engine.py end to end on CPU, the reference engine standing in for SGLang:
rollouts over HTTP (/schedules, /generate with logprobs and top-20, the dense prefill), re-scored by
the teacher-forced forward. In float32 on one engine the logprobs must agree to rounding, the
top-20 lower bound never exceeds the exact acceptance, and selections recorded by the engine agree
with the reference's at every (token, layer, KV head); a wrong schedule must show up."""
from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
import pytest
import torch

from helpers.engine_util import run_requests
from helpers.live_server import live_server
from helpers.server_util import REPO
from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.client import SparrowClient
from sparrow_server.engine.base import GenerationRequest, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.sparsity.schedule import dense_schedule, dump_schedule

sys.path.insert(0, str(REPO / "benchmarks" / "gpu_host"))
import cross_engine as X  # noqa: E402

TOTAL = 200
PROMPTS = [(f"p{i}", [(i * 7 + j * 5 + 1) % (TINY_VOCAB - 1) for j in range(40 + 9 * i)]) for i in range(3)]
SCHEDULES = [X.fixed_schedule(64), X.fixed_schedule(96), dense_schedule()]
TOL = 1e-3  # float32 decode vs float32 teacher-forced forward: rounding only

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def rows(model_dir):
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=8192)
    try:
        with live_server(create_app(engine)) as server, SparrowClient(server.url, timeout=300) as client:
            return X.generate(client, X.assign(PROMPTS, SCHEDULES, 2, distinct_lengths=False), TOTAL)
    finally:
        asyncio.run(engine.shutdown())


def test_rollouts_carry_logprobs_and_a_lower_bound(rows):
    assert [r["schedule"]["name"] for r in rows] == ["xe-fixed-64"] * 2 + ["xe-fixed-96"] * 2 + ["dense"] * 2
    for r in rows:
        n = TOTAL - len(r["prompt_ids"])
        assert len(r["completion_ids"]) == len(r["logprobs"]) == len(r["lower_bound"]) == n
        assert all(0.0 <= a <= 1.0 for a in r["lower_bound"])


def test_reference_rescoring_agrees_and_bounds_hold(rows, model_dir, tmp_path):
    model = load_plain(model_dir, "sdpa")
    result = X.score(model, rows, bin_tokens=64, tokens_out=tmp_path / "tokens.npz")
    with np.load(tmp_path / "tokens.npz") as z:
        assert z["xe-fixed-64/exact"].shape == z["xe-fixed-64/length"].shape == (2 * TOTAL - 40 - 49,)
        np.testing.assert_allclose(z["xe-fixed-64/exact"].mean(), result["xe-fixed-64"]["exact"]["mean"], rtol=1e-5)
    for name, s in result.items():
        assert s["abs_logprob_diff"]["max"] < TOL, (name, s["abs_logprob_diff"])
        for b in s["bins"]:
            assert b["lower_above_exact_share"] == 0.0 and b["mean_gap"] >= -1e-6, (name, b)
    assert result["dense"]["exact"]["min"] > 1 - 1e-4
    assert result["xe-fixed-64"]["exact"]["mean"] < result["xe-fixed-96"]["exact"]["mean"] < 1.0
    sparse_bins = [b for b in result["xe-fixed-64"]["bins"] if b["from"] >= 128]
    assert sparse_bins and all(b["exact_p5"] < 0.999 for b in sparse_bins), "the budget must bite"


def test_a_wrong_schedule_is_caught(rows, model_dir):
    """Negative control: the 64-token rollouts re-scored as if served with 96 tokens depart by far more than TOL."""
    wrong = [dict(r, schedule=json.loads(dump_schedule(X.fixed_schedule(96)))) for r in rows[:2]]
    result = X.score(load_plain(model_dir, "sdpa"), wrong, bin_tokens=64)
    assert result["xe-fixed-96"]["abs_logprob_diff"]["max"] > 50 * TOL


def test_selection_agreement_with_engine_recorded_pages(model_dir):
    """Selections the reference engine recorded while decoding, in the debug hook's record format,
    agree with the teacher-forced reference everywhere; a perturbed record is counted as a disagreement."""
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=8192)
    pairs = X.assign(PROMPTS, SCHEDULES[:2], 1, distinct_lengths=True)
    assert len({len(p[1]) for p in pairs}) == len(pairs) == 2
    try:
        got = run_requests(engine, *[GenerationRequest(rid=f"r{i}", input_ids=tuple(ids), schedule=s,
                                                       sampling=SamplingParams(max_new_tokens=TOTAL - len(ids),
                                                                               temperature=1.0, ignore_eos=True, seed=i),
                                                       return_selected_pages=True)
                                     for i, (_, ids, s) in enumerate(pairs)])
    finally:
        asyncio.run(engine.shutdown())
    rows, records = [], {"layer": [], "prompt_len": [], "length": [], "head": [], "pages": []}
    for (pid, ids, s), c in zip(pairs, got):
        rows.append({"id": pid, "schedule": json.loads(dump_schedule(s)), "prompt_ids": list(ids), "completion_ids": c.tokens})
        for j, per_layer in enumerate(c.selections):
            length = len(ids) + j  # completion token j comes from the step attending len(ids) + j tokens
            if per_layer is None or length % 16:
                continue
            for layer, heads in enumerate(per_layer):
                for head, pages in enumerate(heads or ()):
                    for key, value in (("layer", layer), ("prompt_len", len(ids)), ("length", length), ("head", head)):
                        records[key].append(value)
                    records["pages"].append(np.array(sorted(pages)))
    records = {k: (v if k == "pages" else np.array(v)) for k, v in records.items()}
    assert len(records["pages"]) > 20
    model = load_plain(model_dir, "sdpa")
    agree = X.selection_agreement(model, rows, records, "cpu")
    assert agree["records"] == len(records["pages"]) and agree["agree_share"] == 1.0
    ref = X.reference_records(model, rows, records, "cpu")  # the reference's own pages at the same records
    assert [p.tolist() for p in ref["pages"]] == [p.tolist() for p in records["pages"]]
    assert (ref["layer"] == records["layer"]).all() and (ref["head"] == records["head"]).all()
    f8 = X.reference_records(model, rows, records, "cpu", torch.float8_e4m3fn)  # a float8-landmark server's oracle
    assert X.selection_agreement(model, rows, f8, "cpu", torch.float8_e4m3fn)["agree_share"] == 1.0
    records["pages"][0] = np.array(sorted(set(records["pages"][0].tolist()) ^ {0, 1}))
    assert X.selection_agreement(model, rows, records, "cpu")["agree_share"] < 1.0


def test_the_reference_selection_stores_landmarks_as_the_server_does(model_dir, monkeypatch):
    """``selection_agreement``'s landmark dtype reaches every teacher-forced selection it makes: the recorded
    layer's and those of the forward's own sparse layers, whose outputs feed the later layers."""
    from sparrow_server.sparsity import teacher_forced

    seen, select = [], teacher_forced.causal_page_selection
    dtype_of = lambda a, kw: kw.get("landmark_dtype", a[7] if len(a) > 7 else None)  # noqa: E731
    monkeypatch.setattr(teacher_forced, "causal_page_selection",
                        lambda *a, **kw: seen.append(dtype_of(a, kw)) or select(*a, **kw))
    ids = torch.arange(TOTAL) % (TINY_VOCAB - 1) + 1
    X.tf_selections(load_plain(model_dir, "sdpa"), ids, 20, SCHEDULES[0], {1: [TOTAL - 1]}, torch.float8_e4m3fn)
    assert len(seen) > 1 and set(seen) == {torch.float8_e4m3fn}
