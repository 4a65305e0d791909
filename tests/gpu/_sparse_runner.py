"""The backend's per-layer sparse decode, outside SGLang (same kernels, same order)."""
from __future__ import annotations

import numpy as np
import torch

from sparrow_server.kernels import sparse_decode as K
from sparrow_server.sglang_plugin.scheduler.planning import REQUEST_FIELDS, StepPlan, pack, packed_layout


class SparseLayer:
    """Plans once (eager FlashInfer plan) and runs select + attend for one layer's pool."""

    def __init__(self, case, plan: StepPlan, landmarks: torch.Tensor, pcap: int, workspace: torch.Tensor):
        import flashinfer

        self.case, self.plan, self.lm = case, plan, landmarks
        b = plan.batch_size
        h = plan.num_kv_heads
        self.h, self.g = h, case.q.shape[1] // h
        layout = packed_layout(b, h)
        self.meta = torch.from_numpy(pack(plan, layout)).cuda()
        view = lambda name, n: self.meta[layout[name][0]:layout[name][0] + n]
        self.fields = {f: view(f, b) for f in REQUEST_FIELDS}
        self.row_indptr = view("row_indptr", b * h + 1)
        self.indices = torch.zeros(max(plan.total_pages, 1), dtype=torch.int32, device="cuda")
        self.scores = torch.full((b * h, pcap), float("-inf"), dtype=torch.float32, device="cuda")
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        self.wrapper.plan(torch.from_numpy(plan.row_indptr), self.indices, torch.from_numpy(plan.last_page_len),
                          self.g, 1, case.q.shape[2], case.page_size, data_type=case.k_buf.dtype,
                          q_data_type=case.q.dtype)
        self.kv = (K.per_head_kv_view(case.k_buf, case.page_size), K.per_head_kv_view(case.v_buf, case.page_size))
        self.out = torch.empty(b * h, self.g, case.q.shape[2], dtype=case.q.dtype, device="cuda")

    def score(self, cache_loc=None):
        """Scores on each row's candidate range (``-inf`` elsewhere, from construction); with
        ``cache_loc``, the landmark of the page each slot completes first (the decode path)."""
        c, f = self.case, self.fields
        return K.page_scores(c.q, self.lm, c.req_to_token, c.rpi, f["cand_lo"], f["cand_hi"], c.page_size,
                             self.scores, k_buf=None if cache_loc is None else c.k_buf, cache_loc=cache_loc)

    def select_write(self):
        c, f = self.case, self.fields
        K.select_and_write(self.scores, c.req_to_token, c.rpi, f["n_pages"], f["count"], f["sink"], f["k"],
                           f["cand_lo"], f["cand_hi"], self.row_indptr, self.h, c.page_size, self.indices)

    def __call__(self, scale: float, cache_loc=None):
        self.score(cache_loc)
        self.select_write()
        return self.wrapper.forward(self.case.q.view(-1, self.g, self.case.q.shape[2]), self.kv, sm_scale=scale)

    def logical_pages(self, ordered: bool = False) -> list:
        """Selected logical pages per (request, KV head) row, read back from the index buffer
        (sets; ``ordered``: lists in index-buffer order)."""
        idx = self.indices.cpu().numpy().astype(np.int64)
        r2t = self.case.req_to_token.cpu().numpy()
        ps, h = self.case.page_size, self.h
        rows = []
        for r in range(self.plan.batch_size * h):
            b = r // h
            start, end = int(self.plan.row_indptr[r]), int(self.plan.row_indptr[r + 1])
            slots = idx[start:end] // h
            assert np.all(idx[start:end] % h == r % h), "page id of the wrong head"
            slot_to_page = {int(r2t[b + 1, j * ps]): j for j in range(int(self.plan.n_pages[b]))}
            pages = [slot_to_page[int(s)] for s in slots]
            rows.append(pages if ordered else set(pages))
        return rows
