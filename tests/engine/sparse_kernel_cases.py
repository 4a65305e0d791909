"""The sparse decode backend's Triton kernels on CPU, under the Triton interpreter, against the
pure references: exact scores on each row's candidate range, exact selection (``select_pages``:
sink, top-k ascending with ties to the earlier page, recent) in every tier of ``select_and_write``,
and the landmark updates. Speed is the GPU tier's (tests/gpu/test_sparse_kernels.py mirrors these).

Not collected by the suite: ``test_sparse_kernels_interpreted.py`` runs this file in a child pytest
with ``TRITON_INTERPRET=1``, which must be set before triton is first imported. By hand:
``TRITON_INTERPRET=1 python3 -m pytest tests/engine/sparse_kernel_cases.py``.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest
import torch

from sparrow_server.kernels import DEFAULT_SELECT_VARIANT
from sparrow_server.kernels import reference as R
from sparrow_server.sglang_plugin.scheduler.standalone_layer import (SparseSelection, fixed_budget_schedule, make_case,
                                                                     plan_for)
from sparrow_server.sparsity.schedule import dense_schedule

PS = 16
SINK, RECENT = 1, 2  # fixed_budget_schedule's reserved pages
OUTSIDE = -123.25    # score-buffer fill that no kernel write can produce: untouched entries keep it
# sparse_decode.SELECT_VARIANTS (a test below checks the two agree)
VARIANTS = ("v1", "split", "even", "hist", "fine", "fine_hist", "fine_hist64", "fine_hist40", "short8_hist40",
            "short8_hist40_wide", "fused_hist64", "fused_hist64_narrow", "fused_exit_narrow",
            "fused_packed_narrow", "fused_rolled_narrow", "fused_atomic_narrow",
            "fused_topdigits_narrow", "fused_joint_narrow", "fused_hoisted_narrow", "fused_qcopy_narrow",
            "fused_kvstore_narrow", "fused_pages_narrow")


if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("runs only under TRITON_INTERPRET=1 (test_sparse_kernels_interpreted.py sets it)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def K():
    """``sparse_decode``, its kernels interpreted (they run on CPU tensors)."""
    import triton

    from sparrow_server.kernels import sparse_decode

    assert triton.knobs.runtime.interpret  # read by @triton.jit: the kernels are Python on CPU tensors
    return sparse_decode


def _case(lengths, seed, **kw):
    return make_case(lengths, seed=seed, device="cpu", **kw)


def _landmarks(case, dtype):
    """Every full page's landmark, by the reference (the kernel is checked on a small pool below)."""
    lm = torch.zeros(case.k_buf.shape[0] // PS, *case.k_buf.shape[1:], dtype=dtype)
    R.update_landmarks(case.k_buf, torch.arange(case.k_buf.shape[0]), lm, PS, only_full=True)
    return lm


def _scaled_landmarks(case, dtype):
    """``_landmarks``, and their scales where ``dtype`` is stored scaled (float8), else None."""
    lm, scales = R.zero_landmarks(case.k_buf.shape[0] // PS, *case.k_buf.shape[1:], dtype)
    R.update_landmarks(case.k_buf, torch.arange(case.k_buf.shape[0]), lm, PS, only_full=True, landmark_scales=scales)
    return lm, scales


def _selection(K, case, schedules, lm_dtype=torch.bfloat16, pcap=None, variant=None):
    budgets = [int(s.budgets_tokens[0]) // PS for s in schedules if s.budgets_tokens]
    plan = plan_for(case, schedules, topk_cap_pages=max(budgets, default=1))
    lm, scales = _scaled_landmarks(case, lm_dtype)
    return SparseSelection(K, case, plan, lm, pcap or int(plan.n_pages.max()), variant, landmark_scales=scales)


def _filled_landmarks(case, dtype):
    """Landmarks (and float8's scales) of every page set to 7 (scale 7: no scale the kernels write)."""
    lm = torch.full((case.k_buf.shape[0] // PS, *case.k_buf.shape[1:]), 7.0).to(dtype)
    return lm, (torch.full(lm.shape[:2], 7.0) if dtype in R.SCALED_LANDMARK_DTYPES else None)


def _assert_same_landmarks(got, want):
    """Landmarks (values, scales or None) equal: float32's within fp32 sums' order; float8's scales exactly and their
    values within one float8 step (the interpreter's float8 cast drops a rounded-up mantissa's carry; the GPU test
    holds them to torch's cast)."""
    (lm, scales), (want_lm, want_scales) = got, want
    if scales is None:
        torch.testing.assert_close(lm, want_lm, rtol=1e-5, atol=1e-5)
        return
    assert torch.equal(scales, want_scales)
    g, w = lm.float(), want_lm.float()
    carry_dropped = (torch.frexp(w)[0].abs() == 0.5) & (g == w / 2)  # rounded up to 2^k, stored as 2^(k-1)
    step = (g - w).abs() <= torch.maximum(w.abs() / 8, torch.full_like(w, 2.0**-9))  # sums in another order
    assert (carry_dropped | step).all()
    assert (g == w).float().mean() > 0.95


@pytest.mark.parametrize("lm_dtype", [torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("only_full", [True, False])
def test_landmark_kernel_matches_reference(K, only_full, lm_dtype):
    """The prefill's landmarks; float8 ones with their scales (keys of 1e-3, as a dummy-weight model's)."""
    case = _case([300, 77], seed=1)
    if lm_dtype == torch.float8_e4m3fn:
        case.k_buf.mul_(1e-3)
    locs = torch.randint(0, case.k_buf.shape[0], (120,), generator=torch.Generator().manual_seed(1))
    got, want = _filled_landmarks(case, lm_dtype), _filled_landmarks(case, lm_dtype)
    K.update_landmarks(case.k_buf, locs, got[0], PS, only_full, landmark_scales=got[1])
    R.update_landmarks(case.k_buf, locs, want[0], PS, only_full, landmark_scales=want[1])
    _assert_same_landmarks(got, want)
    assert (got[0].float() != 7.0).any(dim=(1, 2)).sum() == (want[0].float() != 7.0).any(dim=(1, 2)).sum() > 0
    if lm_dtype == torch.float8_e4m3fn:  # each written landmark's largest element in [2^7, 2^8] (rounded), under 448
        written = want[1] != 7.0
        top = got[0].float().abs().amax(dim=-1)[written]
        assert written.any() and (top >= 128).all() and (top <= 256).all()


# float8: the split grid's landmark program (v1) and the fused rows' (the default)
@pytest.mark.parametrize("variant,lm_dtype", [(v, torch.float32) for v in VARIANTS]
                         + [(v, torch.float8_e4m3fn) for v in ("v1", DEFAULT_SELECT_VARIANT)])
def test_decode_scoring_updates_the_completed_page_landmark(K, variant, lm_dtype):
    """The decode path's score launch first writes the landmark of the page this step's slot
    completes (one program of several does it; float8: with its scale); a slot inside a page leaves its landmark
    alone."""
    case = _case([40, 70], seed=9)
    lm, scales = _filled_landmarks(case, lm_dtype)
    want = _filled_landmarks(case, lm_dtype)
    locs = torch.stack([case.req_to_token[1, 31], case.req_to_token[2, 69]]).long()
    R.update_landmarks(case.k_buf, locs, want[0], PS, only_full=True, landmark_scales=want[1])
    zero = torch.zeros(2, dtype=torch.int32)
    assert K.score_programs(100, variant) > 1
    K.page_scores(case.q, lm, case.req_to_token, case.rpi, zero, zero, PS, torch.zeros(16, 100),
                  k_buf=case.k_buf, cache_loc=locs, variant=variant, landmark_scales=scales)
    _assert_same_landmarks((lm, scales), want)
    assert int((lm.float() != 7).any(dim=(1, 2)).sum()) == 1


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lm_dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_scores_on_the_candidate_range_only(K, lm_dtype, variant):
    """Scores equal ``reference.page_scores`` on ``[cand_lo, cand_hi)`` of each row (float8: each page's landmark
    times its scale, keys of the magnitude of a dummy-weight model's, 1e-3, whose landmarks unscaled round to zero);
    every other entry of the buffer (dense rows' included) is left as it was."""
    case = _case([5000, 1200, 40, 3000], seed=2)
    key_scale = 1e-3 if lm_dtype == torch.float8_e4m3fn else 1.0
    case.k_buf.mul_(key_scale)
    s = fixed_budget_schedule(32)
    sel = _selection(K, case, [s, s, s, dense_schedule()], lm_dtype, pcap=400, variant=variant)
    sel.scores.fill_(OUTSIDE)
    got = sel.score().clone()
    f = sel.fields
    want = R.page_scores(case.q, sel.lm, case.req_to_token, case.rpi, f["cand_lo"], f["cand_hi"], PS, 400,
                         landmark_scales=sel.lm_scales)
    inside = torch.isfinite(want)
    assert int(inside.sum()) == sum(int(hi - lo) * 8 for lo, hi in zip(sel.plan.cand_lo, sel.plan.cand_hi)) > 0
    torch.testing.assert_close(got[inside], want[inside], rtol=1e-4, atol=1e-3 * key_scale)  # scores scale with keys
    assert want[inside].unique().numel() > 0.9 * int(inside.sum())  # scores that tell the pages apart
    assert (got[~inside] == OUTSIDE).all()


@pytest.mark.parametrize("lengths,budget", [([600, 40, 300, 17, 32768, 1000], 64), ([2048, 4100, 17, 16], 8)])
def test_selection_is_select_pages_at_40k_context(K, lengths, budget):
    """A server at --context-length 40960 (Pcap 2560) with short sequences: the selected pages, in
    index order, are exactly ``select_pages``' (sink, top-k ascending, recent), whatever Pcap."""
    case = _case(lengths, seed=7, max_ctx=40960, num_kv_heads=4, head_dim=32)
    sel = _selection(K, case, [fixed_budget_schedule(budget)] * len(lengths), pcap=40960 // PS)
    sel.score()
    sel.select_write()
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


# Candidates per row = pages - 3 (1 sink, 2 recent): 512 | 513, 2048 | 2049, 4096 | 4097 at each
# boundary of SELECT_ROWS (8240 tokens = 515 pages), top-k from 1 to most of the row.
TIER_LENGTHS = [8240, 8256, 32816, 32832, 65584, 65600, 3000, 70000]
TIER_BUDGETS = [4, 500, 40, 2040, 2049, 300, 200, 4000]


@pytest.mark.parametrize("scores", ["landmarks", "ties"])
def test_selection_in_every_tier(K, scores):
    """Each row size of ``select_and_write`` (in registers at each of SELECT_ROWS, streamed past
    them) selects exactly ``select_pages``' pages: on landmark scores, and on three distinct values
    with -0.0 next to +0.0 (ties to the earlier page; -0.0 ties with +0.0)."""
    case = _case(TIER_LENGTHS, seed=11, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32)
    sel = _selection(K, case, [fixed_budget_schedule(b) for b in TIER_BUDGETS])
    cands = {int(c) for c in (sel.plan.cand_hi - sel.plan.cand_lo)[sel.plan.k > 0]}
    assert {t + d for t in K.SELECT_ROWS for d in (0, 1)} <= cands  # each side of each tier's bound
    if scores == "landmarks":
        sel.score()
    else:
        ties = torch.randint(0, 3, sel.scores.shape, generator=torch.Generator().manual_seed(11)).float() - 1.0
        ties[:, ::7] = -0.0
        sel.scores.copy_(ties)
    sel.select_write()
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


# Issue 24: rows on each side of 2048 (where ``v1`` steps to its 4096 tier and to a second score
# tile), of ``even``'s tail tiers (2048 + 256 / 512 / 1024), of ``fine``'s (1024, 1024 + 512), of 4096
# (streamed past it), a short row and a dense row, in one batch. Candidates = pages - 3; each length
# ends inside its last page.
SPLIT_CANDIDATES = [2047, 2048, 2049, 2304, 2305, 2560, 2561, 3071, 3072, 3073, 4096, 4097, 300,
                    1024, 1025, 1536, 1537]
SPLIT_BUDGETS = [256, 256, 256, 2300, 40, 256, 2561, 256, 3000, 1500, 256, 4000, 30, 1023, 224, 1500, 256]
# Scoring (slow interpreted): one tile per span at the server's Pcap (first batch); several at a
# Pcap whose grid is capped at SCORE_PROGRAMS_MAX (second).
SCORE_BATCHES = [([2047, 2049, 2305, 300], None), ([4097, 33], 6000)]


def _split_case(candidates, budgets):
    """Rows of ``candidates`` (sparse, ``budgets`` pages) plus a dense row, 2 KV heads, on dyadic
    queries (landmarks: ``_dyadic``): every score is exact in fp32 whatever the summation order,
    so kernel and reference scores are equal and the selections must be too (ties included)."""
    lengths = [(c + SINK + RECENT) * PS - 5 for c in candidates] + [700]
    case = _case(lengths, seed=24, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32)
    case.q.copy_(torch.round(case.q * 8) / 8)
    return case, [fixed_budget_schedule(b) for b in budgets] + [dense_schedule()]


def _dyadic(sel):
    sel.lm.copy_(torch.round(sel.lm * 8) / 8)
    return sel


@pytest.mark.parametrize("variant", ["v1", "even"])  # "split" and "hist" score as "even" does
@pytest.mark.parametrize("candidates,pcap", SCORE_BATCHES)
def test_split_rows_scored_once_and_selected(K, variant, candidates, pcap):
    """Every candidate of every row scored (= ``reference.page_scores``), nothing else written, and
    the selection on those scores is ``select_pages``' on the reference scores."""
    case, schedules = _split_case(candidates, [min(256, c // 2) for c in candidates])
    sel = _dyadic(_selection(K, case, schedules, torch.float32, pcap=pcap, variant=variant))
    sel.scores.fill_(OUTSIDE)
    got = sel.score().clone()
    f = sel.fields
    want = R.page_scores(case.q, sel.lm, case.req_to_token, case.rpi, f["cand_lo"], f["cand_hi"], PS,
                         sel.scores.shape[1])
    inside = torch.isfinite(want)
    assert int(inside.sum()) == 2 * sum(candidates)
    assert torch.equal(got[inside], want[inside])
    assert (got[~inside] == OUTSIDE).all()
    sel.scores.copy_(want)
    sel.select_write()
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


@pytest.mark.parametrize("scores", ["landmarks", "edges", "scales"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_split_rows_select_select_pages(K, variant, scores):
    """Each SPLIT_CANDIDATES row (every top-k tier of both variants, either side of its bound)
    selects exactly ``select_pages``' pages: on reference landmark scores, on few distinct values
    where each row's first and last candidates are the best (``edges``: a tier that drops a lane
    at either end loses a page), or on values of every magnitude, the clamp's bounds and subnormals among them
    (``scales``: keys over their whole 32-bit range; it caught a search on the keys' own range whose bucket edge
    was one short)."""
    case, schedules = _split_case(SPLIT_CANDIDATES, SPLIT_BUDGETS)
    sel = _dyadic(_selection(K, case, schedules, torch.float32, variant=variant))
    cands = (sel.plan.cand_hi - sel.plan.cand_lo)[sel.plan.k > 0]
    assert sorted(int(c) for c in cands) == sorted(SPLIT_CANDIDATES)
    f = sel.fields
    if scores == "landmarks":
        want = R.page_scores(case.q, sel.lm, case.req_to_token, case.rpi, f["cand_lo"], f["cand_hi"], PS,
                             sel.scores.shape[1])
    elif scores == "scales":
        g = torch.Generator().manual_seed(25)
        magnitude = 10.0 ** torch.randint(-40, 38, sel.scores.shape, generator=g)
        want = torch.randn(sel.scores.shape, generator=g) * magnitude
        big = 3.4028234663852886e38 / 2  # sparse_decode.FLOAT_BIG / 2, the clamp
        want[:, ::11] = big
        want[:, 5::13] = -big
        want[:, 3::17] = 1e-44
    else:
        want = torch.randint(0, 3, sel.scores.shape, generator=torch.Generator().manual_seed(24)).float() - 1.0
        want[:, ::7] = -0.0
        rows = torch.arange(sel.scores.shape[0])
        lo, hi = (f[name].long().repeat_interleave(sel.h) for name in ("cand_lo", "cand_hi"))
        want[rows, lo] = 2.0
        want[rows, (hi - 1).clamp(min=0)] = 2.0
    sel.scores.copy_(want)
    sel.select_write()
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


# ``bucket``: scores whose k best of each row fall in one first-round bucket ([2, 8): the keys' top 8 bits, sign and
# the exponent's top 7), with ties at 2.0, its lower edge, and the rest above it (16.0) or below it.
TAKEN_VALUES, OTHER_VALUES = (2.0, 2.0, 2.5, 3.0, 5.0, 7.5, 16.0), (1.0, 1.5, 0.75, -1.0, 1.9990234375)


def _bucket_scores(sel, seed):
    """Each row's k best on exactly k candidates (TAKEN_VALUES), the others below 2.0: the first histogram
    round's bucket holds exactly the keys still needed (``TopKVariant.exit_early`` stops there)."""
    g = torch.Generator().manual_seed(seed)
    f = sel.fields
    scores = torch.full(sel.scores.shape, OUTSIDE)
    for r in range(scores.shape[0]):
        b = r // sel.h
        lo, hi, k = int(f["cand_lo"][b]), int(f["cand_hi"][b]), int(f["k"][b])
        pick = lambda values, n: torch.tensor(values)[torch.randint(0, len(values), (n,), generator=g)]  # noqa: E731
        scores[r, lo:hi] = pick(OTHER_VALUES, hi - lo)
        scores[r, lo + torch.randperm(hi - lo, generator=g)[:k]] = pick(TAKEN_VALUES, min(k, hi - lo))
    return scores


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_bucket_of_exactly_the_keys_needed_is_taken_whole(K, variant):
    """Rows in every top-k tier whose k best share the first round's bucket with nothing else (ties at its lower
    edge among them): the pages are ``select_pages``' (a variant that stops its rounds there takes the bucket
    whole, so its equal keys too)."""
    case, schedules = _split_case(SPLIT_CANDIDATES, SPLIT_BUDGETS)
    sel = _selection(K, case, schedules, torch.float32, variant=variant)
    sel.scores.copy_(_bucket_scores(sel, seed=31))
    sel.select_write()
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


def test_wide_variant_splits_only_past_its_rows(K):
    """``short8_hist40_wide`` is ``fine_hist64``'s one launch below WIDE_FROM_ROWS rows (batch 16: 128 rows,
    where the short rows' launch only adds its own), ``short8_hist40``'s two from there on."""
    from sparrow_server.kernels import topk

    rows = topk.WIDE_FROM_ROWS
    assert K.select_launches("short8_hist40_wide", rows - 1) == K.select_launches("fine_hist64", rows - 1)
    assert K.select_launches("short8_hist40_wide", rows) == K.select_launches("short8_hist40", rows)
    assert [c["PART"] for c, _ in K.select_launches("short8_hist40_wide", rows)] == [1, 2]
    assert len(K.select_launches("short8_hist40", 1)) == 2  # the unconditional variant splits at any size


@pytest.mark.parametrize("variant", ["fine_hist64", "fused_hist64", "fused_exit_narrow", "fused_packed_narrow",
                                     "fused_rolled_narrow", "fused_atomic_narrow", "fused_topdigits_narrow",
                                     "fused_joint_narrow", "fused_hoisted_narrow"])
def test_one_call_scores_selects_and_updates_as_two_do(K, variant):
    """``score_and_select`` (the backend's call: for a fused variant one launch, a program per row) writes the
    scores, the landmark of the page each slot completes and the pages that ``page_scores`` then
    ``select_and_write`` write, on rows in every top-k tier and a dense row, and nothing else; the pages are
    ``select_pages``' on those scores."""
    case, schedules = _split_case(SPLIT_CANDIDATES, SPLIT_BUDGETS)
    one = _dyadic(_selection(K, case, schedules, torch.float32, variant=variant))
    two = SparseSelection(K, case, one.plan, one.lm.clone(), one.scores.shape[1], variant)
    n = torch.from_numpy(one.plan.n_pages.astype("int64"))
    loc = case.req_to_token[case.rpi, (n - 2) * PS + PS - 1].long()  # completes each request's first recent page
    for sel in (one, two):
        sel.lm[loc // PS] = 7.0
        sel.scores.fill_(OUTSIDE)
    assert K.TOPK_VARIANTS[variant].fuses(one.scores.shape[0]) == variant.startswith("fused")
    one.select(loc)
    two.score(loc)
    two.select_write()
    assert torch.equal(one.lm, two.lm) and not (one.lm[loc // PS] == 7.0).any()
    assert torch.equal(one.scores, two.scores) and (one.scores == OUTSIDE).any()
    assert torch.equal(one.indices, two.indices)
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)


def test_hoisted_launch_writes_what_the_joint_one_does(K):
    """``fused_hoisted_narrow``'s one launch (its plan loads first, its reserved pages, a dense row's 563 among them:
    more than one block, gathered before the scoring and stored after it, its write's page ids gathered before its
    ranks) writes the landmarks, scores and pages ``fused_joint_narrow``'s launch writes, on rows of one and of two
    register blocks."""
    lengths = [(c + SINK + RECENT) * PS - 5 for c in (2049, 300, 1025)] + [9000]
    case = _case(lengths, seed=26, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32)
    schedules = [fixed_budget_schedule(b) for b in (256, 30, 224)] + [dense_schedule()]
    one = _selection(K, case, schedules, torch.float32, variant="fused_hoisted_narrow")
    two = SparseSelection(K, case, one.plan, one.lm.clone(), one.scores.shape[1], "fused_joint_narrow")
    assert K.TOPK_VARIANTS[one.variant].fuses(one.scores.shape[0]) and int(one.plan.count[3]) > K.SELECT_ROWS[0]
    loc = case.req_to_token[case.rpi, case.lengths - 1].long()
    loc[:2] = case.req_to_token[case.rpi[:2], (case.lengths[:2] // PS) * PS - 1].long()  # two complete a page
    for sel in (one, two):
        sel.lm[loc // PS] = 7.0
        sel.scores.fill_(OUTSIDE)
        sel.indices.fill_(-1)
        sel.select(loc)
    assert (one.lm[loc[:2] // PS] != 7.0).all() and (one.lm[loc[2:] // PS] == 7.0).all()
    assert torch.equal(one.lm, two.lm) and torch.equal(one.scores, two.scores)
    assert torch.equal(one.indices, two.indices) and (one.indices >= 0).all()
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)


def _fused_or_split_pair(K, fused, monkeypatch, seed, variant, base):
    """Rows of 2,049 + 3 and 300 + 3 pages and a dense one (2 KV heads, fp32), selected by ``variant`` and ``base`` on
    equal landmarks, in their fused launch or (``fused`` False: their fused rows made 1) in the split launches."""
    if not fused:
        for name in (variant, base):
            monkeypatch.setitem(K.TOPK_VARIANTS, name, replace(K.TOPK_VARIANTS[name], fused_max_rows=1))
    lengths = [(c + SINK + RECENT) * PS - 5 for c in (2049, 300)] + [700]
    case = _case(lengths, seed=seed, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32)
    schedules = [fixed_budget_schedule(b) for b in (256, 30)] + [dense_schedule()]
    one = _selection(K, case, schedules, torch.float32, variant=variant)
    two = SparseSelection(K, case, one.plan, one.lm.clone(), one.scores.shape[1], base)
    assert K.TOPK_VARIANTS[one.variant].fuses(one.scores.shape[0]) == fused
    return case, one, two


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
def test_query_copy_reads_a_strided_query_and_copies_it(K, fused, monkeypatch):
    """``fused_qcopy_narrow`` given the query as SGLang's decode has it (each token's heads a slice of a wider QKV
    row) and ``q_out``: the same landmarks, scores and pages as ``fused_hoisted_narrow`` on the contiguous query, and
    ``q_out`` that query exactly (every head of every request, a dense row's too), in its fused launch and, past
    its fused rows (here made 1), in the split scoring and selection launches."""
    case, one, two = _fused_or_split_pair(K, fused, monkeypatch, 27, "fused_qcopy_narrow", "fused_hoisted_narrow")
    b, hq, d = case.q.shape
    qkv = torch.randn(b, (hq + 2 * 2) * d)  # a fused QKV output: q the first hq * d of each row
    qkv[:, :hq * d] = case.q.reshape(b, -1)
    strided = qkv[:, :hq * d].view(b, hq, d)
    assert not strided.is_contiguous() and K.copies_query("fused_qcopy_narrow")
    assert not K.copies_query("fused_hoisted_narrow")
    q_out = torch.full_like(case.q, OUTSIDE)
    loc = case.req_to_token[case.rpi, (case.lengths // PS) * PS - 1].long()  # each completes a page
    f = one.fields
    for sel, q, copy in ((one, strided, q_out), (two, case.q, None)):
        sel.scores.fill_(OUTSIDE)
        sel.indices.fill_(-1)
        K.score_and_select(q, sel.lm, case.req_to_token, case.rpi, f, sel.row_indptr, PS, sel.scores, sel.indices,
                           k_buf=case.k_buf, cache_loc=loc, variant=sel.variant, q_out=copy)
    assert torch.equal(q_out, case.q)
    assert torch.equal(one.lm, two.lm) and torch.equal(one.scores, two.scores)
    assert torch.equal(one.indices, two.indices) and (one.indices >= 0).all()
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "split"])
def test_kv_store_writes_the_step_kv_before_the_landmark_reads_it(K, fused, monkeypatch):
    """``fused_kvstore_narrow`` given the step's key and value as SGLang's decode has them (slices of each token's
    QKV row): the pools afterwards what ``set_kv_buffer`` then ``fused_qcopy_narrow`` leave (the step's slot of every
    head, nothing else), and the same landmarks (a completed page's from the new key), scores and pages, in the fused
    launch and, past its fused rows (here made 1), in the split scoring's landmark program."""
    case, one, two = _fused_or_split_pair(K, fused, monkeypatch, 28, "fused_kvstore_narrow", "fused_qcopy_narrow")
    assert K.stores_kv(one.variant)
    b, hq, d = case.q.shape
    qkv = torch.randn(b, (hq + 2 * 2) * d)  # a fused QKV output: k and v after the query heads of each row
    k, v = (qkv[:, (hq + i * 2) * d:(hq + i * 2 + 2) * d].view(b, 2, d) for i in (0, 1))
    k = k.clone()  # as where SGLang's rope writes the key anew: its tokens another stride apart than the value's
    loc = case.req_to_token[case.rpi, (case.lengths // PS) * PS - 1].long()  # each completes a page
    loc[2] = case.req_to_token[case.rpi[2], case.lengths[2] - 1].long()  # one does not
    stored_k, stored_v = case.k_buf.clone(), case.v_buf.clone()
    stored_k[loc], stored_v[loc] = k, v
    k_buf, v_buf = case.k_buf.clone(), case.v_buf.clone()
    for sel, kb, store in ((one, k_buf, (k, v, v_buf)), (two, stored_k, None)):
        sel.scores.fill_(OUTSIDE)
        sel.indices.fill_(-1)
        K.score_and_select(case.q, sel.lm, case.req_to_token, case.rpi, one.fields, sel.row_indptr, PS, sel.scores,
                           sel.indices, k_buf=kb, cache_loc=loc, variant=sel.variant, store_kv=store)
    assert torch.equal(k_buf, stored_k) and torch.equal(v_buf, stored_v)
    assert torch.equal(one.lm, two.lm) and torch.equal(one.scores, two.scores)
    assert torch.equal(one.indices, two.indices) and (one.indices >= 0).all()
    old = case.k_buf[(loc[:2] // PS * PS)[:, None] + torch.arange(PS)].mean(dim=1)  # the pages' landmarks before
    assert not torch.allclose(one.lm[loc[:2] // PS], old)


@pytest.mark.parametrize("programs", [1, 3, 400])
@pytest.mark.parametrize("lm_dtype", [torch.float32, torch.float8_e4m3fn])
def test_whole_page_scoring_writes_what_the_split_grid_writes(K, lm_dtype, programs, monkeypatch):
    """``fused_pages_narrow`` past its fused rows (here made 1) scores by whole pages, ``programs`` programs a request
    each an even share of its candidates (1: one program scores a request; 3: shares cut at no tile's edge; 400: more
    programs than a row of 300 has pages, so some have none). Given the strided query, ``q_out`` and the step's K and
    V, it leaves the pools, the landmarks (float8: their scales too), the scores (every entry: those it must not write
    keep their fill), the query copy and the pages that ``fused_kvstore_narrow``'s split grid leaves; on rows of 2,049
    candidates (257 tiles, the last of one page), 300, 77 and none, and a dense row."""
    from sparrow_server.kernels import page_scores_whole

    monkeypatch.setattr(page_scores_whole, "PAGE_PROGRAMS_INTERPRETED", programs)
    for name in ("fused_pages_narrow", "fused_kvstore_narrow"):
        monkeypatch.setitem(K.TOPK_VARIANTS, name, replace(K.TOPK_VARIANTS[name], fused_max_rows=1))
    lengths = [(c + SINK + RECENT) * PS - 5 for c in (2049, 300, 0, 77)] + [700]
    case = _case(lengths, seed=29, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32)
    if lm_dtype == torch.float8_e4m3fn:
        case.k_buf.mul_(1e-3)
    schedules = [fixed_budget_schedule(b) for b in (256, 30, 4, 16)] + [dense_schedule()]
    one = _selection(K, case, schedules, lm_dtype, variant="fused_pages_narrow")
    two = SparseSelection(K, case, one.plan, one.lm.clone(), one.scores.shape[1], "fused_kvstore_narrow",
                          landmark_scales=None if one.lm_scales is None else one.lm_scales.clone())
    assert K.stores_kv(one.variant) and K.copies_query(one.variant)
    assert not K.TOPK_VARIANTS[one.variant].fuses(one.scores.shape[0]) and int(one.fields["cand_hi"][2]) == 0
    b, hq, d = case.q.shape
    qkv = torch.randn(b, (hq + 2 * 2) * d, generator=torch.Generator().manual_seed(29))  # q, then k and v, a row
    qkv[:, :hq * d] = case.q.reshape(b, -1)
    strided = qkv[:, :hq * d].view(b, hq, d)
    k, v = (qkv[:, (hq + i * 2) * d:(hq + i * 2 + 2) * d].view(b, 2, d) for i in (0, 1))
    loc = case.req_to_token[case.rpi, (case.lengths // PS) * PS - 1].long()  # each completes a page
    loc[1] = case.req_to_token[case.rpi[1], case.lengths[1] - 1].long()  # one does not
    pools = [(case.k_buf.clone(), case.v_buf.clone()) for _ in range(2)]
    copies = [torch.full_like(case.q, OUTSIDE) for _ in range(2)]
    for sel, (kb, vb), q_out in zip((one, two), pools, copies):
        sel.scores.fill_(OUTSIDE)
        sel.indices.fill_(-1)
        K.score_and_select(strided, sel.lm, case.req_to_token, case.rpi, one.fields, sel.row_indptr, PS, sel.scores,
                           sel.indices, k_buf=kb, cache_loc=loc, variant=sel.variant, q_out=q_out,
                           store_kv=(k, v, vb), landmark_scales=sel.lm_scales)
    assert all(torch.equal(x, y) for x, y in zip(*pools)) and torch.equal(pools[0][0][loc], k)
    assert torch.equal(copies[0], case.q) and torch.equal(copies[1], case.q)
    assert torch.equal(one.lm, two.lm) and not torch.equal(one.lm, _selection(K, case, schedules, lm_dtype).lm)
    assert one.lm_scales is None or torch.equal(one.lm_scales, two.lm_scales)
    assert torch.equal(one.scores, two.scores) and (one.scores == OUTSIDE).any()
    assert torch.equal(one.indices, two.indices) and (one.indices >= 0).all()
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)


def test_fused_variants_fuse_up_to_their_rows(K):
    """``fused_hist64`` scores and selects in one launch at any batch; ``fused_hist64_narrow`` up to one wave of
    its programs (WIDE_FROM_ROWS rows: 2 per SM on 132 SMs), past it ``short8_hist40_wide``'s two launches; the
    split variants never. ``fused_exit_narrow`` is the same with the early exit in every launch."""
    narrow = K.TOPK_VARIANTS["fused_hist64_narrow"]
    rows = narrow.fused_max_rows
    assert rows == 264 and K.TOPK_VARIANTS["fused_hist64"].fuses(10**6)
    assert narrow.fuses(rows) and not narrow.fuses(rows + 1)
    assert K.select_launches("fused_hist64_narrow", rows + 1) == K.select_launches("short8_hist40_wide", rows + 1)
    assert not any(K.TOPK_VARIANTS[v].fuses(1) for v in VARIANTS if not v.startswith("fused"))
    exits = K.TOPK_VARIANTS["fused_exit_narrow"]
    assert exits.fuses(rows) and not exits.fuses(rows + 1) and exits.exit_early and not narrow.exit_early
    wide = [({**c, "EXIT": True}, o) for c, o in K.select_launches("short8_hist40_wide", rows + 1)]
    assert K.select_launches("fused_exit_narrow", rows + 1) == wide
    assert K.tier_launch("fused_exit_narrow")[0]["EXIT"] and not K.tier_launch("fused_hist64_narrow")[0]["EXIT"]


def test_variants_are_the_module_s():
    """The cases above run every selection variant the kernels offer."""
    from sparrow_server.kernels import sparse_decode

    assert VARIANTS == sparse_decode.SELECT_VARIANTS


def test_selection_ties_go_to_the_earlier_page(K):
    """Few distinct scores (and -0.0 next to +0.0) at a 40K-context server: ties broken by page
    order, as ``select_pages``."""
    case = _case([1200, 600, 50, 9000], seed=8, max_ctx=40960, num_kv_heads=4, head_dim=32)
    sel = _selection(K, case, [fixed_budget_schedule(20)] * 4, pcap=40960 // PS)
    scores = torch.randint(0, 3, sel.scores.shape, generator=torch.Generator().manual_seed(8)).float() - 1.0
    scores[:, ::7] = -0.0
    sel.scores.copy_(scores)
    sel.select_write()
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


def test_nan_and_inf_landmarks_rank_as_select_pages_ranks_them(K):
    """A NaN score is the lowest candidate and +-inf are clamped (``select_pages``): the score
    kernel writes them so that the selection matches ``select_pages`` on the reference scores."""
    case = _case([3000, 2000], seed=12, num_kv_heads=2, head_dim=16, dtype=torch.float32)
    sel = _selection(K, case, [fixed_budget_schedule(30)] * 2)
    phys = case.req_to_token[1:, ::PS].long() // PS
    for j, value in ((5, float("nan")), (9, float("inf")), (12, float("-inf")), (40, float("nan"))):
        sel.lm[phys[:, j], :, 0] = value  # one element: a NaN, +inf or -inf score (by q's sign)
    sel.score()
    sel.select_write()
    f = sel.fields
    want = R.page_scores(case.q, sel.lm, case.req_to_token, case.rpi, f["cand_lo"], f["cand_hi"], PS,
                         sel.scores.shape[1])
    sel.scores.copy_(want)
    assert sel.logical_pages(ordered=True) == sel.want_pages(SINK, RECENT)


def test_budget_at_least_length_is_dense(K):
    """Budget >= length: every page, in order (no candidates scored)."""
    lengths = [1000, 517, 16, 1]
    case = _case(lengths, seed=5)
    s = fixed_budget_schedule(64)  # 1024 tokens >= every length
    sel = _selection(K, case, [s, dense_schedule(), s, s])
    assert (sel.plan.k == 0).all()
    sel.score()
    sel.select_write()
    assert sel.logical_pages(ordered=True) == [list(range(-(-n // PS))) for n in lengths for _ in range(8)]


def test_mixed_schedules_in_one_batch(K):
    """Dense and sparse schedules in one batch, long dense rows included (their reserved part spans
    several tiles): each row is ``select_pages``' pages, dense rows all of theirs."""
    lengths = [20000, 12000, 5000, 900, 9000]
    case = _case(lengths, seed=13, num_kv_heads=2, head_dim=16, dtype=torch.float32)
    schedules = [fixed_budget_schedule(8), dense_schedule(), fixed_budget_schedule(64), dense_schedule(),
                 fixed_budget_schedule(300)]
    sel = _selection(K, case, schedules)
    assert list(sel.plan.k > 0) == [True, False, True, False, True]
    sel.score()
    sel.select_write()
    got = sel.logical_pages(ordered=True)
    assert got == sel.want_pages(SINK, RECENT)
    assert got[2] == list(range(750)) and got[6] == list(range(57))


@pytest.mark.parametrize("variant", ["v1", "even"])  # the two score grids ("split", "hist" score as "even")
def test_a_request_s_scores_and_pages_are_the_same_alone_and_in_a_batch(K, variant):
    """What deterministic inference relies on besides FlashInfer's plan: every program reads one
    request's query, landmarks and plan fields, so a request's scores (bit for bit, bf16 inputs) and
    selected pages alone equal its scores and pages in a batch of other lengths and schedules, at
    another position, beside a dense row and a padding lane."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import PagedCase

    lengths = [3000, 1548, 700, 40, 2100, 1]
    schedules = [dense_schedule(), fixed_budget_schedule(16), fixed_budget_schedule(8), fixed_budget_schedule(16),
                 fixed_budget_schedule(64), dense_schedule()]
    case = _case(lengths, seed=23, num_kv_heads=2, group=2, head_dim=64)
    lm, pcap = _landmarks(case, torch.bfloat16), 400
    batch = SparseSelection(K, case, plan_for(case, schedules, topk_cap_pages=64), lm, pcap, variant)
    batch.score()
    batch.select_write()
    h = batch.h
    for x in (1, 4):
        one = slice(x, x + 1)
        sub = PagedCase(case.q[one], case.k_buf, case.v_buf, case.req_to_token, case.rpi[one], case.lengths[one], PS)
        alone = SparseSelection(K, sub, plan_for(sub, [schedules[x]], topk_cap_pages=64), lm, pcap, variant)
        alone.score()
        alone.select_write()
        assert int(alone.plan.k[0]) > 0  # sparse: scored and selected
        assert torch.equal(batch.scores[x * h:(x + 1) * h], alone.scores), x
        start, end = int(batch.plan.row_indptr[x * h]), int(batch.plan.row_indptr[(x + 1) * h])
        assert torch.equal(batch.indices[start:end], alone.indices[:end - start]), x  # same page ids, same order
    assert batch.logical_pages(ordered=True) == batch.want_pages(SINK, RECENT)  # and they are select_pages'


@pytest.mark.parametrize("variant,candidates", [("fused_packed_narrow", 2061), ("fused_packed_narrow", 2045),
                                                ("fused_rolled_narrow", 2061), ("fused_rolled_narrow", 2045),
                                                ("fused_atomic_narrow", 2061), ("fused_atomic_narrow", 2045),
                                                ("fused_topdigits_narrow", 2061), ("fused_topdigits_narrow", 2045),
                                                ("fused_joint_narrow", 2061), ("fused_hoisted_narrow", 2061),
                                                ("fused_hoisted_narrow", 2045)])
def test_the_phase_profile_mirrors_the_fused_launch(K, variant, candidates):
    """``benchmarks/selection_phase_profile.py``'s stamped kernel (its stamps off: the interpreter runs no PTX) writes
    the index buffer the product's fused launch writes, so the phases it times are the product's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import selection_phase_profile as P

    case = _case([(candidates + SINK + RECENT) * PS] * 2, seed=5, num_kv_heads=2, group=2, head_dim=16,
                 dtype=torch.float32)
    sel = _selection(K, case, [fixed_budget_schedule(256)] * 2, torch.float32, variant=variant)
    loc = case.req_to_token[case.rpi, case.lengths - 1].long()  # completes each request's last page
    sel.select(loc)
    want = sel.indices.clone()
    sel.indices.zero_()
    stamps = torch.zeros(sel.scores.shape[0], P.STAMPS, 2, dtype=torch.int64)
    P.stamped_launch(sel, loc, stamps, variant, P.tier(candidates, variant), stamp=False)
    assert torch.equal(sel.indices, want) and (want > 0).all()


def _partial_states(q, k, v, parts):
    """Attention of each query over ``parts`` consecutive slices of the keys (the last slice may be empty):
    outputs [parts, G, D] and base-2 log-sum-exps [parts, G] of the scaled logits, as FlashInfer returns them."""
    logits = q @ k.T / math.sqrt(q.shape[-1])  # [G, L]
    bounds = [c * (k.shape[0] - 1) // parts for c in range(parts)] + [k.shape[0]]
    outs, lses = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if lo == hi:
            outs.append(torch.zeros(q.shape)), lses.append(torch.full(q.shape[:1], float("-inf")))
            continue
        outs.append(torch.softmax(logits[:, lo:hi], dim=-1) @ v[lo:hi])
        lses.append(torch.logsumexp(logits[:, lo:hi], dim=-1) / math.log(2.0))
    return torch.stack(outs), torch.stack(lses), torch.softmax(logits, dim=-1) @ v


@pytest.mark.parametrize("group", [2, 3])
def test_merge_of_sub_rows_is_the_attention_over_their_union(group):
    """``kernels.merge``: sub-row states merged by their base-2 log-sum-exps are the row's attention over all its
    keys (an empty sub-row weighs nothing; a group of 3 pads the kernel's head block), as the reference says."""
    from sparrow_server.kernels.merge import merge_parts

    g = torch.Generator().manual_seed(group)
    rows, parts, d = 3, 4, 16
    v_parts, s_parts, want = [], [], []
    for length in (9, 40, 3):  # 3 keys: one sub-row gets none
        q, k, v = (torch.randn(n, d, generator=g) * 2 for n in (group, length, length))
        o, s, full = _partial_states(q, k, v, parts)
        v_parts.append(o), s_parts.append(s), want.append(full)
    v_parts, s_parts = torch.cat(v_parts).contiguous(), torch.cat(s_parts).contiguous()
    assert torch.isinf(s_parts).any()
    out = merge_parts(v_parts, s_parts, parts, torch.empty(rows, group, d, dtype=torch.bfloat16))
    want = torch.stack(want)
    assert torch.allclose(R.merge_parts(v_parts, s_parts, parts), want, atol=1e-5)
    assert torch.allclose(out.float(), want, atol=2e-2, rtol=1e-2), (out.float() - want).abs().max()


def test_sub_row_queries_give_each_sub_row_its_own_rows_query():
    """``merge.sub_row_queries``: after ``lead`` rows left as they were, sub-row ``lead + r * parts + c`` holds row
    ``r``'s query (a query of another row, or one row's queries tiled, would attend the wrong keys)."""
    from sparrow_server.kernels.merge import sub_row_queries

    q = torch.randn(5, 2, 8, generator=torch.Generator().manual_seed(0))
    out = torch.full((1 + 5 * 3, 2, 8), 7.0)
    assert sub_row_queries(q, 3, 1, out) is out
    assert (out[0] == 7.0).all()
    for r in range(5):
        for c in range(3):
            assert torch.equal(out[1 + r * 3 + c], q[r]), (r, c)
    assert sub_row_queries(q, 2, 1).shape == (11, 2, 8)


@pytest.mark.parametrize("placement", ["random", "contiguous"])
def test_landmark_read_bench_reads_the_rows_the_scoring_reads(placement):
    """``benchmarks/landmark_read.py`` (the kernel bench's read-only floor for the scoring): its gather sums exactly
    the landmark rows of each request's candidate pages (every KV head), its linear pass as many rows from one
    contiguous run per request, each program its even share (requests of 70, 9 and 33 candidates, whose pages the
    programs' shares split, and a dense request with none)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import landmark_read

    lengths = [(c + SINK + RECENT) * PS - 5 for c in (70, 9, 33)] + [700]
    case = _case(lengths, seed=30, num_kv_heads=2, group=2, head_dim=16, dtype=torch.float32, placement=placement)
    schedules = [fixed_budget_schedule(b) for b in (16, 4, 8)] + [dense_schedule()]
    plan = plan_for(case, schedules, topk_cap_pages=16)
    lm = torch.randn(case.k_buf.shape[0] // PS, 2, 16, generator=torch.Generator().manual_seed(30))
    lo, hi = torch.from_numpy(plan.cand_lo.astype("int32")), torch.from_numpy(plan.cand_hi.astype("int32"))
    n = hi - lo
    assert (n == 0).any() and int(n[0]) > 2 * landmark_read.READ_BLOCK_P, n
    got = landmark_read.row_sums(lm, case.req_to_token, case.rpi, lo, hi, PS, linear=False)
    lin = landmark_read.row_sums(lm, case.req_to_token, case.rpi, lo, hi, PS, linear=True)
    base = landmark_read.linear_bases(lm, lo, hi)
    for b in range(len(lengths)):
        j = torch.arange(int(lo[b]), int(hi[b]))
        pages = case.req_to_token[case.rpi[b], j * PS].long() // PS
        torch.testing.assert_close(got[b].sum(), lm[pages].sum(), rtol=1e-5, atol=1e-4)
        run = torch.arange(int(base[b]), int(base[b]) + int(n[b]))
        torch.testing.assert_close(lin[b].sum(), lm[run].sum(), rtol=1e-5, atol=1e-4)
    assert got.shape == (len(lengths), landmark_read.read_programs(len(lengths), lm.device))
