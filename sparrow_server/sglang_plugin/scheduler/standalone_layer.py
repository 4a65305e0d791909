"""The backend's per-layer block-sparse decode outside SGLang, on a random paged KV pool: the same
kernels in the same order (landmark scoring, top-k + index writing, FlashInfer decode over per-head
page lists on SGLang's token-major pool). For the kernel benchmark (``benchmarks/sparse_kernel_bench.py``)
and the kernel tests (GPU, and CPU under the Triton interpreter, which pass their own copy of
``sparse_decode``). Imports FlashInfer only where a ``SparseLayer`` is built."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sparrow_server.sglang_plugin.scheduler.determinism import FLASHINFER_CHOICE, DecodeSplit
from sparrow_server.sglang_plugin.scheduler.planning import (EMPTY_ROWS, REQUEST_FIELDS, StepPlan, pack, packed_layout,
                                                           plan_step, sub_row_plan)
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.sparsity.selection import select_pages


@dataclass
class PagedCase:
    q: torch.Tensor            # [B, H*G, D]
    k_buf: torch.Tensor        # [N, H, D] token-major pool (SGLang layout)
    v_buf: torch.Tensor
    req_to_token: torch.Tensor  # [B + 1, max_ctx] int32 (row 0 = padding row)
    rpi: torch.Tensor          # [B] int64 rows 1..B
    lengths: torch.Tensor      # [B] int64 (CPU)
    page_size: int

    def dense_kv(self):
        """[B, Lmax, H, D] K and V gathered per request (zero past each length)."""
        b = self.q.shape[0]
        lmax = int(self.lengths.max())
        slots = self.req_to_token[1:b + 1, :lmax].long()
        k, v = self.k_buf[slots], self.v_buf[slots]
        mask = (torch.arange(lmax, device=k.device)[None, :] < self.lengths.to(k.device)[:, None])[..., None, None]
        return k * mask, v * mask


PLACEMENTS = ("random", "contiguous", "interleaved")


def _page_order(pages: list[int], placement: str, g: torch.Generator) -> torch.Tensor:
    """Pool page (less one: page 0 pads) of each request's pages, requests in turn, each in logical order."""
    total = sum(pages)
    order = torch.randperm(total, generator=g)  # drawn either way: every placement gets the same keys and queries
    if placement == "contiguous":
        return torch.arange(total)
    if placement == "interleaved":  # page j of every request before page j + 1 of any, as lock-step decode allocates
        turn = torch.cat([torch.arange(n) * len(pages) + i for i, n in enumerate(pages)])
        return torch.argsort(torch.argsort(turn))
    return order


def make_case(lengths, num_kv_heads=8, group=2, head_dim=128, page_size=16, max_ctx=None, seed=0,
              dtype=torch.bfloat16, device="cuda", placement: str = "random") -> PagedCase:
    """``lengths`` requests over a pool of exactly their pages (page 0 the padding page), random keys, values and
    queries. ``placement``: where each request's pages lie in the pool: ``random`` (shuffled across it, as a server's
    free list leaves them after churn), ``contiguous`` (each request's in order, back to back: a fresh server's
    prefill) or ``interleaved`` (page by page across the batch: a rollout's pages, allocated as its requests decode)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}: one of {PLACEMENTS}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    b = lengths.shape[0]
    pages = [math.ceil(int(n) / page_size) for n in lengths]
    max_ctx = max_ctx or max(pages) * page_size
    total = sum(pages)
    phys = (_page_order(pages, placement, g) + 1).tolist()  # page 0 stays the padding page
    r2t = torch.zeros(b + 1, max_ctx, dtype=torch.int32)
    off = 0
    for i, n in enumerate(pages):
        for j in range(n):
            r2t[i + 1, j * page_size:(j + 1) * page_size] = phys[off + j] * page_size + torch.arange(page_size)
        off += n
    n_slots = (total + 1) * page_size
    k_buf = torch.randn(n_slots, num_kv_heads, head_dim, generator=g).to(dtype)
    v_buf = torch.randn(n_slots, num_kv_heads, head_dim, generator=g).to(dtype)
    q = torch.randn(b, num_kv_heads * group, head_dim, generator=g).to(dtype)
    return PagedCase(q.to(device), k_buf.to(device), v_buf.to(device), r2t.to(device),
                     torch.arange(1, b + 1, dtype=torch.int64, device=device), lengths, page_size)


def fixed_budget_schedule(budget_pages: int, page_size: int = 16, sink: int = 1, recent: int = 2) -> Schedule:
    """A schedule whose budget is ``budget_pages`` at every length (no dense layers)."""
    return Schedule(name=f"fixed-{budget_pages}", budgets_tokens=(budget_pages * page_size,), bin_tokens=10**9,
                    page_size=page_size, sink_pages=sink, recent_pages=recent, dense_layers=())


def plan_for(case: PagedCase, schedules, topk_cap_pages: int) -> StepPlan:
    lengths = case.lengths.numpy()
    return plan_step(list(schedules), lengths, np.zeros_like(lengths), case.k_buf.shape[1], case.page_size,
                     topk_cap_pages)


class SparseSelection:
    """One layer's page selection as the backend runs it: the plan packed into one int32 buffer,
    a score buffer [B*H, Pcap] (``-inf``) and the index buffer, filled by ``kernels`` (the
    ``sparse_decode`` module: the real one, or a copy loaded under the Triton interpreter), on the
    case's device."""

    def __init__(self, kernels, case: PagedCase, plan: StepPlan, landmarks: torch.Tensor, pcap: int,
                 variant: str | None = None, landmark_scales: torch.Tensor | None = None):
        self.K, self.case, self.plan, self.lm = kernels, case, plan, landmarks
        self.lm_scales = landmark_scales  # float8 landmarks' (kernels.reference.store_landmarks)
        self.variant = variant  # ``sparse_decode.SELECT_VARIANTS``; None: the module's default
        b, h = plan.batch_size, plan.num_kv_heads
        device = case.q.device
        self.h, self.g = h, case.q.shape[1] // h
        layout = packed_layout(b, h)
        self.meta = torch.from_numpy(pack(plan, layout)).to(device)
        view = lambda name, n: self.meta[layout[name][0]:layout[name][0] + n]
        self.fields = {f: view(f, b) for f in REQUEST_FIELDS}
        self.row_indptr = view("row_indptr", b * h + 1)
        self.indices = torch.zeros(max(plan.total_pages, 1), dtype=torch.int32, device=device)
        self.scores = torch.full((b * h, pcap), float("-inf"), dtype=torch.float32, device=device)

    def score(self, cache_loc=None):
        """Scores on each row's candidate range (the rest of the buffer untouched); with
        ``cache_loc``, the landmark of the page each slot completes first (the decode path)."""
        c, f = self.case, self.fields
        return self.K.page_scores(c.q, self.lm, c.req_to_token, c.rpi, f["cand_lo"], f["cand_hi"], c.page_size,
                                  self.scores, k_buf=None if cache_loc is None else c.k_buf, cache_loc=cache_loc,
                                  variant=self.variant, landmark_scales=self.lm_scales)

    def select_write(self):
        c, f = self.case, self.fields
        self.K.select_and_write(self.scores, c.req_to_token, c.rpi, f["n_pages"], f["count"], f["sink"], f["k"],
                                f["cand_lo"], f["cand_hi"], self.row_indptr, self.h, c.page_size, self.indices,
                                variant=self.variant)

    def select(self, cache_loc=None):
        """Score and select as the backend does (``score_and_select``: one launch for a fused variant)."""
        c = self.case
        self.K.score_and_select(c.q, self.lm, c.req_to_token, c.rpi, self.fields, self.row_indptr, c.page_size,
                                self.scores, self.indices, k_buf=None if cache_loc is None else c.k_buf,
                                cache_loc=cache_loc, variant=self.variant, landmark_scales=self.lm_scales)

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

    def want_pages(self, sink: int, recent: int) -> list:
        """``select_pages`` on the current score buffer: [B*H] lists of logical pages, ascending
        (sink, top-k, recent: the order the index buffer must hold them in)."""
        b, h = self.plan.batch_size, self.h
        scores = self.scores.view(b, h, -1)[:, :, :int(self.plan.n_pages.max())].cpu()
        ids, _ = select_pages(scores, torch.from_numpy(self.plan.n_pages.astype("int64")),
                              torch.from_numpy(self.plan.count.astype("int64")), sink, recent)
        return [[int(p) for p in row if p >= 0] for row in ids.view(b * h, -1).tolist()]


class SparseLayer(SparseSelection):
    """Plans once (eager FlashInfer plan) and runs select + attend for one layer's pool, on the
    kernel and KV split the server would plan (``split``: FlashInfer's CUDA-core decode and its own split unless
    given, as outside deterministic inference at a GQA group under 4). ``parts`` > 1: each row's pages as that many
    sub-rows after the empty row(s) the server plans (``planning.sub_row_plan``), each attended by FlashInfer at
    ``split`` on its own copy of the row's query, their partial states (outputs in the query's dtype: FlashInfer
    0.6.15 builds no float32 output for a bfloat16 query) merged by ``kernels.merge``. ``graph``: FlashInfer's
    wrapper planned as a server's CUDA graph plans it (``use_cuda_graph``, fixed buffers): its CUDA-core decode then
    always runs the partition-KV kernel, which an eager plan skips where its split gives one chunk a row, and its
    tensor-core plan pads its work list. On one card the graph plan reads as a served replay does (32 x 32K: 142.6
    against 141.1 µs a layer on an H200: ``benchmarks/results/speed/call39/``)."""

    def __init__(self, case: PagedCase, plan: StepPlan, landmarks: torch.Tensor, pcap: int, workspace: torch.Tensor,
                 variant: str | None = None, split: DecodeSplit = FLASHINFER_CHOICE, parts: int = 1,
                 graph: bool = False, landmark_scales: torch.Tensor | None = None):
        import flashinfer

        from sparrow_server.kernels import sparse_decode as K

        super().__init__(K, case, plan, landmarks, pcap, variant, landmark_scales)
        self.parts = parts
        indptr, last = plan.row_indptr, plan.last_page_len
        if parts > 1:
            indptr, last = sub_row_plan(indptr, last, parts, case.page_size)
        buffers = {}
        if graph:
            dev = case.q.device
            buffers = dict(use_cuda_graph=True, paged_kv_indptr_buffer=torch.from_numpy(indptr).to(dev),
                           paged_kv_indices_buffer=self.indices,
                           paged_kv_last_page_len_buffer=torch.from_numpy(last).to(dev))
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2",
                                                                     use_tensor_cores=split.use_tensor_cores, **buffers)
        self.wrapper.plan(torch.from_numpy(indptr), self.indices, torch.from_numpy(last), self.g, 1, case.q.shape[2],
                          case.page_size, data_type=case.k_buf.dtype, q_data_type=case.q.dtype, **split.plan_kwargs())
        self.kv = (K.per_head_kv_view(case.k_buf, case.page_size), K.per_head_kv_view(case.v_buf, case.page_size))
        rows, d = plan.batch_size * self.h, case.q.shape[2]
        self.out = torch.empty(rows, self.g, d, dtype=case.q.dtype, device=case.q.device)
        if parts > 1:
            n = EMPTY_ROWS + rows * parts
            self.q_parts = torch.empty(n, self.g, d, dtype=case.q.dtype, device=case.q.device)
            self.v_parts = torch.empty(n, self.g, d, dtype=case.q.dtype, device=case.q.device)
            self.s_parts = torch.empty(n, self.g, dtype=torch.float32, device=case.q.device)

    def attend(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """FlashInfer decode over the index buffer's pages at the scale last set (the plan's 1 / sqrt(head_dim)
        until a call sets one): [B*H, G, D], into ``out`` when given (``self.out`` inside a CUDA graph)."""
        q = self.case.q.view(-1, self.g, self.case.q.shape[2])
        if self.parts == 1:
            return self.wrapper.run(q, self.kv, out=out)
        from sparrow_server.kernels.merge import merge_parts, sub_row_queries

        self.wrapper.run(sub_row_queries(q, self.parts, EMPTY_ROWS, self.q_parts), self.kv, out=self.v_parts,
                         lse=self.s_parts, return_lse=True)
        return merge_parts(self.v_parts[EMPTY_ROWS:], self.s_parts[EMPTY_ROWS:], self.parts,
                           self.out if out is None else out)

    def __call__(self, scale: float, cache_loc=None) -> torch.Tensor:
        """Score, select and attend at ``scale`` (FlashInfer's ``forward``: a new output tensor)."""
        self.select(cache_loc)
        q = self.case.q.view(-1, self.g, self.case.q.shape[2])
        if self.parts == 1:
            return self.wrapper.forward(q, self.kv, sm_scale=scale)
        from sparrow_server.kernels.merge import merge_parts, sub_row_queries

        v, lse = self.wrapper.forward_return_lse(sub_row_queries(q, self.parts, EMPTY_ROWS, self.q_parts), self.kv,
                                                 sm_scale=scale)
        return merge_parts(v[EMPTY_ROWS:], lse[EMPTY_ROWS:], self.parts, torch.empty_like(self.out))
