"""Deterministic inference (``scheduler/determinism.py``): the sparse decode's FlashInfer split follows the
mode, never the batch, and with it a request's rows are planned and chunked the same alone and in any
batch; FlashInfer's own choice (outside the mode, or a plan that ignores it) chunks them by the batch.

Chunks come from ``helpers.flashinfer_split``, a model of FlashInfer 0.6.15's decode planning; the GPU
test (``tests/gpu/test_deterministic.py``) checks the served tokens and logprobs bit for bit.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from helpers.flashinfer_split import row_chunks
from sparrow_server.sglang_plugin.scheduler import determinism as D
from sparrow_server.sglang_plugin.scheduler.planning import REQUEST_FIELDS, plan_step
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

PS, H, CAP = 16, 8, 2560  # page, KV heads (the tiny Qwen3's), top-k cap of a 40960-token server
FIXED = Schedule(name="fixed-256", budgets_tokens=(256,), bin_tokens=10**9)
PRESET = ScheduleRegistry().get("qwen3-1.7b-0.86")
DENSE = dense_schedule()
X = (FIXED, 1548, 1500)  # the request followed: schedule, length, prompt length (the fleet's sparse case)


def test_outside_deterministic_inference_flashinfer_chooses_as_before():
    for graph in (False, True):
        split = D.decode_split(False, graph, 2048, PS)
        assert split == D.FLASHINFER_CHOICE and not split.batch_invariant
        assert split.plan_kwargs() == {"fixed_split_size": None, "disable_split_kv": False}
        # on the kernel SGLang chose for its dense decode (tensor cores from a GQA group of 4): FlashInfer's split
        cores = D.decode_split(False, graph, 2048, PS, tensor_cores=True)
        assert cores == D.DecodeSplit(True, None, False) and not cores.batch_invariant


def test_deterministic_inference_mirrors_sglang_s_flashinfer_policy():
    """No KV split under CUDA graphs; SGLang's decode tile (2048 tokens by default) in pages eagerly;
    tensor-core decode in both (FlashInfer takes a split size there only)."""
    graph = D.decode_split(True, True, 2048, PS)
    assert graph == D.DecodeSplit(use_tensor_cores=True, fixed_split_size=None, disable_split_kv=True)
    assert D.decode_split(True, False, 2048, PS) == D.DecodeSplit(True, 128, False)
    assert D.decode_split(True, False, None, PS) == D.DecodeSplit(True, 2048 // PS, False)
    assert D.decode_split(True, False, 1000, PS).fixed_split_size == 63  # rounded up to pages
    assert D.decode_split(True, False, 2048, 1).fixed_split_size == 2048  # SGLang's own unit: page size 1
    assert all(D.decode_split(True, g, 2048, PS).batch_invariant for g in (False, True))
    with pytest.raises(ValueError):
        D.decode_split(True, False, 0, PS)
    with pytest.raises(ValueError):
        D.decode_split(True, False, 2048, 0)


def test_backend_splits_read_what_sglang_s_flashinfer_backend_set():
    sglang_det = types.SimpleNamespace(enable_deterministic=True, decode_split_tile_size=4096)
    assert D.backend_splits(sglang_det, PS) == (D.DecodeSplit(True, 256, False), D.DecodeSplit(True, None, True))
    plain = types.SimpleNamespace(enable_deterministic=False, decode_split_tile_size=None)
    assert D.backend_splits(plain, PS) == (D.FLASHINFER_CHOICE, D.FLASHINFER_CHOICE)
    grouped = types.SimpleNamespace(enable_deterministic=False, decode_split_tile_size=None,
                                    decode_use_tensor_cores=True)  # SGLang's choice at a GQA group of 4
    assert D.backend_splits(grouped, PS) == (D.DecodeSplit(True, None, False),) * 2
    sglang_det.decode_use_tensor_cores = True  # the mode sets it too; its split stays the mode's
    assert D.backend_splits(sglang_det, PS) == (D.DecodeSplit(True, 256, False), D.DecodeSplit(True, None, True))
    assert D.backend_splits(object(), PS) == (D.FLASHINFER_CHOICE, D.FLASHINFER_CHOICE)  # an SGLang without the mode


def _batches():
    """Batches holding X at different places, with requests of other schedules and lengths (long dense
    rows among them), and CUDA-graph padding lanes (the backend plans them dense at length 1)."""
    pad = (DENSE, 1, 1)
    return {
        "alone": [X],
        "graph bs 2": [X, pad],
        "mixed": [(PRESET, 2100, 2000), X, (DENSE, 3000, 2950), (FIXED, 700, 650)],
        "long dense": [(DENSE, 3000, 2990)] * 3 + [X] + [(PRESET, 1900, 1800)] * 3 + [pad],
        "full": [(DENSE, 3000 + 37 * i, 2900) for i in range(15)] + [X],
    }


def _plan(batch):
    schedules, lengths, prompts = zip(*batch)
    return plan_step(list(schedules), np.asarray(lengths), np.asarray(prompts), H, PS, CAP)


def _x_rows(plan, at: int):
    counts = np.diff(plan.row_indptr.astype(np.int64))
    return counts[at * H:(at + 1) * H].tolist(), plan.last_page_len[at * H:(at + 1) * H].tolist()


def test_a_request_is_planned_the_same_alone_and_in_any_batch():
    """Its per-request fields, its rows' page counts and last-page lengths (what FlashInfer plans it by)."""
    alone = _plan([X])
    assert int(alone.k[0]) > 0 and int(alone.count[0]) == 16  # sparse: 256 tokens of 97 pages
    for name, batch in _batches().items():
        plan, at = _plan(batch), batch.index(X)
        assert [int(getattr(plan, f)[at]) for f in REQUEST_FIELDS] == [int(getattr(alone, f)[0]) for f in
                                                                        REQUEST_FIELDS], name
        assert _x_rows(plan, at) == _x_rows(alone, 0), name


def _x_chunks(split: D.DecodeSplit, graph: bool, batch) -> list:
    plan, at = _plan(batch), batch.index(X)
    rows = np.diff(plan.row_indptr.astype(np.int64)).tolist()
    chunks = row_chunks(rows, use_tensor_cores=split.use_tensor_cores, graph=graph,
                        fixed_split_size=split.fixed_split_size, disable_split_kv=split.disable_split_kv)
    return chunks[at * H:(at + 1) * H]


@pytest.mark.parametrize("graph", [False, True])
def test_deterministic_chunks_of_a_request_do_not_depend_on_its_batch(graph):
    split = D.decode_split(True, graph, 2048, PS)
    alone = _x_chunks(split, graph, [X])
    assert all(_x_chunks(split, graph, batch) == alone for batch in _batches().values())
    long_row = row_chunks([188], use_tensor_cores=True, graph=graph, fixed_split_size=split.fixed_split_size,
                          disable_split_kv=split.disable_split_kv)[0]
    assert long_row == (((0, 188),) if graph else ((0, 128), (128, 188)))  # 3,000 tokens: split eagerly only


@pytest.mark.parametrize("blocks_per_sm", [4, 8, 16])
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("split", [D.FLASHINFER_CHOICE, D.DecodeSplit(True, None, False)],
                         ids=["cuda-core", "tensor-core-flashinfer-split"])
def test_flashinfer_s_own_split_chunks_a_request_by_its_batch(split, graph, blocks_per_sm):
    """What the plan would do without the mode's split (the default, or tensor cores with FlashInfer
    choosing the split: the ``deterministic_split_ignored`` break): some batch chunks X otherwise than
    alone, so the batch changes how its attention is summed."""
    def chunks(batch):
        plan, at = _plan(batch), batch.index(X)
        rows = np.diff(plan.row_indptr.astype(np.int64)).tolist()
        got = row_chunks(rows, use_tensor_cores=split.use_tensor_cores, graph=graph, fixed_split_size=None,
                         disable_split_kv=False, decode_blocks_per_sm=blocks_per_sm)
        return got[at * H:(at + 1) * H]

    alone = chunks([X])
    assert any(chunks(batch) != alone for batch in _batches().values())


def test_truncation_alignment_of_a_deterministic_sparrow_server_is_flashinfer_s():
    assert D.truncation_align_size("sparrow", True, {}) == 4096
    assert D.truncation_align_size("sparrow", True, {D.ENV_PREFILL_SPLIT_TILE: "8192"}) == 8192
    assert D.truncation_align_size("sparrow", True, {D.ENV_PREFILL_SPLIT_TILE: " "}) == 4096
    assert D.truncation_align_size("sparrow", True, {D.ENV_PREFILL_SPLIT_TILE: "x"}) == 4096
    assert D.truncation_align_size("sparrow", False, {}) is None
    assert D.truncation_align_size("flashinfer", True, {}) is None  # SGLang sets it itself


def test_the_scheduler_hook_sets_the_alignment_only_where_sglang_did_not(monkeypatch, caplog):
    monkeypatch.delenv(D.ENV_PREFILL_SPLIT_TILE, raising=False)
    caplog.set_level("INFO", logger=D.__name__)

    def scheduler(backend, deterministic, align=None):
        args = types.SimpleNamespace(attention_backend=backend, enable_deterministic_inference=deterministic)
        return types.SimpleNamespace(server_args=args, truncation_align_size=align)

    s = scheduler("sparrow", True)
    assert D.after_init_deterministic_config(None, s) is None and s.truncation_align_size == 4096
    # the GPU test's evidence that the hook ran in the server (tests/gpu/test_deterministic.py ALIGN_LINE)
    assert caplog.messages == ["sparrow: deterministic inference: chunked prefill aligned to 4096 tokens"]
    for s, want in ((scheduler("sparrow", False), None), (scheduler("flashinfer", True, 4096), 4096),
                    (scheduler("sparrow", True, 1024), 1024)):
        D.after_init_deterministic_config(None, s)
        assert s.truncation_align_size == want
    seen = []
    D.install(types.SimpleNamespace(register=lambda *a: seen.append(a)),
              types.SimpleNamespace(AFTER="after", AROUND="around"))
    assert seen == [(D.CONFIG_TARGET, D.after_init_deterministic_config, "after"),
                    (D.ADD_REQ_TARGET, D.around_add_one_req, "around")]


def test_an_admission_cut_is_rounded_down_to_the_alignment():
    assert D.aligned_cut(8192 - 6320, 2608, 4096) == 0      # the GPU case: 1,872 tokens left, the request waits
    assert D.aligned_cut(5000, 9000, 4096) == 4096
    assert D.aligned_cut(8192, 20000, 4096) == 8192
    assert D.aligned_cut(-16, 100, 4096) == 0
    for unchanged in ((8192, 2608, 4096), (2608, 2608, 4096), (None, 9000, 4096), (5000, 9000, None)):
        assert D.aligned_cut(*unchanged) is None, unchanged


class _Adder:
    """SGLang 0.5.17's ``PrefillAdder`` as far as the hook reads it; ``add_one_req`` cuts an ignore_eos
    request where the chunk budget ends, as ``add_one_req_ignore_eos`` does (``schedule_policy.py:1038``)."""

    def __init__(self, rem_chunk_tokens, queued=0, radix_cache=False):
        self.rem_chunk_tokens = rem_chunk_tokens
        self.can_run_list = [object()] * queued
        self.tree_cache = types.SimpleNamespace(disable=not radix_cache)
        self.cuts = []

    def add_one_req(self, req, has_chunked_req, truncation_align_size):
        n = len(req.full_untruncated_fill_ids)
        cut = min(n, self.rem_chunk_tokens)
        self.cuts.append(cut)
        self.rem_chunk_tokens -= cut
        self.can_run_list.append(req)
        return "CONTINUE" if self.rem_chunk_tokens > 0 else "OTHER"


def _req(n, ignore_eos=True):
    return types.SimpleNamespace(full_untruncated_fill_ids=[0] * n, prefix_indices=[],
                                 sampling_params=types.SimpleNamespace(ignore_eos=ignore_eos))


def _admit(adder, req, align=4096):
    return D.around_add_one_req(_Adder.add_one_req, adder, req, has_chunked_req=False, truncation_align_size=align)


def test_an_ignore_eos_request_is_cut_at_the_alignment_or_waits(monkeypatch, caplog):
    """SGLang's ignore_eos admission cuts where the batch's budget ends; under the hook the cut is a multiple
    of the alignment, what it used comes off the real budget, and a request with less than one tile left
    waits (its prefill then never depends on the batch it came with)."""
    import sys

    other = types.SimpleNamespace(AddReqResult=types.SimpleNamespace(OTHER="OTHER"))
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.schedule_policy", other)
    monkeypatch.setattr(D, "_logged_ignore_eos", False)
    monkeypatch.setattr(D, "_warned_unaligned", False)
    caplog.set_level("INFO", logger=D.__name__)
    adder = _Adder(8192 - 6320, queued=3)  # the GPU case's mixed batch: 1,872 tokens left for a 2,608-token prompt
    assert _admit(adder, _req(2608)) == "OTHER" and adder.cuts == [] and adder.rem_chunk_tokens == 1872
    assert caplog.messages == [D.IGNORE_EOS_LINE % 4096]
    adder = _Adder(5000, queued=1)
    assert _admit(adder, _req(9000)) == "OTHER" and adder.cuts == [4096] and adder.rem_chunk_tokens == 904
    adder = _Adder(8192)
    _admit(adder, _req(2608))
    assert adder.cuts == [2608] and adder.rem_chunk_tokens == 8192 - 2608  # fits whole: untouched
    for adder, req in ((_Adder(1872, queued=3), _req(2608, ignore_eos=False)),  # SGLang's own path aligns it
                       (_Adder(1872, queued=3, radix_cache=True), _req(2608)),
                       (_Adder(1872), _req(2608))):  # an empty batch takes it unaligned rather than stall
        _admit(adder, req)
        assert adder.cuts == [1872], adder.cuts
    adder = _Adder(1872, queued=3)
    _admit(adder, _req(2608), align=None)  # outside deterministic inference: untouched
    assert adder.cuts == [1872]
    info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert info == [D.IGNORE_EOS_LINE % 4096]  # logged once per process
    assert len(warnings) == 1 and "1872 tokens holds less than one 4096-token tile" in warnings[0]  # the empty batch


def test_the_gpu_case_is_planned_as_intended(tmp_path):
    """``tests/gpu/test_deterministic.py``'s case: its fixed schedule loads from the schedule dir the schedulers
    read; the fixed and preset subjects decode sparsely, the dense one attends more than 128 pages (the eager
    split cuts its rows, the graph plan does not), and each subject sits in both batches among other schedules."""
    from helpers import determinism_case as case

    registry = ScheduleRegistry.load(case.write_schedule_dir(tmp_path))
    schedules = {name: registry.get(name) for name in (case.FIXED, case.PRESET, case.DENSE)}
    assert schedules[case.FIXED].budgets_tokens == (256,)
    queries = case.queries()
    for name, i in case.SUBJECTS.items():
        (prompt,), (sched,) = queries[f"alone_{name}"]
        length = len(prompt) + case.NEW
        plan = plan_step([schedules[sched]], np.asarray([length]), np.asarray([len(prompt)]), H, PS, CAP)
        assert (int(plan.k[0]) > 0) == (name != "dense") and (name != "dense" or int(plan.count[0]) > 128), name
        for batch in ("mixed", "other"):
            ids, scheds = queries[batch]
            at = case.in_batch(batch, name)
            assert ids[at] == prompt and scheds[at] == sched and len(set(scheds)) == 3, (name, batch)
    assert len(queries["mixed"][0]) == 8 and len(queries["other"][0]) == 6  # --max-running-requests 8
    for name in ("fixed", "preset"):
        assert queries[f"dense_of_{name}"][0] == queries[f"alone_{name}"][0]
