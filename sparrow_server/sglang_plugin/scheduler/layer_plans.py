"""FlashInfer decode plans per sparse layer, so each request's dense layers hold under CUDA graphs.

``layer_groups`` gives each decode step a few groups of sparse layers, each with its own
``StepPlan`` (one group unless a request keeps one of the server's sparse layers dense). What a
layer reads -- its per-request fields, its row pointers and FlashInfer's plan arrays -- is:

- eager (``EagerLayerPlans``): its group's packed plan on the device and one FlashInfer wrapper per
  group, planned per step;
- under CUDA graphs (``GraphLayerPlans``): buffers of its own, fixed at capture. Every sparse layer
  decodes through a *view* of its batch size's wrapper (a shallow copy that reads the layer's row
  pointers and the layer's copy of the plan arrays in the int workspace). Per step: one host ->
  device copy of the layer -> group map and the packed group plans; one FlashInfer plan per group,
  each into its own slot of int workspace with its own pinned staging buffer; then two device
  gathers copy each layer's group fields, row pointers and plan arrays into the layer's buffers.

In CUDA-graph mode FlashInfer's decode plan lays its arrays out by batch size only (``plan_info``:
padded batch, offsets); every group's plan must give the layout captured, which each step checks.
Under deterministic inference the wrappers use tensor cores and every plan gets ``determinism``'s split
(no KV split under graphs, a fixed one eagerly), in ``plan_kwargs``: a row's chunks do not depend on
the batch.
This module reads three private attributes of FlashInfer's decode wrapper (``_int_workspace_buffer``,
``_pin_memory_int_workspace_buffer``, ``_paged_kv_indptr_buf``), the ones ``run`` and ``fast_decode_plan``
read.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, fast_decode_plan

from sparrow_server.sglang_plugin.scheduler.determinism import NO_SPLIT
from sparrow_server.sglang_plugin.scheduler.layer_groups import LayerGroups, pack_groups, plan_region_bytes
from sparrow_server.sglang_plugin.scheduler.planning import (
    EMPTY_ROWS, REQUEST_FIELDS, StepPlan, packed_layout, sub_row_plan,
)

GRID_BOUND = 16384  # above FlashInfer's padded batch (blocks per SM x SMs) on any card we run


def workspace_bytes(max_rows: int, tensor_cores: bool = False) -> int:
    """Int workspace of one plan slot: ``plan_region_bytes`` of the largest padded batch (tensor cores:
    at most one q tile per row plus the batch, ``PrefillSplitQOKVIndptr``'s bound, or the grid)."""
    padded = max(2 * max_rows if tensor_cores else max_rows, GRID_BOUND)
    return plan_region_bytes([padded], tensor_cores)


@dataclass
class LayerDecode:
    """What one sparse layer reads in a step: ``REQUEST_FIELDS`` -> int32 [bs], row pointers, wrapper. ``parts``
    > 1: the wrapper attends each row as that many sub-rows after ``planning.EMPTY_ROWS`` empty rows
    (``planning.sub_row_plan``), whose states the backend merges (``kernels.merge``)."""

    fields: dict
    row_indptr: torch.Tensor
    wrapper: BatchDecodeWithPagedKVCacheWrapper
    parts: int = 1


def _wrapper_batch(rows: int, parts: int) -> int:
    """Rows FlashInfer attends for ``rows`` (request, KV head) rows in ``parts`` sub-rows each."""
    return rows if parts == 1 else EMPTY_ROWS + rows * parts


def _meta_host(plans: list[StepPlan], groups: LayerGroups, layout, sub_rows=None) -> np.ndarray:
    return np.concatenate([groups.group_of_layer.astype(np.int32), pack_groups(plans, layout, sub_rows)])


def _region(buf: torch.Tensor, layout, name: str, n: int) -> torch.Tensor:
    start, _ = layout[name]
    return buf[start:start + n]


def _views(buf: torch.Tensor, layout, bs: int, rows: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(fields [bs], row_indptr [rows + 1], last_page_len [rows]) of one packed plan ``buf``."""
    at = lambda name, n: _region(buf, layout, name, n)  # noqa: E731
    return {f: at(f, bs) for f in REQUEST_FIELDS}, at("row_indptr", rows + 1), at("last_page_len", rows)


class EagerLayerPlans:
    """Without CUDA graphs: one wrapper per group (made on first use), each planned per step."""

    def __init__(self, workspace: torch.Tensor, layers: tuple[int, ...], num_kv_heads: int, device: str = "cuda",
                 use_tensor_cores: bool = False):
        self.workspace, self.layers, self.num_kv_heads, self.device = workspace, layers, num_kv_heads, device
        self.use_tensor_cores = use_tensor_cores
        self.wrappers: list[BatchDecodeWithPagedKVCacheWrapper] = []

    def _wrapper(self, g: int) -> BatchDecodeWithPagedKVCacheWrapper:
        while len(self.wrappers) <= g:
            self.wrappers.append(BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2",
                                                                    use_tensor_cores=self.use_tensor_cores))
        return self.wrappers[g]

    def step(self, bs: int, plans: list[StepPlan], groups: LayerGroups, plan_args, plan_kwargs):
        """(layer id -> LayerDecode, indices buffer) of one eager step."""
        rows, layout = bs * self.num_kv_heads, packed_layout(bs, self.num_kv_heads)
        stride, n_layers = layout["_total"][1], len(self.layers)
        meta = torch.empty(n_layers + len(plans) * stride, dtype=torch.int32, device=self.device)
        meta.copy_(torch.from_numpy(_meta_host(plans, groups, layout)), non_blocking=True)
        indices = torch.empty(max(max(p.total_pages for p in plans), 1), dtype=torch.int32, device=self.device)
        per_group = []
        for g, p in enumerate(plans):
            fields, row_indptr, _ = _views(meta[n_layers + g * stride:], layout, bs, rows)
            wrapper = self._wrapper(g)
            wrapper.plan(torch.from_numpy(p.row_indptr), indices, torch.from_numpy(p.last_page_len), *plan_args,
                         **plan_kwargs)
            per_group.append(LayerDecode(fields, row_indptr, wrapper))
        return {layer: per_group[int(g)] for layer, g in zip(self.layers, groups.group_of_layer)}, indices


@dataclass
class _Captured:
    wrapper: BatchDecodeWithPagedKVCacheWrapper
    layers: dict            # layer id -> LayerDecode, reading the layer's own buffers
    slots: list             # group -> planning view of ``wrapper`` (its own int workspace slot)
    plan_info: list | None  # FlashInfer's plan layout at capture
    parts: int = 1          # sub-rows a row
    tensor_cores: bool = False
    sub_kwargs: dict | None = None  # sub-rows: the plan's keywords, unsplit on tensor cores; else each step's own


class GraphLayerPlans:
    """Under CUDA graphs: per-layer buffers read by the captured graphs, filled per step. A batch size captured
    with ``parts`` > 1 attends each row as sub-rows on tensor cores, unsplit (``NO_SPLIT``: a plan a graph holds)."""

    def __init__(self, layers: tuple[int, ...], max_bs: int, num_kv_heads: int, pcap: int, device: str = "cuda",
                 use_tensor_cores: bool = False, max_parts: int = 1):
        self.layers, self.num_kv_heads, self.device = layers, num_kv_heads, torch.device(device)
        self.use_tensor_cores, self.max_parts = use_tensor_cores, max_parts
        dev = self.device
        n_layers = len(layers)
        self.layout = packed_layout(max_bs, num_kv_heads, max_parts)
        self.stride = self.layout["_total"][1]
        self.max_groups = n_layers + 1
        self.meta = torch.zeros(n_layers + self.max_groups * self.stride, dtype=torch.int32, device=dev)
        self.group_of_layer = self.meta[:n_layers]
        self.groups = self.meta[n_layers:].view(self.max_groups, self.stride)
        self.layer_meta = torch.zeros(n_layers, self.stride, dtype=torch.int32, device=dev)
        self.ws_bytes = workspace_bytes(max_bs * num_kv_heads, use_tensor_cores)
        if max_parts > 1:
            self.ws_bytes = max(self.ws_bytes, workspace_bytes(_wrapper_batch(max_bs * num_kv_heads, max_parts), True))
        self.slot_ws = torch.zeros(self.max_groups, self.ws_bytes, dtype=torch.uint8, device=dev)
        self.layer_ws = torch.zeros(n_layers, self.ws_bytes, dtype=torch.uint8, device=dev)
        self.slot_pinned: list[torch.Tensor] = []
        self.indices = torch.zeros(max_bs * num_kv_heads * pcap, dtype=torch.int32, device=dev)
        self.captured: dict[int, _Captured] = {}

    @staticmethod
    def _wrapper_rows(plan: StepPlan, parts: int, page_size: int):
        """(region names, (pointers, last-page lengths) on the host) of the rows FlashInfer attends."""
        if parts == 1:
            return ("row_indptr", "last_page_len"), (plan.row_indptr, plan.last_page_len)
        return ("sub_indptr", "sub_last_page_len"), sub_row_plan(plan.row_indptr, plan.last_page_len, parts, page_size)

    def capture(self, bs: int, workspace: torch.Tensor, plan: StepPlan, plan_args, plan_kwargs,
                parts: int = 1) -> None:
        """Make batch size ``bs``'s wrapper and every layer's view of it (before its graph is captured)."""
        if not 1 <= parts <= self.max_parts:
            raise ValueError(f"parts={parts}: must be in [1, {self.max_parts}]")
        rows = bs * self.num_kv_heads
        n = _wrapper_batch(rows, parts)
        (indptr_name, last_name), (indptr, last) = self._wrapper_rows(plan, parts, plan_args[3])
        tensor_cores = self.use_tensor_cores or parts > 1
        sub_kwargs = {**plan_kwargs, **NO_SPLIT.plan_kwargs()} if parts > 1 else None
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", backend="fa2", use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=_region(self.groups[0], self.layout, indptr_name, n + 1),
            paged_kv_indices_buffer=self.indices,
            paged_kv_last_page_len_buffer=_region(self.groups[0], self.layout, last_name, n))
        wrapper.plan(torch.from_numpy(indptr), self.indices[:max(plan.total_pages, 1)], torch.from_numpy(last),
                     *plan_args, **(sub_kwargs or plan_kwargs))
        layers = {}
        for i, layer in enumerate(self.layers):
            fields, layer_indptr, _ = _views(self.layer_meta[i], self.layout, bs, rows)
            view = copy.copy(wrapper)
            view._int_workspace_buffer = self.layer_ws[i]
            view._paged_kv_indptr_buf = (layer_indptr if parts == 1 else
                                         _region(self.layer_meta[i], self.layout, indptr_name, n + 1))
            layers[layer] = LayerDecode(fields, layer_indptr, view, parts)
        self.captured[bs] = _Captured(wrapper, layers, [], None, parts, tensor_cores, sub_kwargs)

    def _slot(self, cap: _Captured, g: int) -> BatchDecodeWithPagedKVCacheWrapper:
        while len(self.slot_pinned) <= g:
            self.slot_pinned.append(torch.zeros(self.ws_bytes, dtype=torch.uint8,
                                                pin_memory=self.device.type == "cuda"))
        while len(cap.slots) <= g:
            view = copy.copy(cap.wrapper)
            view._int_workspace_buffer = self.slot_ws[len(cap.slots)]
            view._pin_memory_int_workspace_buffer = self.slot_pinned[len(cap.slots)]
            cap.slots.append(view)
        return cap.slots[g]

    def step(self, bs: int, plans: list[StepPlan], groups: LayerGroups, plan_args, plan_kwargs) -> dict:
        """Fill every layer's buffers for this step; returns layer id -> LayerDecode (fixed per ``bs``)."""
        cap = self.captured[bs]
        if len(plans) > self.max_groups:
            raise RuntimeError(f"sparrow: {len(plans)} plan groups, at most {self.max_groups}")
        n_rows = _wrapper_batch(bs * self.num_kv_heads, cap.parts)  # the rows FlashInfer attends
        wrapper_rows = [self._wrapper_rows(p, cap.parts, plan_args[3]) for p in plans]
        sub_rows = [host for _, host in wrapper_rows] if cap.parts > 1 else None
        host = _meta_host(plans, groups, self.layout, sub_rows)
        self.meta[:host.size].copy_(torch.from_numpy(host), non_blocking=True)
        for g, ((indptr_name, _), (indptr, last)) in enumerate(wrapper_rows):
            slot = self._slot(cap, g)
            if cap.tensor_cores:
                self._clear_padding(cap, g)
            # Under graphs FlashInfer reads the last-page lengths from the buffer the copy above filled; the
            # host array gives their count, and tensor-core planning reads it (no device -> host copy).
            # ``plan_kwargs`` holds the KV split (``determinism.DecodeSplit.plan_kwargs``); sub-rows: unsplit.
            fast_decode_plan(slot, _region(self.groups[g], self.layout, indptr_name, n_rows + 1), self.indices,
                             torch.from_numpy(last), *plan_args, global_override_indptr_cpu=torch.from_numpy(indptr),
                             **(cap.sub_kwargs or plan_kwargs))
            self._check_layout(cap, slot._plan_info, bs)
        n = plan_region_bytes(cap.plan_info, cap.tensor_cores)
        if n > self.ws_bytes:
            raise RuntimeError(f"sparrow: FlashInfer's decode plan needs {n} bytes, the slots hold {self.ws_bytes}")
        torch.index_select(self.groups, 0, self.group_of_layer, out=self.layer_meta)
        self.layer_ws[:, :n].copy_(torch.index_select(self.slot_ws[:, :n], 0, self.group_of_layer))
        return cap.layers

    def _clear_padding(self, cap: _Captured, g: int) -> None:
        """FlashInfer's tensor-core plan under graphs pads its work list (``PrefillSplitQOKVIndptr``: the
        larger of the tiles and the split grid) with no validity mask unless it splits KV, and writes only
        the batch's entries. This slot's pinned staging buffer is shared by every captured batch size, so a
        larger batch's entries would stay in the padding and be run as work (rows past this batch: reads
        and writes out of range). Zeroed, the padding recomputes row 0 into its own place, as SGLang's
        fresh per-batch-size buffers do; in a sub-row plan row 0 is empty (``planning.sub_row_plan``)."""
        n = plan_region_bytes(cap.plan_info, True) if cap.plan_info is not None else self.ws_bytes
        self.slot_pinned[g][:n].zero_()

    @staticmethod
    def _check_layout(cap: _Captured, info, bs: int) -> None:
        got = [int(x) for x in info]
        if cap.plan_info is None:  # the capture's first plan: every layer's view runs with it
            cap.plan_info = got
            for decode in cap.layers.values():
                decode.wrapper._plan_info = info
        elif got != cap.plan_info:
            raise RuntimeError(f"sparrow: FlashInfer's decode plan layout for batch {bs} changed since capture "
                               f"({got} vs {cap.plan_info}); per-layer plans cannot be copied")


__all__ = ["EagerLayerPlans", "GraphLayerPlans", "LayerDecode", "workspace_bytes"]
