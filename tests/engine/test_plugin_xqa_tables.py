"""The XQA decode's inputs from the sparse plan (``scheduler/xqa_decode.py``), on CPU: the block table holds each
(request, KV head) row's page ids in the index buffer's order, and the lengths are the tokens FlashInfer's plan
attends (its pages, the last one ``last_page_len`` long), for rows of unequal counts."""
from __future__ import annotations

import numpy as np
import torch

from sparrow_server.sglang_plugin.scheduler import xqa_decode
from sparrow_server.sglang_plugin.scheduler.planning import plan_step
from sparrow_server.sparsity.registry import ScheduleRegistry


def _plan():
    lengths = np.array([40_000, 3_001, 17, 20_480])  # past the budget, under it, two pages, a full last page
    return plan_step([ScheduleRegistry().get("qwen3-1.7b-0.86")] * 4, lengths, np.zeros_like(lengths), 8, 16, 320)


def test_block_table_rows_hold_each_rows_pages_in_order_then_page_zero():
    plan = _plan()
    indptr = torch.from_numpy(plan.row_indptr)
    indices = torch.arange(1, int(indptr[-1]) + 1, dtype=torch.int32) * 7  # distinct, none 0
    width = int(plan.count.max())
    table = xqa_decode.block_table(indices, indptr, width)
    assert table.shape == (len(indptr) - 1, width) and table.dtype == torch.int32
    for r in range(len(indptr) - 1):
        start, end = int(indptr[r]), int(indptr[r + 1])
        assert table[r, :end - start].tolist() == indices[start:end].tolist()
        assert not table[r, end - start:].any()
    assert len(set(np.diff(plan.row_indptr).tolist())) > 1  # rows of unequal counts were checked


def test_seq_lens_are_the_tokens_flashinfer_attends():
    plan = _plan()
    lens = xqa_decode.seq_lens(torch.from_numpy(plan.row_indptr), torch.from_numpy(plan.last_page_len), 16)
    assert lens.shape == (len(plan.row_indptr) - 1, 1) and lens.dtype == torch.uint32
    pages = np.diff(plan.row_indptr)
    want = (pages - 1) * 16 + plan.last_page_len
    assert lens.view(torch.int32)[:, 0].tolist() == want.tolist()
    assert want[2 * 8] == 17 and want[3 * 8] % 16 == 0  # the two-page row: its 17 tokens; the full last page
