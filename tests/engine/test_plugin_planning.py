"""CPU tests of the SGLang plug-in's pure parts: planning, index layout, side table, config.

No SGLang needed: the plug-in imports SGLang only inside ``register`` and the backend module.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from sparrow_server.kernels import reference as R
from sparrow_server.sglang_plugin.config import DEFAULT_TOPK_CAP_TOKENS, PluginConfig, PluginConfigError
from sparrow_server.sglang_plugin.scheduler.planning import (
    REQUEST_FIELDS, logical_page_lists, pack, packed_layout, plan_request, plan_step,
)
from sparrow_server.sglang_plugin.scheduler.side_table import (
    ScheduleTable, client_extra_key, resolve_request_schedule, schedule_from_custom_params,
)
from sparrow_server.sparsity.registry import ScheduleRegistry, UnknownScheduleError
from sparrow_server.sparsity.schedule import Schedule, ScheduleError, budget_pages, dense_schedule, dump_schedule
from sparrow_server.sparsity.wire import schedule_name_from_extra_key
from sparrow_server.sparsity.selection import (
    batched_page_landmarks, num_pages, page_scores, query_summary, select_pages,
)

PS = 16


def _fixed(budget_pages_, sink=1, recent=2):
    return Schedule(name="fixed", budgets_tokens=(budget_pages_ * PS,), bin_tokens=10**9, sink_pages=sink,
                    recent_pages=recent, dense_layers=())


def _pool(lengths, h, d, seed):
    """Token-major pool with shuffled pages; returns k_buf, req_to_token (row 0 = padding), keys [B,Lmax,H,D]."""
    g = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / PS) for n in lengths]
    phys = (torch.randperm(sum(pages), generator=g) + 1).tolist()
    lmax = max(pages) * PS
    r2t = torch.zeros(len(lengths) + 1, lmax, dtype=torch.int32)
    off = 0
    for i, n in enumerate(pages):
        for j in range(n):
            r2t[i + 1, j * PS:(j + 1) * PS] = phys[off + j] * PS + torch.arange(PS)
        off += n
    k_buf = torch.randn((sum(pages) + 1) * PS, h, d, generator=g, dtype=torch.float64)
    keys = k_buf[r2t[1:].long()]
    for i, n in enumerate(lengths):
        keys[i, n:] = 0
    return k_buf, r2t, keys


@pytest.mark.parametrize("seed", range(4))
def test_gpu_pipeline_reference_equals_select_pages(seed):
    """scores -> top-k -> index writing (the GPU kernels' references) selects what ``select_pages`` does."""
    rng = np.random.default_rng(seed)
    h, g, d = 2, 2, 8
    lengths = [int(x) for x in rng.integers(1, 700, size=5)]
    budgets = [int(x) for x in rng.integers(4, 30, size=5)]
    k_buf, r2t, keys = _pool(lengths, h, d, seed)
    q = torch.randn(5, h * g, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 10))
    plan = plan_step([_fixed(b) for b in budgets], np.array(lengths), np.zeros(5), h, PS, topk_cap_pages=64)
    lm = torch.zeros(k_buf.shape[0] // PS, h, d, dtype=torch.float64)
    R.update_landmarks(k_buf, torch.arange(k_buf.shape[0]), lm, PS, only_full=False)
    rpi = torch.arange(1, 6)
    fields = {f: torch.from_numpy(getattr(plan, f)) for f in REQUEST_FIELDS}
    pcap = max(math.ceil(n / PS) for n in lengths)
    scores = R.page_scores(q, lm, r2t, rpi, fields["cand_lo"], fields["cand_hi"], PS, pcap)
    top = torch.sort(scores, dim=1, descending=True, stable=True).indices
    got = logical_page_lists(plan, top.numpy())
    lmax = keys.shape[1]
    want_scores = page_scores(query_summary(q, h), batched_page_landmarks(keys, PS))
    want, counts = select_pages(want_scores, num_pages(torch.tensor(lengths), PS), torch.tensor(budgets), 1, 2)
    for r, row in enumerate(got):
        b = r // h
        assert len(row) == len(set(row)) == int(counts[b])
        assert row[-1] == math.ceil(lengths[b] / PS) - 1, "the current page must be last"
        assert sorted(row) == [int(p) for p in want[b, r % h] if p >= 0]
    out = torch.full((plan.total_pages,), -1, dtype=torch.int64)
    R.write_indices(top, r2t, rpi, fields, torch.from_numpy(plan.row_indptr), h, PS, out)
    for r, row in enumerate(got):
        ids = out[plan.row_indptr[r]:plan.row_indptr[r + 1]]
        assert torch.equal(ids, torch.tensor([int(r2t[r // h + 1, j * PS]) * h + r % h for j in row]))
    assert lmax >= max(lengths)


def test_per_head_view_addresses_the_right_head():
    n, h, d = 64, 3, 4
    buf = torch.arange(n * h * d, dtype=torch.float32).view(n, h, d)
    view = R.per_head_kv_view(buf, PS)
    for slot in (0, 16, 48):
        for head in range(h):
            assert torch.equal(view[slot * h + head, :, 0, :], buf[slot:slot + PS, head, :])


def test_plan_counts_rows_and_last_page():
    s = _fixed(32)
    plan = plan_step([s, dense_schedule(), s], np.array([32768, 100, 5]), np.zeros(3), 8, PS, 256)
    assert plan.count.tolist() == [32, 7, 1]
    assert plan.k.tolist() == [29, 0, 0] and plan.sink.tolist() == [1, 7, 1]
    assert plan.row_indptr[-1] == 8 * (32 + 7 + 1) and len(plan.row_indptr) == 25
    assert plan.last_page_len.tolist() == [16] * 8 + [4] * 8 + [5] * 8
    assert plan.budget_tokens.tolist() == [32 * 16, 100, 5]


def test_plan_follows_schedule_budget_and_clamps_to_cap():
    reg = ScheduleRegistry()
    s = reg.get("qwen3-1.7b-0.86")
    for length in (1, 1999, 2000, 9000, 32768, 40000):
        n, cnt, sink, k, lo, hi, clamped = plan_request(s, length, 0, PS, 10_000)
        assert cnt == min(n, budget_pages(s, length))
        assert not clamped
    n, cnt, sink, k, lo, hi, clamped = plan_request(s, 32768, 0, PS, 100)
    assert clamped and k == 100 and cnt == 103 and (lo, hi) == (1, n - 2)


def test_pack_layout_round_trip():
    plan = plan_step([_fixed(8)] * 2, np.array([500, 17]), np.zeros(2), 4, PS, 64)
    layout = packed_layout(max_bs=5, num_kv_heads=4)
    buf = pack(plan, layout)
    for f in REQUEST_FIELDS:
        start, _ = layout[f]
        assert buf[start:start + 2].tolist() == getattr(plan, f).tolist()
    start, _ = layout["row_indptr"]
    assert buf[start:start + 9].tolist() == plan.row_indptr.tolist()


def test_side_table_assign_and_accounting():
    reg = ScheduleRegistry()
    table = ScheduleTable(8, default=reg.get("qwen3-1.7b-0.86"))
    assert table.schedule_of(0).is_dense and table.schedule_of(3).name == "qwen3-1.7b-0.86"
    table.assign(3, dense_schedule(), prompt_len=12)
    assert table.schedule_of(3).is_dense and table.prompt_len[3] == 12
    table.record_step(np.array([3, 3, 0]), np.array([100, 200, 1]))
    assert table.mean_budget_tokens(3) == 150 and table.mean_budget_tokens(5) is None
    with pytest.raises(ValueError, match="row=0"):
        table.assign(0, dense_schedule(), 1)


def test_schedule_from_custom_params():
    reg = ScheduleRegistry()
    default = dense_schedule()
    assert schedule_from_custom_params(None, reg, default) is default
    assert schedule_from_custom_params({"sparrow_schedule": "qwen3-4b-0.86"}, reg, default).name == "qwen3-4b-0.86"
    custom = _fixed(40)
    got = schedule_from_custom_params({"sparrow_schedule_json": dump_schedule(custom)}, reg, default)
    assert got == custom
    with pytest.raises(UnknownScheduleError):
        schedule_from_custom_params({"sparrow_schedule": "nope"}, reg, default)
    json.dumps({"sparrow_schedule_json": dump_schedule(custom)})  # travels as a plain string


def test_plugin_config_from_env():
    assert PluginConfig.from_env({}).topk_cap_tokens == DEFAULT_TOPK_CAP_TOKENS
    cfg = PluginConfig.from_env({"SPARROW_TOPK_CAP_TOKENS": "8192", "SPARROW_DEFAULT_SCHEDULE": "qwen3-1.7b-0.86"})
    assert cfg.topk_cap_tokens == 8192 and cfg.default_schedule == "qwen3-1.7b-0.86"
    assert cfg.topk_cap_pages == 512 and PluginConfig(topk_cap_tokens=40).topk_cap_pages == 2
    assert PluginConfig(topk_cap_tokens=8).topk_cap_pages == 1  # less than a page still selects one
    with pytest.raises(PluginConfigError, match="SPARROW_TOPK_CAP_TOKENS"):
        PluginConfig.from_env({"SPARROW_TOPK_CAP_TOKENS": "x"})
    with pytest.raises(PluginConfigError, match="SPARROW_LANDMARK_DTYPE"):
        PluginConfig.from_env({"SPARROW_LANDMARK_DTYPE": "int8"})
    by_group = PluginConfig.from_env({})  # issue 24: call 36's kernels at a GQA group of 2, call 49's from 4
    assert [by_group.select_variant_for(g) for g in (1, 2, 4, 8)] == ["fused_kvstore_narrow"] * 2 + ["fused_pages_narrow"] * 2
    named = PluginConfig.from_env({"SPARROW_SELECT_VARIANT": "v1"})
    assert named.select_variant_for(2) == named.select_variant_for(4) == "v1"
    with pytest.raises(PluginConfigError, match="SPARROW_SELECT_VARIANT"):
        PluginConfig.from_env({"SPARROW_SELECT_VARIANT": "fast"})
    assert PluginConfig.from_env({}).sub_rows == 1  # off until a served decode measures a rule (call 37)
    assert PluginConfig.from_env({"SPARROW_SUB_ROWS": "4"}).sub_rows == 4
    for bad in ("0", "17", "two"):
        with pytest.raises(PluginConfigError, match=f"SPARROW_SUB_ROWS='?{bad}'?: must"):
            PluginConfig.from_env({"SPARROW_SUB_ROWS": bad})


def test_plugin_imports_without_sglang():
    import sparrow_server.sglang_plugin as plugin

    assert plugin.BACKEND_NAME == "sparrow" and callable(plugin.register)


def test_schedule_from_extra_key_and_request_fallbacks(caplog):
    """The server's extra_key rule (prefix first, a non-empty name after it) on the scheduler side, where
    SGLang has appended the LoRA id; a key the rule refuses is logged and the request runs on the default."""
    from types import SimpleNamespace as NS

    assert schedule_name_from_extra_key("sparrow_schedule=qwen3-4b-0.86") == "qwen3-4b-0.86"
    assert schedule_name_from_extra_key("salt|sparrow_schedule=qwen3-4b-0.86@1") is None  # not first: a cache salt
    assert schedule_name_from_extra_key("salt") is None and schedule_name_from_extra_key(None) is None
    with pytest.raises(ScheduleError, match="names no schedule"):
        schedule_name_from_extra_key("sparrow_schedule=")
    reg, default = ScheduleRegistry(), dense_schedule()
    req = lambda cp, ek, lora_id="0": NS(rid="r", sampling_params=NS(custom_params=cp), extra_key=ek, lora_id=lora_id)
    assert resolve_request_schedule(req(None, "sparrow_schedule=qwen3-8b-0.86"), reg, default).name == "qwen3-8b-0.86"
    with_lora = req(None, "sparrow_schedule=qwen3-8b-0.86" + "9f2c01", lora_id="9f2c01")  # SGLang's Req appends it
    assert resolve_request_schedule(with_lora, reg, default).name == "qwen3-8b-0.86"
    assert client_extra_key(req(None, "sparrow_schedule=v10")) == "sparrow_schedule=v10"  # "0": no LoRA, nothing appended
    for bad in ("salt|sparrow_schedule=qwen3-8b-0.86", "sparrow_schedule="):
        caplog.clear()
        assert resolve_request_schedule(req(None, bad), reg, default) is default
        assert caplog.records and bad in caplog.text
    got = resolve_request_schedule(req({"sparrow_schedule": "qwen3-4b-0.86"}, "sparrow_schedule=qwen3-8b-0.86"), reg, default)
    assert got.name == "qwen3-4b-0.86"  # custom_params wins
    assert resolve_request_schedule(req({"sparrow_schedule": "nope"}, None), reg, default) is default
    assert resolve_request_schedule(req(None, None), reg, default) is default


def test_split_rows_covers_each_row_evenly_and_ends_on_its_last_page():
    """``split_rows``: sub-rows tile each row's pages in order (loads differ by at most a page), the last sub-row of a
    row ends on the row's last page with its length, the others are full, an empty sub-row holds 0 tokens."""
    from sparrow_server.sglang_plugin.scheduler.planning import split_rows

    row_indptr = np.array([0, 256, 259, 259 + 130, 259 + 131], dtype=np.int32)  # 256, 3, 130, 1 pages
    last = np.array([16, 4, 9, 1], dtype=np.int32)
    sub, sub_last = split_rows(row_indptr, last, 4, 16)
    assert sub.dtype == np.int32 and sub.shape == (17,) and sub_last.shape == (16,)
    assert sub[0] == 0 and sub[-1] == row_indptr[-1] and (np.diff(sub) >= 0).all()
    for r in range(4):
        pages = np.diff(sub[4 * r:4 * r + 5])
        assert sub[4 * r] == row_indptr[r] and sub[4 * r + 4] == row_indptr[r + 1]
        assert pages.max() - pages.min() <= 1
        assert sub_last[4 * r + 3] == last[r] and (sub_last[4 * r:4 * r + 3] == 16).all()
    tokens = (np.diff(sub).astype(np.int64) - 1) * 16 + sub_last
    assert tokens.reshape(4, 4).sum(axis=1).tolist() == [256 * 16, 2 * 16 + 4, 129 * 16 + 9, 1]
    assert (tokens == 0).sum() == 4  # the 3-page row's one and the 1-page row's three: 0 tokens each
    with pytest.raises(ValueError, match="parts=0"):
        split_rows(row_indptr, last, 0, 16)


def test_sub_row_plan_puts_an_empty_row_before_the_sub_rows():
    """``sub_row_plan``: ``EMPTY_ROWS`` rows of no page (FlashInfer's graph padding reruns row 0: it must read
    nothing), then ``split_rows``'s sub-rows unchanged."""
    from sparrow_server.sglang_plugin.scheduler.planning import EMPTY_ROWS, split_rows, sub_row_plan

    row_indptr = np.array([0, 256, 259, 389], dtype=np.int32)
    last = np.array([16, 4, 9], dtype=np.int32)
    sub, sub_last = split_rows(row_indptr, last, 2, 16)
    plan, plan_last = sub_row_plan(row_indptr, last, 2, 16)
    assert EMPTY_ROWS >= 1 and plan.dtype == plan_last.dtype == np.int32
    assert plan[:EMPTY_ROWS + 1].tolist() == [0] * (EMPTY_ROWS + 1)  # the empty rows: no page
    assert plan[EMPTY_ROWS:].tolist() == sub.tolist() and plan_last[EMPTY_ROWS:].tolist() == sub_last.tolist()
    tokens = (np.diff(plan).astype(np.int64) - 1).clip(min=0) * 16 + plan_last
    assert tokens[:EMPTY_ROWS].tolist() == [0] * EMPTY_ROWS  # FlashInfer's length of a row of no page: 0
