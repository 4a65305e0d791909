"""Per-request dense layers, planned on the host: which sparse layers need which plan this step.

Pure numpy, no SGLang or GPU. The server's sparse layers (those not dense in its default schedule)
run the block-sparse path for every request. A request whose schedule keeps one of them dense gets
it **dense by budget**: on that layer its rows attend all their pages (``count = sink = n``, ``k = 0``,
no candidates), which the selection kernel already writes as pages ``0..n-1`` in order. No other
kernel path, so CUDA graphs stay valid: a layer's page counts are buffer contents, not shapes.

Row lengths are FlashInfer's plan, so a layer whose counts differ needs its own plan. Layers are
grouped by the set of requests planned dense on them (``group_layers``): group 0 is the step's base
plan (every request at its budget), and each distinct non-empty set adds one group, usually none.
``group_plans`` gives each group's ``StepPlan``; the backend plans FlashInfer once per group and
gives every layer its group's fields, row pointers and plan (``group_of_layer``).

A request asks for a layer dense only where it is sparse this step (a sequence within its budget
is dense on every layer already, and adds no group). The ``dense`` schedule has no extra dense
layers: its rows are dense on every layer. A schedule that keeps *fewer* layers dense than the
server's default runs those layers dense (the server's stock path): never less accurate.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from sparrow_server.sglang_plugin.scheduler.planning import StepPlan, pack, packed_layout
from sparrow_server.sparsity.schedule import Schedule


def extra_dense_layers(schedule: Schedule, sparse_layers: Iterable[int]) -> frozenset[int]:
    """The server's sparse layers that ``schedule`` keeps dense (empty for the ``dense`` schedule,
    whose rows attend every page on every layer anyway)."""
    if schedule.is_dense:
        return frozenset()
    return frozenset(schedule.dense_layers) & frozenset(sparse_layers)


@dataclass(frozen=True)
class LayerGroups:
    """Grouping of one step's sparse layers by the requests planned dense on them.

    ``layers``: the server's sparse layer ids, in order (index ``i`` is layer ``layers[i]``).
    ``group_of_layer``: int32 [L], each layer's group. ``dense``: bool [G, B], the requests planned
    dense in each group; ``dense[0]`` is all False (the base plan).
    """

    layers: tuple[int, ...]
    group_of_layer: np.ndarray
    dense: np.ndarray

    @property
    def num_groups(self) -> int:
        return int(self.dense.shape[0])

    def group_of(self, layer: int) -> int:
        return int(self.group_of_layer[self.layers.index(layer)])


def group_layers(extra: Sequence[frozenset[int]], sparse_now: np.ndarray, layers: Sequence[int]) -> LayerGroups:
    """Group ``layers`` by the set of requests planned dense on them.

    ``extra[b]``: request ``b``'s extra dense layers (``extra_dense_layers``); ``sparse_now[b]``:
    whether its plan attends fewer pages than it has (``count < n_pages``)."""
    sparse_now = np.asarray(sparse_now, dtype=bool)
    if len(extra) != sparse_now.shape[0]:
        raise ValueError(f"{len(extra)} requests' dense layers for {sparse_now.shape[0]} requests")
    group_of_layer = np.zeros(len(layers), dtype=np.int32)
    if not any(e for e, s in zip(extra, sparse_now.tolist()) if s):  # the usual step: one group, no per-layer work
        return LayerGroups(tuple(layers), group_of_layer, np.zeros((1, sparse_now.shape[0]), dtype=bool))
    masks = [np.zeros(sparse_now.shape[0], dtype=bool)]
    index: dict[bytes, int] = {masks[0].tobytes(): 0}
    for i, layer in enumerate(layers):
        mask = sparse_now & np.fromiter((layer in e for e in extra), dtype=bool, count=len(extra))
        key = mask.tobytes()
        if key not in index:
            index[key] = len(masks)
            masks.append(mask)
        group_of_layer[i] = index[key]
    return LayerGroups(tuple(layers), group_of_layer, np.stack(masks))


def densify(plan: StepPlan, dense: np.ndarray) -> StepPlan:
    """``plan`` with the requests in ``dense`` attending every page (``count = sink = n``, ``k = 0``,
    no candidates); the others' fields unchanged. Row pointers are recomputed; the last-page lengths
    and the accounting (``budget_tokens``: what the request's sparse layers attend) are the plan's."""
    dense = np.asarray(dense, dtype=bool)
    if not dense.any():
        return plan
    n = plan.n_pages
    zero = np.zeros_like(n)
    count = np.where(dense, n, plan.count).astype(np.int32)
    row_count = np.repeat(count.astype(np.int64), plan.num_kv_heads)
    row_indptr = np.concatenate([[0], np.cumsum(row_count)]).astype(np.int32)
    return replace(plan, count=count, sink=np.where(dense, n, plan.sink).astype(np.int32),
                   k=np.where(dense, zero, plan.k).astype(np.int32),
                   cand_lo=np.where(dense, zero, plan.cand_lo).astype(np.int32),
                   cand_hi=np.where(dense, zero, plan.cand_hi).astype(np.int32), row_indptr=row_indptr)


def group_plans(plan: StepPlan, groups: LayerGroups) -> list[StepPlan]:
    """One ``StepPlan`` per group: group 0 is ``plan`` itself."""
    if groups.num_groups == 1:
        return [plan]
    return [densify(plan, mask) for mask in groups.dense]


def pack_groups(plans: Sequence[StepPlan], layout: dict[str, tuple[int, int]],
                sub_rows: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> np.ndarray:
    """The groups' packed plans back to back, each ``layout["_total"][1]`` int32 long (``sub_rows``: each
    group's ``planning.sub_row_plan``)."""
    subs = [None] * len(plans) if sub_rows is None else sub_rows
    if len(plans) == 1:
        return pack(plans[0], layout, subs[0])
    return np.concatenate([pack(p, layout, sub) for p, sub in zip(plans, subs)])


def group_layout(max_bs: int, num_kv_heads: int) -> dict[str, tuple[int, int]]:
    """Layout of one group's packed plan (``planning.packed_layout``); groups follow each other."""
    return packed_layout(max_bs, num_kv_heads)


# FlashInfer's decode plan (``DecodePlan`` in ``attention/scheduler.cuh``) writes, from offset 0 of the
# wrapper's int workspace: request indices, KV tile indices, output indptr (``padded_batch_size`` (+1)
# int32 each, 16-byte aligned), the chunk size (one int32) and, with split-KV, a block-valid mask (one
# byte per padded row). Tensor-core decode (deterministic inference) plans with ``PrefillPlan``: request,
# q-tile and KV-tile indices (``padded`` int32 each), the output indptr (rows + 1), the chunk size, under
# CUDA graphs the row count, and with split-KV the merge indptr (rows + 1) and the block-valid mask;
# rows <= padded. ``plan_info[0]`` is ``padded_batch_size`` in both.
PLAN_INFO_PADDED_BATCH = 0


def plan_region_bytes(plan_info: Sequence[int], tensor_cores: bool = False) -> int:
    """Bytes at the start of a FlashInfer decode wrapper's int workspace that hold its plan: an upper
    bound of ``3 * 4 * (padded + 1) + 4 + padded`` (decode) or ``5 * 4 * (padded + 1) + 8 + padded``
    (tensor cores) plus the alignment padding of up to eight arrays."""
    padded = int(plan_info[PLAN_INFO_PADDED_BATCH])
    if padded < 0:
        raise ValueError(f"plan_info={list(plan_info)}: padded batch size {padded} < 0")
    return (24 if tensor_cores else 16) * (padded + 1) + 256


__all__ = ["LayerGroups", "extra_dense_layers", "group_layers", "densify", "group_plans", "pack_groups",
           "group_layout", "plan_region_bytes"]
