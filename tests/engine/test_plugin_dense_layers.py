"""CPU tests of per-request dense layers in the plug-in's planning (``scheduler.layer_groups``).

A request whose schedule keeps one of the server's sparse layers dense is planned dense by budget on
that layer only: its rows there hold all its pages, the other requests' rows and every other layer's
plan are untouched, and CUDA-graph padding rows never start a group.
"""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from sparrow_server.kernels import reference as R
from sparrow_server.sglang_plugin.scheduler.layer_groups import (
    densify, extra_dense_layers, group_layers, group_plans, pack_groups, plan_region_bytes,
)
from sparrow_server.sglang_plugin.scheduler.planning import (
    REQUEST_FIELDS, logical_page_lists, packed_layout, plan_step,
)
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

PS, H = 16, 4
SPARSE_LAYERS = tuple(range(2, 8))  # a server whose default keeps layers 0-1 dense


def _schedule(name, dense_layers=(0, 1), budget_pages=8):
    return Schedule(name=name, budgets_tokens=(budget_pages * PS,), bin_tokens=10**9, dense_layers=dense_layers)


def _plan(schedules, lengths):
    return plan_step(schedules, np.asarray(lengths), np.zeros(len(lengths)), H, PS, topk_cap_pages=256)


def _groups(schedules, plan):
    extra = [extra_dense_layers(s, SPARSE_LAYERS) for s in schedules]
    return group_layers(extra, plan.count < plan.n_pages, SPARSE_LAYERS)


def test_extra_dense_layers_are_the_servers_sparse_layers_the_schedule_keeps_dense():
    assert extra_dense_layers(_schedule("a"), SPARSE_LAYERS) == frozenset()
    assert extra_dense_layers(_schedule("b", (0, 1, 3, 5, 40)), SPARSE_LAYERS) == {3, 5}
    assert extra_dense_layers(_schedule("c", ()), SPARSE_LAYERS) == frozenset()  # fewer: layers 0-1 stay stock
    assert extra_dense_layers(dense_schedule(), SPARSE_LAYERS) == frozenset()    # dense rows on every layer


def test_a_requests_dense_layers_change_only_its_own_rows_on_those_layers():
    base, odd = _schedule("base"), _schedule("odd", (0, 1, 4))
    schedules = [base, odd, base]
    plan = _plan(schedules, [3000, 2000, 1000])
    groups = _groups(schedules, plan)
    assert groups.num_groups == 2
    assert [groups.group_of(layer) for layer in SPARSE_LAYERS] == [0, 0, 1, 0, 0, 0]
    plans = group_plans(plan, groups)
    assert plans[0] is plan
    on4 = plans[1]
    n = plan.n_pages
    assert on4.count.tolist() == [8, int(n[1]), 8] and on4.sink.tolist() == [1, int(n[1]), 1]
    assert on4.k.tolist() == [5, 0, 5] and on4.cand_hi.tolist() == [int(n[0]) - 2, 0, int(n[2]) - 2]
    for f in ("n_pages", "budget_tokens", "last_page_len"):
        assert np.array_equal(getattr(on4, f), getattr(plan, f)), f
    rows = np.diff(on4.row_indptr).reshape(3, H)
    assert rows[:, 0].tolist() == [8, int(n[1]), 8]
    assert np.array_equal(np.diff(plan.row_indptr).reshape(3, H)[[0, 2]], rows[[0, 2]])
    # the request's rows on layer 4 are its pages in order, whatever the scores (k = 0)
    lists = logical_page_lists(on4, np.zeros((3 * H, 8), dtype=np.int64))
    assert all(lists[H + h] == list(range(int(n[1]))) for h in range(H))
    assert lists[0] == logical_page_lists(plan, np.zeros((3 * H, 8), dtype=np.int64))[0]


def test_mixed_batch_groups_layers_by_the_set_of_requests_that_want_them_dense():
    a, b, c = _schedule("a", (0, 1, 3, 4)), _schedule("b", (0, 1, 4, 6)), _schedule("c")
    schedules = [a, b, c, a]
    plan = _plan(schedules, [4000] * 4)
    groups = _groups(schedules, plan)
    want = {2: [], 3: [0, 3], 4: [0, 1, 3], 5: [], 6: [1], 7: []}
    for layer, dense in want.items():
        mask = groups.dense[groups.group_of(layer)]
        assert np.flatnonzero(mask).tolist() == dense, layer
    assert groups.num_groups == 4 and not groups.dense[0].any()
    plans = group_plans(plan, groups)
    for g, p in enumerate(plans):
        assert np.array_equal(p.count, np.where(groups.dense[g], plan.n_pages, plan.count))


def test_requests_within_budget_padding_rows_and_dense_schedules_add_no_group():
    """CUDA-graph padding lanes are row 0 (the ``dense`` schedule) at length 1; a short request is dense
    on every layer already; neither changes any layer's plan."""
    short, dense = _schedule("short", (0, 1, 2, 3, 4, 5, 6, 7)), dense_schedule()
    schedules = [short, dense, _schedule("base"), dense, dense]  # the last two: padding lanes
    plan = _plan(schedules, [100, 5000, 5000, 1, 1])
    groups = _groups(schedules, plan)
    assert groups.num_groups == 1 and groups.group_of_layer.tolist() == [0] * len(SPARSE_LAYERS)
    assert group_plans(plan, groups)[0] is plan


def test_a_dense_by_budget_row_selects_every_page_through_the_kernel_references():
    """The index writer's reference, given a densified plan, writes every page of the request in order
    (the row the dense layer attends), and the other requests' rows exactly as the base plan's."""
    rng = np.random.default_rng(0)
    lengths = [700, 300, 450]
    schedules = [_schedule("s"), _schedule("odd", (0, 1, 5)), _schedule("s")]
    plan = _plan(schedules, lengths)
    on5 = group_plans(plan, _groups(schedules, plan))[_groups(schedules, plan).group_of(5)]
    pages = [math.ceil(n / PS) for n in lengths]
    r2t = torch.zeros(4, max(pages) * PS, dtype=torch.int32)
    phys = rng.permutation(sum(pages)) + 1
    off = 0
    for i, n in enumerate(pages):
        for j in range(n):
            r2t[i + 1, j * PS:(j + 1) * PS] = int(phys[off + j]) * PS + torch.arange(PS)
        off += n
    topk = torch.from_numpy(np.tile(np.arange(2, 2 + 8), (3 * H, 1)))
    rpi = torch.arange(1, 4)

    def written(p):
        out = torch.full((p.total_pages,), -1, dtype=torch.int64)
        fields = {f: torch.from_numpy(getattr(p, f)) for f in REQUEST_FIELDS}
        R.write_indices(topk, r2t, rpi, fields, torch.from_numpy(p.row_indptr), H, PS, out)
        return [out[p.row_indptr[r]:p.row_indptr[r + 1]].tolist() for r in range(3 * H)]

    base_rows, odd_rows = written(plan), written(on5)
    for h in range(H):
        assert odd_rows[H + h] == [int(r2t[2, j * PS]) * H + h for j in range(pages[1])]
        assert odd_rows[h] == base_rows[h] and odd_rows[2 * H + h] == base_rows[2 * H + h]
    assert len(base_rows[H]) == 8 < pages[1]


def test_densify_is_the_identity_without_dense_requests_and_pack_groups_stacks_plans():
    plan = _plan([_schedule("s")] * 2, [900, 40])
    assert densify(plan, np.zeros(2, dtype=bool)) is plan
    layout = packed_layout(max_bs=4, num_kv_heads=H)
    stride = layout["_total"][1]
    both = densify(plan, np.array([True, False]))
    buf = pack_groups([plan, both], layout)
    assert buf.shape == (2 * stride,)
    start, _ = layout["count"]
    assert buf[start:start + 4].tolist() == [8, 3, 0, 0]
    assert buf[stride + start:stride + start + 4].tolist() == [57, 3, 0, 0]
    start, _ = layout["row_indptr"]
    assert buf[stride + start + 2 * H] == 57 * H + 3 * H


@pytest.mark.parametrize("padded", [0, 1, 128, 4224])
def test_plan_region_bound_covers_flashinfer_decode_plan_arrays(padded):
    """Request/tile indices and the output indptr (int32, 16-byte aligned), the chunk size and the
    block-valid mask: the bytes ``DecodePlan`` allocates from the start of the int workspace."""
    def align(x):
        return -(-x // 16) * 16
    used = align(4 * padded) * 2 + align(4 * (padded + 1)) + 4
    used = align(used) + padded
    info = [padded, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert plan_region_bytes(info) >= used
    with pytest.raises(ValueError):
        plan_region_bytes([-1] + info[1:])


@pytest.mark.parametrize("padded,rows", [(264, 1), (264, 264), (4224, 4224), (33000, 16384)])
def test_plan_region_bound_covers_flashinfer_tensor_core_plan_arrays(padded, rows):
    """Deterministic inference plans tensor-core decode with ``PrefillPlan``: request, q-tile and KV-tile
    indices (``padded`` int32), the output indptr (rows + 1), the chunk size, the row count (CUDA graphs),
    the merge indptr (rows + 1) and the block-valid mask (split KV), each aligned as its allocator aligns it."""
    off = 0
    for size, alignment in ((4 * padded, 16), (4 * padded, 16), (4 * padded, 16), (4 * (rows + 1), 16), (4, 1),
                            (4, 16), (4 * (rows + 1), 16), (padded, 16)):
        off = -(-off // alignment) * alignment + size
    info = [padded, rows] + [0] * 13
    assert plan_region_bytes(info, tensor_cores=True) >= off
    if rows == padded:  # as many rows as work items: the decode layout's bound is too small for it
        assert plan_region_bytes(info) < off


def test_the_gpu_case_plans_one_request_dense_on_layers_2_to_4_only(tmp_path):
    """The GPU test's case (``helpers.dense_layers_case``), planned as its server would: the odd schedule
    loads from the schedule dir the schedulers read, and in the mixed batch it makes layers 2-4 (not 5)
    dense by budget for request ``ODD_AT`` alone, which decodes sparsely at those lengths under the base."""
    from helpers import dense_layers_case as D

    from sparrow_server.sparsity.registry import ScheduleRegistry

    odd, base = D.odd_schedule(), ScheduleRegistry().get(D.BASE)
    assert ScheduleRegistry.load(D.write_schedule_dir(tmp_path)).get(D.ODD) == odd
    assert (odd.budgets_tokens, odd.sink_pages, odd.recent_pages) == (base.budgets_tokens, base.sink_pages,
                                                                        base.recent_pages)
    server_sparse = tuple(layer for layer in range(D.NUM_LAYERS) if layer not in dense_schedule().dense_layers)
    ids, names = D.queries()["mixed"]
    assert names.count(D.ODD) == 1 and names[D.ODD_AT] == D.ODD
    schedules = [odd if n == D.ODD else base for n in names]
    for step in (1, D.NEW):
        lengths = [len(p) + step for p in ids]
        plan = plan_step(schedules, np.asarray(lengths), np.asarray([len(p) for p in ids]), 8, PS, 256)
        assert (plan.count < plan.n_pages).all(), "every request must decode sparsely under the base preset"
        groups = group_layers([extra_dense_layers(s, server_sparse) for s in schedules], plan.count < plan.n_pages,
                              server_sparse)
        assert [groups.group_of(layer) for layer in server_sparse] == [1, 1, 1, 0]
        assert np.flatnonzero(groups.dense[1]).tolist() == [D.ODD_AT]
    assert len({len(p) for p in ids}) == len(ids)


def test_the_decode_ceiling_schedule_keeps_no_layer_dense_and_reaches_the_sparse_server(tmp_path):
    """``benchmarks/schedules/qwen3-1.7b-0.86-no-dense-layers.json``: the 0.86 preset's budgets with no
    dense layer, acceptance unmeasured (no threshold), no preset; served by the throughput benchmark as
    its servers' default through a schedule dir, where the plug-in's settings find it and every layer
    of the backend runs sparse; the roofline counts every layer sparse."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import sglang_throughput as T

    from sparrow_server.cost.model_shape import MODEL_PRESETS
    from sparrow_server.cost.roofline import roofline_bytes
    from sparrow_server.sglang_plugin.config import PluginConfig
    from sparrow_server.sparsity.registry import ScheduleRegistry
    from sparrow_server.sparsity.schedule import load_schedule

    path = root / "benchmarks/schedules/qwen3-1.7b-0.86-no-dense-layers.json"
    ceiling, preset = load_schedule(path), ScheduleRegistry().get("qwen3-1.7b-0.86")
    assert ceiling.name == path.stem and ceiling.dense_layers == () and ceiling.threshold is None
    assert ceiling.budgets_tokens == preset.budgets_tokens and not ScheduleRegistry().is_builtin(ceiling.name)
    args = types.SimpleNamespace(schedule_file=str(path), schedule_suffix="0.86")
    assert T.schedule_for("qwen3-1.7b", args) == ceiling
    assert T.schedule_for("qwen3-1.7b", types.SimpleNamespace(schedule_file=None, schedule_suffix="0.86")) == preset
    env = T.schedule_env(ceiling, tmp_path / "schedules")
    config = PluginConfig.from_env(env)
    assert config.default_schedule == ceiling.name and config.server_dense_layers() == ()
    assert "SPARROW_SCHEDULE_DIR" not in T.schedule_env(preset, tmp_path / "unused")
    model = MODEL_PRESETS["qwen3-1.7b"]
    assert roofline_bytes(model, ceiling, 32768, batch=16).ratio > roofline_bytes(model, preset, 32768, batch=16).ratio


def test_side_table_slots_keep_their_schedule():
    """The backend caches each schedule slot's extra dense layers: a slot never changes schedule."""
    from sparrow_server.sglang_plugin.scheduler.side_table import ScheduleTable

    table = ScheduleTable(6, default=_schedule("base"))
    odd = _schedule("odd", (0, 1, 4))
    table.assign(2, odd, 10)
    slot = int(table.schedule_slot[2])
    table.assign(3, _schedule("other", (0, 1, 5)), 10)
    table.assign(2, _schedule("base"), 10)
    assert table.schedule_in(slot) == odd and table.schedule_of(2) == table.schedule_in(int(table.schedule_slot[2]))
