"""The backend's per-layer sparse decode, outside SGLang (same kernels, same order)."""
from __future__ import annotations

import torch

from helpers.sparse_case import SparseSelection
from sparrow_server.kernels import sparse_decode as K
from sparrow_server.sglang_plugin.scheduler.planning import StepPlan


class SparseLayer(SparseSelection):
    """Plans once (eager FlashInfer plan) and runs select + attend for one layer's pool."""

    def __init__(self, case, plan: StepPlan, landmarks: torch.Tensor, pcap: int, workspace: torch.Tensor,
                 variant: str | None = None):
        import flashinfer

        super().__init__(K, case, plan, landmarks, pcap, variant)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        self.wrapper.plan(torch.from_numpy(plan.row_indptr), self.indices, torch.from_numpy(plan.last_page_len),
                          self.g, 1, case.q.shape[2], case.page_size, data_type=case.k_buf.dtype,
                          q_data_type=case.q.dtype)
        self.kv = (K.per_head_kv_view(case.k_buf, case.page_size), K.per_head_kv_view(case.v_buf, case.page_size))
        self.out = torch.empty(plan.batch_size * self.h, self.g, case.q.shape[2], dtype=case.q.dtype, device="cuda")

    def __call__(self, scale: float, cache_loc=None):
        self.score(cache_loc)
        self.select_write()
        return self.wrapper.forward(self.case.q.view(-1, self.g, self.case.q.shape[2]), self.kv, sm_scale=scale)
