"""One layer of the backend's sparse decode against the core reference (GPU, no SGLang server)."""
from __future__ import annotations

import math

import pytest
import torch

from sparrow_server.kernels import SELECT_VARIANTS as VARIANTS
from sparrow_server.kernels import reference as R
from sparrow_server.sparsity.selection import dense_decode_attention, sparse_decode_attention
from sparrow_server.sparsity.schedule import dense_schedule

pytestmark = pytest.mark.gpu

PS = 16
SINK, RECENT = 1, 2  # fixed_budget_schedule's reserved pages


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _scaled_landmarks(case, dtype):
    """Every full page's landmark by the kernel, and (float8) their scales, else None."""
    from sparrow_server.kernels import sparse_decode as K

    lm, scales = R.zero_landmarks(case.k_buf.shape[0] // PS, *case.k_buf.shape[1:], dtype, "cuda")
    slots = torch.arange(case.k_buf.shape[0], device="cuda")
    K.update_landmarks(case.k_buf, slots, lm, PS, only_full=True, landmark_scales=scales)
    return lm, scales


def _landmarks(case, dtype):
    return _scaled_landmarks(case, dtype)[0]


def _layer(case, plan, lm, pcap, variant=None, scales=None):
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import SparseLayer

    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    return SparseLayer(case, plan, lm, pcap, ws, variant, landmark_scales=scales)


@pytest.mark.parametrize("lm_dtype", [torch.float32, torch.float8_e4m3fn])
def test_landmark_kernel_matches_reference(lm_dtype):
    """The kernel's page means equal the reference's; stored as float8 (keys of 1e-3, a dummy-weight model's), each
    page and head with the reference's power-of-two scale, exactly, and each element rounded to the nearest float8 as
    torch's cast of the reference's scaled mean: equal but where the two fp32 sums, taken in other orders, straddle a
    rounding boundary (one float8 step: 1/8 of the value, 2^-9 near zero).
    (The Triton interpreter's float8 cast drops the carry of a rounded-up mantissa: the CPU case allows it.)"""
    from sparrow_server.kernels import sparse_decode as K
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import make_case

    case = make_case([300, 77], seed=1)
    scaled = lm_dtype in R.SCALED_LANDMARK_DTYPES
    if scaled:
        case.k_buf.mul_(1e-3)
    for only_full in (True, False):
        locs = torch.randint(0, case.k_buf.shape[0], (200,), device="cuda")
        got = torch.full((case.k_buf.shape[0] // PS, 8, 128), 7.0, device="cuda").to(lm_dtype)
        want = got.clone()
        got_s, want_s = (torch.full(got.shape[:2], 7.0, device="cuda") for _ in "ab") if scaled else (None, None)
        K.update_landmarks(case.k_buf, locs, got, PS, only_full, landmark_scales=got_s)
        R.update_landmarks(case.k_buf, locs, want, PS, only_full, landmark_scales=want_s)
        if lm_dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            continue
        assert torch.equal(got_s, want_s) and int((got_s != 7.0).sum()) > 0
        torch.testing.assert_close(got.float(), want.float(), rtol=0.125, atol=2.0**-9)
        assert (got.float() == want.float()).float().mean() > 0.99
        assert int((got.float() != 7.0).any(dim=(1, 2)).sum()) > 0


@pytest.mark.parametrize("lm_dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_scores_and_indices_match_reference(lm_dtype):
    from sparrow_server.kernels import sparse_decode as K  # noqa: F401
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    case = make_case([5000, 1200, 40, 3000], seed=2)
    # float8: a dummy-weight model's keys, whose landmarks unscaled round to zero
    key_scale = 1e-3 if lm_dtype in R.SCALED_LANDMARK_DTYPES else 1.0
    case.k_buf.mul_(key_scale)
    s = fixed_budget_schedule(32)
    plan = plan_for(case, [s, s, s, dense_schedule()], topk_cap_pages=64)
    lm, scales = _scaled_landmarks(case, lm_dtype)
    layer = _layer(case, plan, lm, pcap=400, scales=scales)
    got = layer.score()
    f = {k: v.cpu() for k, v in layer.fields.items()}
    want = R.page_scores(case.q.cpu(), lm.cpu(), case.req_to_token.cpu(), case.rpi.cpu(), f["cand_lo"],
                         f["cand_hi"], PS, 400, landmark_scales=None if scales is None else scales.cpu())
    inside = torch.isfinite(want)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3 * key_scale)  # scores scale with the keys
    assert want[inside].unique().numel() > 0.9 * int(inside.sum())  # scores that tell the pages apart
    layer.select_write()
    top = torch.topk(layer.scores, 64, dim=1, sorted=True).indices  # stable enough: random scores, no ties
    want_idx = torch.full_like(layer.indices.cpu(), -1)
    R.write_indices(top.cpu(), case.req_to_token.cpu(), case.rpi.cpu(), f, layer.row_indptr.cpu(), 8, PS, want_idx)
    for r in range(plan.batch_size * 8):
        a, b = int(plan.row_indptr[r]), int(plan.row_indptr[r + 1])
        assert sorted(layer.indices[a:b].tolist()) == sorted(want_idx[a:b].tolist())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lengths,budget", [([600, 40, 300, 17, 32768, 1000], 64), ([2048, 4100, 17, 16], 8)])
def test_selection_is_select_pages_at_40k_context(lengths, budget, variant):
    """A server at --context-length 40960 (Pcap 2560) with short sequences: the selected pages, in
    index order, are exactly ``select_pages``' (sink, top-k ascending, recent), whatever Pcap."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    case = make_case(lengths, seed=7, max_ctx=40960)
    s = fixed_budget_schedule(budget)
    plan = plan_for(case, [s] * len(lengths), topk_cap_pages=budget)
    layer = _layer(case, plan, _landmarks(case, torch.bfloat16), pcap=40960 // PS, variant=variant)
    layer.score()
    layer.select_write()
    assert layer.logical_pages(ordered=True) == layer.want_pages(SINK, RECENT)


@pytest.mark.parametrize("variant", VARIANTS)
def test_rows_past_2048_candidates(variant):
    """Issue 24: rows either side of 2048 candidates (v1's second score tile and 4096 tier), of the
    2048 + 256/512/1024 tiers, of 4096 (streamed past it), a short row and a dense row, at Qwen3-1.7B
    shapes: every candidate scored (= ``reference.page_scores``), nothing else written, and the
    selection is ``select_pages``' on those scores."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    cands = [2047, 2048, 2049, 2305, 2561, 3073, 4096, 4097, 300]
    case = make_case([(c + SINK + RECENT) * PS - 5 for c in cands] + [700], seed=24)
    s = fixed_budget_schedule(256)
    plan = plan_for(case, [s] * len(cands) + [dense_schedule()], topk_cap_pages=256)
    lm = _landmarks(case, torch.bfloat16)
    layer = _layer(case, plan, lm, pcap=int(plan.n_pages.max()), variant=variant)
    layer.scores.fill_(-123.25)  # no kernel write produces it
    got = layer.score().cpu()
    f = {k: v.cpu() for k, v in layer.fields.items()}
    want = R.page_scores(case.q.cpu(), lm.cpu(), case.req_to_token.cpu(), case.rpi.cpu(), f["cand_lo"],
                         f["cand_hi"], PS, layer.scores.shape[1])
    inside = torch.isfinite(want)
    assert int(inside.sum()) == 8 * sum(cands)
    torch.testing.assert_close(got[inside], want[inside], rtol=1e-4, atol=1e-3)
    assert (got[~inside] == -123.25).all()
    layer.scores[~inside.cuda()] = float("-inf")
    layer.select_write()
    assert layer.logical_pages(ordered=True) == layer.want_pages(SINK, RECENT)


def test_selection_ties_go_to_the_earlier_page():
    """Few distinct scores (and -0.0 next to +0.0): ties broken by page order, as ``select_pages``."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    case = make_case([1200, 600, 50, 9000], seed=8, max_ctx=40960)
    s = fixed_budget_schedule(20)
    plan = plan_for(case, [s] * 4, topk_cap_pages=20)
    layer = _layer(case, plan, _landmarks(case, torch.bfloat16), pcap=40960 // PS)
    g = torch.Generator(device="cpu").manual_seed(8)
    scores = torch.randint(0, 3, layer.scores.shape, generator=g).float() - 1.0
    scores[:, ::7] = -0.0
    layer.scores.copy_(scores)
    layer.select_write()
    assert layer.logical_pages(ordered=True) == layer.want_pages(SINK, RECENT)


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_scoring_updates_the_completed_page_landmark(variant):
    """The decode path's score launch first writes the landmark of the page this step's slot
    completes (one program of several); a slot inside a page leaves its landmark alone."""
    from sparrow_server.kernels import sparse_decode as K
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import make_case

    case = make_case([40, 70], seed=9)
    lm = torch.full((case.k_buf.shape[0] // PS, 8, 128), 7.0, device="cuda")
    want = lm.clone()
    locs = torch.stack([case.req_to_token[1, 31], case.req_to_token[2, 69]]).long()
    R.update_landmarks(case.k_buf, locs, want, PS, only_full=True)
    zero = torch.zeros(2, dtype=torch.int32, device="cuda")
    K.page_scores(case.q, lm, case.req_to_token, case.rpi, zero, zero, PS, torch.zeros(16, 100, device="cuda"),
                  k_buf=case.k_buf, cache_loc=locs, variant=variant)
    torch.testing.assert_close(lm, want, rtol=1e-5, atol=1e-5)
    assert int((lm != 7).any(dim=(1, 2)).sum()) == 1


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.startswith("fused")])
def test_one_launch_scores_selects_and_updates_as_two_do(variant):
    """33 requests x 8 KV heads (264 rows: one wave of row programs, so both fused variants fuse), rows in the top-k
    tiers from 1,024 to past 2,048 candidates and a dense row: ``score_and_select``'s one launch writes the
    scores (the reference's, to fp32 rounding), the landmarks of the pages the step completes and the pages that
    ``page_scores`` then ``select_and_write`` write, and its pages are ``select_pages``' on its scores."""
    from sparrow_server.kernels import sparse_decode as K
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    g = torch.Generator().manual_seed(40)
    lengths = [33000, 16500, 24500, 700] + torch.randint(1000, 12000, (29,), generator=g).tolist()
    case = make_case(lengths, seed=40)
    schedules = [fixed_budget_schedule(b) for b in torch.randint(16, 300, (32,), generator=g).tolist()]
    plan = plan_for(case, schedules[:3] + [dense_schedule()] + schedules[3:], topk_cap_pages=300)
    lm = _landmarks(case, torch.bfloat16)
    one, two = (_layer(case, plan, lm.clone(), pcap=40960 // PS, variant=variant) for _ in range(2))
    assert K.TOPK_VARIANTS[variant].fuses(one.scores.shape[0])
    n = torch.from_numpy(plan.n_pages.astype("int64")).cuda()
    loc = case.req_to_token[case.rpi, (n - 2) * PS + PS - 1].long()  # completes each request's first recent page
    for layer in (one, two):
        layer.lm[loc // PS] = 7.0
    one.select(loc)
    two.score(loc)
    two.select_write()
    assert torch.equal(one.lm, two.lm) and not (one.lm[loc // PS] == 7.0).any()
    assert torch.equal(one.scores, two.scores) and torch.equal(one.indices, two.indices)
    f = {k: v.cpu() for k, v in one.fields.items()}
    want = R.page_scores(case.q.cpu(), one.lm.cpu(), case.req_to_token.cpu(), case.rpi.cpu(), f["cand_lo"],
                         f["cand_hi"], PS, one.scores.shape[1])
    inside = torch.isfinite(want)
    torch.testing.assert_close(one.scores.cpu()[inside], want[inside], rtol=1e-4, atol=1e-3)
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)


def _fused_or_split_case(split: bool, seed: int, device: str = "cuda"):
    """Six requests of 700 to 33,000 tokens, a dense one among them (fused: 48 rows), or with 28 more of 500 to
    12,000 (34 x 8 KV heads: 272 rows, past the fused launch's 264): the case and its plan (top-k cap 256 pages)."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    lengths = [33000, 16500, 700, 24500, 2100, 9000]
    budgets = [256, 100, 30, 200, None, 64]
    if split:
        g = torch.Generator().manual_seed(seed + 1)
        lengths += torch.randint(500, 12000, (28,), generator=g).tolist()
        budgets += torch.randint(16, 256, (28,), generator=g).tolist()
    case = make_case(lengths, seed=seed, device=device)
    schedules = [dense_schedule() if b is None else fixed_budget_schedule(b) for b in budgets]
    return case, plan_for(case, schedules, topk_cap_pages=256)


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_query_copy_takes_the_strided_query_and_attends_the_same(split):
    """``fused_qcopy_narrow`` given the query as SGLang's decode has it (a slice of each token's fused QKV row) and
    ``q_out``: the landmarks, scores and pages ``fused_hoisted_narrow`` writes from the contiguous query, ``q_out`` that
    query exactly, and so FlashInfer's decode on it the same output; in the fused launch (6 requests) and past its
    rows (34 requests x 8 KV heads: 272 rows), where the split scoring's launch copies it."""
    from sparrow_server.kernels import sparse_decode as K

    case, plan = _fused_or_split_case(split, seed=41)
    lm = _landmarks(case, torch.bfloat16)
    one = _layer(case, plan, lm.clone(), pcap=40960 // PS, variant="fused_qcopy_narrow")
    two = _layer(case, plan, lm.clone(), pcap=40960 // PS, variant="fused_hoisted_narrow")
    b, hq, d = case.q.shape
    qkv = torch.randn(b, (hq + 2 * 8) * d, device="cuda").to(case.q.dtype)  # q the first hq * d of each row
    qkv[:, :hq * d] = case.q.reshape(b, -1)
    strided = qkv[:, :hq * d].view(b, hq, d)
    assert not strided.is_contiguous() and K.copies_query("fused_qcopy_narrow")
    assert K.TOPK_VARIANTS[one.variant].fuses(one.scores.shape[0]) != split
    q_out = torch.full_like(case.q, -123.25)
    n = torch.from_numpy(plan.n_pages.astype("int64")).cuda()
    loc = case.req_to_token[case.rpi, (n - 2) * PS + PS - 1].long()
    for layer, q, copy in ((one, strided, q_out), (two, case.q, None)):
        K.score_and_select(q, layer.lm, case.req_to_token, case.rpi, layer.fields, layer.row_indptr, PS, layer.scores,
                           layer.indices, k_buf=case.k_buf, cache_loc=loc, variant=layer.variant, q_out=copy)
    assert torch.equal(q_out, case.q)
    assert torch.equal(one.lm, two.lm) and torch.equal(one.scores, two.scores)
    assert torch.equal(one.indices, two.indices)
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)
    got = one.wrapper.run(q_out.view(-1, one.g, d), one.kv)
    assert torch.equal(got, two.wrapper.run(case.q.view(-1, two.g, d), two.kv))


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_kv_store_stores_the_step_kv_and_attends_the_same(split):
    """``fused_kvstore_narrow`` given the step's key and value as SGLang's decode has them (slices of each token's
    fused QKV row): the pools afterwards exactly what ``set_kv_buffer`` then ``fused_qcopy_narrow`` leave, the same
    landmarks (the completed pages' from the new keys), scores and pages, and FlashInfer's decode the same output;
    in the fused launch (6 requests) and past its rows (34 requests x 8 KV heads), in the split scoring."""
    from sparrow_server.kernels import sparse_decode as K

    case, plan = _fused_or_split_case(split, seed=43)
    lm = _landmarks(case, torch.bfloat16)
    one = _layer(case, plan, lm.clone(), pcap=40960 // PS, variant="fused_kvstore_narrow")
    two = _layer(case, plan, lm.clone(), pcap=40960 // PS, variant="fused_qcopy_narrow")
    assert K.stores_kv(one.variant) and K.TOPK_VARIANTS[one.variant].fuses(one.scores.shape[0]) != split
    b, hq, d = case.q.shape
    qkv = torch.randn(b, (hq + 2 * 8) * d, device="cuda").to(case.q.dtype)  # k, v after the query heads of a row
    k, v = (qkv[:, (hq + i * 8) * d:(hq + i * 8 + 8) * d].view(b, 8, d) for i in (0, 1))
    n = torch.from_numpy(plan.n_pages.astype("int64")).cuda()
    loc = case.req_to_token[case.rpi, (n - 2) * PS + PS - 1].long()  # completes each request's first recent page
    before = case.k_buf.clone(), case.v_buf.clone()
    case.k_buf[loc], case.v_buf[loc] = k, v  # as set_kv_buffer leaves the pools
    K.score_and_select(case.q, two.lm, case.req_to_token, case.rpi, two.fields, two.row_indptr, PS, two.scores,
                       two.indices, k_buf=case.k_buf, cache_loc=loc, variant=two.variant)
    want = two.wrapper.run(case.q.view(-1, two.g, d), two.kv)
    stored = case.k_buf.clone(), case.v_buf.clone()
    case.k_buf.copy_(before[0])
    case.v_buf.copy_(before[1])
    K.score_and_select(case.q, one.lm, case.req_to_token, case.rpi, one.fields, one.row_indptr, PS, one.scores,
                       one.indices, k_buf=case.k_buf, cache_loc=loc, variant=one.variant,
                       store_kv=(k, v, case.v_buf))
    assert torch.equal(case.k_buf, stored[0]) and torch.equal(case.v_buf, stored[1])
    assert not torch.equal(stored[0], before[0])
    assert torch.equal(one.lm, two.lm) and torch.equal(one.scores, two.scores)
    assert torch.equal(one.indices, two.indices)
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)
    assert torch.equal(one.wrapper.run(case.q.view(-1, one.g, d), one.kv), want)


@pytest.mark.parametrize("lm_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_whole_page_scoring_past_the_fused_rows(lm_dtype):
    """``fused_pages_narrow`` at 34 requests x 8 KV heads (272 rows, past the fused launch's 264: its programs, a
    few an SM, each an even share of a request's candidates, every KV head of a page: the longest rows several tiles a
    program, shares of unequal size), given the strided query, ``q_out`` and the step's K and V: the pools, landmarks (float8: their scales),
    query copy and untouched score entries exactly what ``fused_kvstore_narrow``'s split grid leaves; the scores the
    reference's (``page_scores``, to fp32 rounding) on every candidate; the pages ``select_pages``' on its scores."""
    from sparrow_server.kernels import page_scores_whole as W
    from sparrow_server.kernels import sparse_decode as K

    case, plan = _fused_or_split_case(True, seed=47)
    lm, scales = _scaled_landmarks(case, lm_dtype)
    one, two = (_layer(case, plan, lm.clone(), pcap=40960 // PS, variant=v,
                       scales=None if scales is None else scales.clone())
                for v in ("fused_pages_narrow", "fused_kvstore_narrow"))
    variant = K.TOPK_VARIANTS[one.variant]
    assert not variant.fuses(one.scores.shape[0]) and variant.scores_whole_pages
    nprog = W.page_programs(case.q.shape[0], case.q.device)
    cands = (one.fields["cand_hi"] - one.fields["cand_lo"]).cpu()
    assert nprog > 1 and int(cands.max()) > nprog * W.PAGE_TILE and bool((cands % nprog).any())
    b, hq, d = case.q.shape
    qkv = torch.randn(b, (hq + 2 * 8) * d, device="cuda").to(case.q.dtype)  # q, then k and v, a token's row
    qkv[:, :hq * d] = case.q.reshape(b, -1)
    strided = qkv[:, :hq * d].view(b, hq, d)
    k, v = (qkv[:, (hq + i * 8) * d:(hq + i * 8 + 8) * d].view(b, 8, d) for i in (0, 1))
    n = torch.from_numpy(plan.n_pages.astype("int64")).cuda()
    loc = case.req_to_token[case.rpi, (n - 2) * PS + PS - 1].long()  # completes each request's first recent page
    pools = [(case.k_buf.clone(), case.v_buf.clone()) for _ in range(2)]
    copies = [torch.full_like(case.q, -123.25) for _ in range(2)]
    for layer, (kb, vb), q_out in zip((one, two), pools, copies):
        layer.scores.fill_(-123.25)  # no kernel write produces it
        K.score_and_select(strided, layer.lm, case.req_to_token, case.rpi, layer.fields, layer.row_indptr, PS,
                           layer.scores, layer.indices, k_buf=kb, cache_loc=loc, variant=layer.variant, q_out=q_out,
                           store_kv=(k, v, vb), landmark_scales=layer.lm_scales)
    assert all(torch.equal(x, y) for x, y in zip(*pools)) and torch.equal(pools[0][0][loc], k)
    assert torch.equal(copies[0], case.q) and torch.equal(copies[1], case.q)
    assert torch.equal(one.lm, two.lm) and not torch.equal(one.lm, lm)
    assert scales is None or torch.equal(one.lm_scales, two.lm_scales)
    f = {key: val.cpu() for key, val in one.fields.items()}
    want = R.page_scores(case.q.cpu(), one.lm.float().cpu(), case.req_to_token.cpu(), case.rpi.cpu(), f["cand_lo"],
                         f["cand_hi"], PS, one.scores.shape[1],
                         landmark_scales=None if scales is None else one.lm_scales.cpu())
    inside = torch.isfinite(want)
    got = one.scores.cpu()
    assert int(inside.sum()) > 0 and (got[~inside] == -123.25).all()
    assert torch.equal(got[~inside], two.scores.cpu()[~inside])
    torch.testing.assert_close(got[inside], want[inside], rtol=1e-4, atol=1e-3)
    assert one.logical_pages(ordered=True) == one.want_pages(SINK, RECENT)


@pytest.mark.parametrize("lengths,budget", [([32768, 20000, 4100, 900], 256), ([5000, 333, 2048, 17], 40)])
def test_sparse_layer_equals_core_reference(lengths, budget):
    """Selection = ``select_pages`` on fp32 landmarks; output = masked attention over it."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    case = make_case(lengths, seed=3)
    s = fixed_budget_schedule(budget)
    plan = plan_for(case, [s] * len(lengths), topk_cap_pages=budget)
    layer = _layer(case, plan, _landmarks(case, torch.float32), pcap=math.ceil(max(lengths) / PS))
    scale = 1 / math.sqrt(128)
    out = layer(scale).view(len(lengths), -1, 128)
    k, v = case.dense_kv()
    budgets = torch.tensor([budget] * len(lengths))
    ref, page_ids = sparse_decode_attention(case.q.float(), k.float(), v.float(), case.lengths.cuda(),
                                            budgets.cuda(), PS, 1, 2, scale)
    got_pages = layer.logical_pages()
    want_pages = [set(int(p) for p in row if p >= 0) for row in page_ids.view(-1, page_ids.shape[-1]).tolist()]
    assert got_pages == want_pages
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("lm_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_narrow_landmarks_select_nearly_the_same_pages(lm_dtype):
    """bfloat16 and float8 landmarks select nearly float32's pages (on this case's random keys the reference's
    top-k keeps 99.9% and 98.3% of float32's)."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    case = make_case([32768, 16384], seed=4)
    s = fixed_budget_schedule(256)
    plan = plan_for(case, [s, s], topk_cap_pages=256)
    pages = []
    for dtype in (torch.float32, lm_dtype):
        lm, scales = _scaled_landmarks(case, dtype)
        layer = _layer(case, plan, lm, pcap=2048, scales=scales)
        layer(1 / math.sqrt(128))
        pages.append(layer.logical_pages())
    overlap = sum(len(a & b) for a, b in zip(*pages)) / sum(len(a) for a in pages[0])
    assert 0.95 < overlap < 1, overlap  # < 1: the narrow dtype's rounding reached the selection


def test_budget_at_least_length_is_dense():
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule, make_case, plan_for

    lengths = [1000, 517, 16, 1]
    case = make_case(lengths, seed=5)
    s = fixed_budget_schedule(64)  # 1024 tokens >= every length
    plan = plan_for(case, [s, dense_schedule(), s, s], topk_cap_pages=64)
    assert (plan.k == 0).all()
    layer = _layer(case, plan, _landmarks(case, torch.bfloat16), pcap=64)
    scale = 1 / math.sqrt(128)
    out = layer(scale).view(len(lengths), -1, 128)
    k, v = case.dense_kv()
    ref = dense_decode_attention(case.q.float(), k.float(), v.float(), case.lengths.cuda(), scale)
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("parts", [2, 4, 8])
def test_sub_rows_merged_equal_the_sparse_layer(parts):
    """Each row's selected pages as sub-rows (``planning.split_rows``: rows of 2 pages leave sub-rows empty at 4 and
    8), each attended unsplit on FlashInfer's tensor cores, merged by ``kernels.merge``: the same attention as the
    served kernel over the same index buffer (within four bf16 roundings: the partial outputs are bf16), as core's
    reference, and the same again replayed from a CUDA graph."""
    from sparrow_server.sglang_plugin.scheduler.determinism import NO_SPLIT
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import (SparseLayer, fixed_budget_schedule,
                                                                        make_case, plan_for)

    lengths = [32768, 20000, 4100, 900, 17, 33]
    case = make_case(lengths, seed=5)
    plan = plan_for(case, [fixed_budget_schedule(256)] * len(lengths), topk_cap_pages=256)
    lm, pcap = _landmarks(case, torch.float32), math.ceil(max(lengths) / PS)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    layer = SparseLayer(case, plan, lm, pcap, ws, split=NO_SPLIT, parts=parts)
    scale = 1 / math.sqrt(128)
    out = layer(scale).clone()
    served = _layer(case, plan, lm, pcap)
    served.indices.copy_(layer.indices)
    want = served.attend().float()
    ulp = want.abs().max().item() * 2 ** -8
    assert (out.float() - want).abs().max().item() <= 4 * ulp
    k, v = case.dense_kv()
    ref, _ = sparse_decode_attention(case.q.float(), k.float(), v.float(), case.lengths.cuda(),
                                     torch.tensor([256] * len(lengths)).cuda(), PS, 1, 2, scale)
    assert _rel(out.view(len(lengths), -1, 128), ref) < 1e-2
    graph, replayed = torch.cuda.CUDAGraph(), torch.zeros_like(out)
    layer.attend(out=replayed)
    with torch.cuda.graph(graph):
        layer.attend(out=replayed)
    replayed.zero_()
    graph.replay()
    assert torch.equal(replayed, out)
