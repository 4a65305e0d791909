"""CPU tests of ``scheduler.layer_plans`` against a stand-in FlashInfer: every sparse layer ends a step
reading its own group's fields, row pointers and plan arrays, through buffers fixed per batch size
(what a captured CUDA graph reads), and a plan layout that changed since capture stops the step.

The stand-in's decode wrapper keeps FlashInfer's contract where the module relies on it: ``plan`` and
``fast_decode_plan`` write the plan through the pinned staging buffer into the int workspace (here: the
row pointers they were given, so a layer's plan says which group it came from) and return its layout
(``_plan_info``, padded batch first); ``run`` reads ``_int_workspace_buffer``, ``_plan_info`` and
``_paged_kv_indptr_buf`` at call time; a fixed split size needs a tensor-core wrapper (FlashInfer 0.6.15
``decode.py``: "fixed_split_size is only supported by tensor core decode"), and each plan call's split
arguments and the type of its last-page lengths are recorded.
"""
from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
import torch

from sparrow_server.sglang_plugin.scheduler.layer_groups import extra_dense_layers, group_layers, group_plans
from sparrow_server.sglang_plugin.scheduler.planning import REQUEST_FIELDS, plan_step
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

PS, H, PCAP, MAX_BS = 16, 2, 64, 4
LAYERS = (2, 3, 4, 5)
PADDED = 40


def _write_plan(wrapper, indptr_host: torch.Tensor) -> None:
    """The count, then the entries; then the whole padded region goes to the int workspace. A tensor-core
    plan under graphs (``PrefillPlanImpl``) writes only the batch's entries into the staging buffer and no
    validity mask, so what an earlier plan left in the padding is copied too (and run as work);
    a CUDA-core one pads nothing (stand-in: it writes the whole region)."""
    n = indptr_host.numel()
    staged = wrapper._pin_memory_int_workspace_buffer[:(PADDED + 1) * 4].view(torch.int32)
    if not (wrapper.use_tensor_cores and wrapper.is_cuda_graph_enabled):
        staged.zero_()
    staged[0] = n
    staged[1:1 + n] = indptr_host.to(torch.int32)
    wrapper._int_workspace_buffer[:(PADDED + 1) * 4].copy_(wrapper._pin_memory_int_workspace_buffer[:(PADDED + 1) * 4])
    wrapper._plan_info = [wrapper.padded, 0, 0, 0, 0, 0, 0, 0, int(wrapper.is_cuda_graph_enabled), 1]


CALLS: list[dict] = []  # each plan / fast_decode_plan call: wrapper kind, split, last-page lengths' device


def _record(wrapper, how, last_page_len, kwargs) -> None:
    split = {k: kwargs[k] for k in ("fixed_split_size", "disable_split_kv") if k in kwargs}
    if split.get("fixed_split_size") is not None and not wrapper.use_tensor_cores:
        raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
    CALLS.append({"how": how, "tensor_cores": wrapper.use_tensor_cores, "graph": wrapper.is_cuda_graph_enabled,
                  "last_page_len_device": last_page_len.device.type, **split})


class FakeWrapper:
    def __init__(self, workspace, layout, backend="fa2", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None):
        self.use_tensor_cores = use_tensor_cores
        self._float_workspace_buffer = workspace
        self._int_workspace_buffer = torch.zeros(1 << 14, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.zeros(1 << 14, dtype=torch.uint8)
        self.is_cuda_graph_enabled = use_cuda_graph
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._fixed_batch_size = len(paged_kv_last_page_len_buffer) if use_cuda_graph else None
        self._plan_info = None
        self.padded = PADDED

    def plan(self, indptr, indices, last_page_len, *args, **kwargs):
        _record(self, "plan", last_page_len, kwargs)
        if self.is_cuda_graph_enabled:
            assert len(last_page_len) == self._fixed_batch_size
            self._paged_kv_indptr_buf[:indptr.numel()].copy_(indptr)
            self._paged_kv_last_page_len_buf.copy_(last_page_len)
        else:
            self._paged_kv_indptr_buf, self._paged_kv_indices_buf = indptr.clone(), indices
            self._paged_kv_last_page_len_buf = last_page_len.clone()
        _write_plan(self, indptr)

    def forward(self, *args, **kwargs):
        """What FlashInfer's run reads, at call time (a graph bakes these pointers at capture)."""
        region = self._int_workspace_buffer[:(PADDED + 1) * 4].view(torch.int32)
        return region[1:1 + int(region[0])].tolist(), self._paged_kv_indptr_buf, self._plan_info


def fake_fast_decode_plan(self, indptr, indices, last_page_len, *args, global_override_indptr_cpu=None, **kwargs):
    assert self.is_cuda_graph_enabled and len(last_page_len) == self._fixed_batch_size
    _record(self, "fast_decode_plan", last_page_len, kwargs)
    _write_plan(self, global_override_indptr_cpu)


@pytest.fixture
def LP(monkeypatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = FakeWrapper
    fake.fast_decode_plan = fake_fast_decode_plan
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    CALLS.clear()
    monkeypatch.delitem(sys.modules, "sparrow_server.sglang_plugin.scheduler.layer_plans", raising=False)
    module = importlib.import_module("sparrow_server.sglang_plugin.scheduler.layer_plans")
    yield module
    sys.modules.pop("sparrow_server.sglang_plugin.scheduler.layer_plans", None)


def _schedule(name, dense_layers=(0, 1)):
    return Schedule(name=name, budgets_tokens=(8 * PS,), bin_tokens=10**9, dense_layers=dense_layers)


def _step(schedules, lengths):
    plan = plan_step(schedules, np.asarray(lengths), np.zeros(len(lengths)), H, PS, topk_cap_pages=PCAP)
    groups = group_layers([extra_dense_layers(s, LAYERS) for s in schedules], plan.count < plan.n_pages, LAYERS)
    return plan, groups, group_plans(plan, groups)


ARGS = ((2, 1, 8, PS), {"non_blocking": True})


def _check_layers(layers, plans, groups, graph=True):
    for layer in LAYERS:
        want = plans[groups.group_of(layer)]
        decode = layers[layer]
        plan_indptr, indptr_buf, _ = decode.wrapper.forward()
        assert plan_indptr == want.row_indptr.tolist(), layer
        assert indptr_buf.tolist() == decode.row_indptr.tolist() == want.row_indptr.tolist(), layer
        assert indptr_buf is decode.row_indptr or not graph  # eager: FlashInfer's own copy of the same values
        for f in REQUEST_FIELDS:
            assert decode.fields[f].tolist() == getattr(want, f).tolist(), (layer, f)


def test_graph_layers_read_their_own_groups_plan_through_buffers_fixed_at_capture(LP):
    gp = LP.GraphLayerPlans(LAYERS, MAX_BS, H, PCAP, device="cpu")
    workspace = torch.zeros(16, dtype=torch.uint8)
    pad = [dense_schedule()] * 3
    plan, groups, plans = _step(pad, [1, 1, 1])  # capture: padding lanes at the fill length
    gp.capture(3, workspace, plan, *ARGS[:1], ARGS[1])
    captured = gp.step(3, plans, groups, *ARGS[:1], ARGS[1])
    _check_layers(captured, plans, groups)
    pointers = {layer: (d.wrapper._int_workspace_buffer.data_ptr(), d.row_indptr.data_ptr()) for layer, d in
                captured.items()}
    assert len({p for p, _ in pointers.values()}) == len(LAYERS), "each layer reads its own plan copy"

    odd = _schedule("odd", (0, 1, 3, 4))
    for schedules, lengths in (([_schedule("a")] * 3, [900, 700, 1000]),
                               ([_schedule("a"), odd, _schedule("a")], [900, 700, 1000]),
                               ([odd, _schedule("b", (0, 1, 5)), odd], [900, 800, 1000])):
        plan, groups, plans = _step(schedules, lengths)
        layers = gp.step(3, plans, groups, *ARGS[:1], ARGS[1])
        assert layers is captured
        assert {layer: (d.wrapper._int_workspace_buffer.data_ptr(), d.row_indptr.data_ptr())
                for layer, d in layers.items()} == pointers
        _check_layers(layers, plans, groups)
        assert all(d.wrapper._paged_kv_indices_buf is gp.indices for d in layers.values())
        assert layers[2].wrapper._paged_kv_last_page_len_buf.tolist() == plan.last_page_len.tolist()
    assert groups.num_groups == 3 and len(gp.captured[3].slots) == 3


def test_tensor_core_padding_holds_nothing_of_a_larger_batch(LP):
    """Under deterministic inference (tensor cores, graphs) the slots' staging buffers serve every captured
    batch size; a larger batch's entries left in a smaller one's padding would run as work (FlashInfer
    reads them as requests past the batch). The padding is zero: it recomputes row 0, as SGLang's
    fresh per-batch-size buffers do."""
    gp = LP.GraphLayerPlans(LAYERS, MAX_BS, H, PCAP, device="cpu", use_tensor_cores=True)
    for bs in (4, 2):  # SGLang captures the largest batch first
        plan, groups, plans = _step([dense_schedule()] * bs, [1] * bs)
        gp.capture(bs, torch.zeros(16, dtype=torch.uint8), plan, *ARGS[:1], ARGS[1])
    odd = _schedule("odd", (0, 1, 3))
    for bs in (4, 2, 4, 2):
        plan, groups, plans = _step([_schedule("a"), odd, _schedule("a"), odd][:bs], [900, 700, 1000, 800][:bs])
        layers = gp.step(bs, plans, groups, *ARGS[:1], ARGS[1])
        _check_layers(layers, plans, groups)
        for layer, decode in layers.items():
            region = decode.wrapper._int_workspace_buffer[:(PADDED + 1) * 4].view(torch.int32)
            assert not region[2 + bs * H:].any(), (bs, layer, region.tolist())


def test_a_plan_layout_that_changed_since_capture_stops_the_step(LP):
    gp = LP.GraphLayerPlans(LAYERS, MAX_BS, H, PCAP, device="cpu")
    plan, groups, plans = _step([dense_schedule()] * 2, [1, 1])
    gp.capture(2, torch.zeros(16, dtype=torch.uint8), plan, *ARGS[:1], ARGS[1])
    gp.step(2, plans, groups, *ARGS[:1], ARGS[1])
    plan, groups, plans = _step([_schedule("a"), _schedule("odd", (0, 1, 2))], [900, 900])
    gp.captured[2].slots[0].padded = PADDED + 1
    with pytest.raises(RuntimeError, match="layout for batch 2 changed"):
        gp.step(2, plans, groups, *ARGS[:1], ARGS[1])


def test_eager_layers_use_one_wrapper_per_group(LP):
    ep = LP.EagerLayerPlans(torch.zeros(16, dtype=torch.uint8), LAYERS, H, device="cpu")
    odd = _schedule("odd", (0, 1, 3))
    plan, groups, plans = _step([_schedule("a"), odd, _schedule("a")], [900, 700, 1000])
    layers, indices = ep.step(3, plans, groups, *ARGS[:1], ARGS[1])
    _check_layers(layers, plans, groups, graph=False)
    assert layers[3].wrapper is not layers[2].wrapper and layers[2].wrapper is layers[5].wrapper
    assert indices.numel() >= max(p.total_pages for p in plans) and len(ep.wrappers) == 2


def _split_kwargs(split) -> dict:
    return {**ARGS[1], **split.plan_kwargs()}


@pytest.mark.parametrize("deterministic,cores", [(False, False), (False, True), (True, False)],
                         ids=["cuda-core", "tensor-core", "deterministic"])
def test_every_plan_call_gets_the_mode_s_split_and_wrappers(LP, deterministic, cores):
    """What the backend builds from ``determinism.backend_splits``: tensor-core wrappers under deterministic
    inference or where SGLang chose them for its dense decode (``cores``), CUDA-core ones otherwise, and
    every plan -- the capture's, each group's per step, the eager ones -- with that mode's KV split; graph
    steps pass the host last-page lengths (no device -> host copy in tensor-core planning)."""
    from sparrow_server.sglang_plugin.scheduler.determinism import decode_split

    eager, graph = (decode_split(deterministic, g, None, PS, cores) for g in (False, True))
    gp = LP.GraphLayerPlans(LAYERS, MAX_BS, H, PCAP, device="cpu", use_tensor_cores=graph.use_tensor_cores)
    plan, groups, plans = _step([dense_schedule()] * 2, [1, 1])
    gp.capture(2, torch.zeros(16, dtype=torch.uint8), plan, *ARGS[:1], _split_kwargs(graph))
    odd = _schedule("odd", (0, 1, 3))
    plan, groups, plans = _step([_schedule("a"), odd], [900, 700])
    _check_layers(gp.step(2, plans, groups, *ARGS[:1], _split_kwargs(graph)), plans, groups)
    ep = LP.EagerLayerPlans(torch.zeros(16, dtype=torch.uint8), LAYERS, H, device="cpu",
                            use_tensor_cores=eager.use_tensor_cores)
    layers, _ = ep.step(2, plans, groups, *ARGS[:1], _split_kwargs(eager))
    _check_layers(layers, plans, groups, graph=False)
    tensor = deterministic or cores
    want = lambda how, split, g: {"how": how, "tensor_cores": tensor, "graph": g,
                                  "last_page_len_device": "cpu", **split.plan_kwargs()}
    assert CALLS == ([want("plan", graph, True)] + [want("fast_decode_plan", graph, True)] * groups.num_groups
                     + [want("plan", eager, False)] * groups.num_groups)
    assert groups.num_groups == 2 and gp.ws_bytes == LP.workspace_bytes(MAX_BS * H, tensor)


def test_a_fixed_split_on_cuda_core_wrappers_is_refused_as_flashinfer_refuses_it(LP):
    """The stand-in keeps FlashInfer's contract: the eager deterministic split needs tensor-core wrappers."""
    from sparrow_server.sglang_plugin.scheduler.determinism import decode_split

    split = decode_split(True, False, None, PS)
    plan, groups, plans = _step([_schedule("a")] * 2, [900, 700])
    ep = LP.EagerLayerPlans(torch.zeros(16, dtype=torch.uint8), LAYERS, H, device="cpu", use_tensor_cores=False)
    with pytest.raises(ValueError, match="tensor core"):
        ep.step(2, plans, groups, *ARGS[:1], _split_kwargs(split))


def test_a_batch_size_captured_in_sub_rows_plans_each_layers_sub_rows_unsplit_on_tensor_cores(LP):
    """A batch size captured with ``parts`` 2 beside one captured whole: its wrapper is a tensor-core one, every
    plan of it (capture, each group per step) gets the sub-rows of its group's plan after an empty row
    (``sub_row_plan``) unsplit
    (``NO_SPLIT``), whatever split the step passes, and each layer reads its own group's sub-rows through its own
    buffer, its row pointers (the selection's) still the rows'. The whole batch size keeps the step's split."""
    from sparrow_server.sglang_plugin.scheduler.determinism import FLASHINFER_CHOICE, NO_SPLIT
    from sparrow_server.sglang_plugin.scheduler.planning import EMPTY_ROWS, sub_row_plan

    gp = LP.GraphLayerPlans(LAYERS, MAX_BS, H, PCAP, device="cpu", max_parts=4)
    kwargs = _split_kwargs(FLASHINFER_CHOICE)
    for bs, parts in ((4, 2), (2, 1)):
        plan, groups, plans = _step([dense_schedule()] * bs, [1] * bs)
        gp.capture(bs, torch.zeros(16, dtype=torch.uint8), plan, *ARGS[:1], kwargs, parts=parts)
    odd = _schedule("odd", (0, 1, 3))
    plan, groups, plans = _step([_schedule("a"), odd, _schedule("a"), odd], [900, 700, 1000, 33])
    CALLS.clear()
    layers = gp.step(4, plans, groups, *ARGS[:1], kwargs)
    assert groups.num_groups == 2
    for layer, decode in layers.items():
        want = plans[groups.group_of(layer)]
        sub_indptr, sub_last = sub_row_plan(want.row_indptr, want.last_page_len, 2, PS)
        assert len(sub_indptr) == EMPTY_ROWS + 4 * H * 2 + 1 and sub_indptr[EMPTY_ROWS] == 0
        plan_indptr, indptr_buf, _ = decode.wrapper.forward()
        assert decode.parts == 2 and decode.wrapper.use_tensor_cores
        assert plan_indptr == indptr_buf.tolist() == sub_indptr.tolist(), layer
        assert decode.row_indptr.tolist() == want.row_indptr.tolist(), layer
        assert decode.wrapper._paged_kv_last_page_len_buf.tolist() == sub_last.tolist()
        for f in REQUEST_FIELDS:
            assert decode.fields[f].tolist() == getattr(want, f).tolist(), (layer, f)
    assert CALLS == [{"how": "fast_decode_plan", "tensor_cores": True, "graph": True, "last_page_len_device": "cpu",
                      **NO_SPLIT.plan_kwargs()}] * 2
    CALLS.clear()
    plan, groups, plans = _step([_schedule("a"), odd], [900, 700])
    _check_layers(gp.step(2, plans, groups, *ARGS[:1], kwargs), plans, groups)
    assert {c["tensor_cores"] for c in CALLS} == {False} and all(c["disable_split_kv"] is False for c in CALLS)
    assert gp.ws_bytes == LP.workspace_bytes(EMPTY_ROWS + MAX_BS * H * 4, True)
    with pytest.raises(ValueError, match="parts=8"):
        gp.capture(1, torch.zeros(16, dtype=torch.uint8), plan, *ARGS[:1], kwargs, parts=8)
