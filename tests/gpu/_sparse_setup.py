"""Random paged KV pools for the GPU kernel tests and the kernel benchmark (not a test module)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sparrow_server.sglang_plugin.scheduler.planning import StepPlan, plan_step
from sparrow_server.sparsity.schedule import Schedule


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


def make_case(lengths, num_kv_heads=8, group=2, head_dim=128, page_size=16, max_ctx=None, seed=0,
              dtype=torch.bfloat16, device="cuda") -> PagedCase:
    g = torch.Generator(device="cpu").manual_seed(seed)
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    b = lengths.shape[0]
    pages = [math.ceil(int(n) / page_size) for n in lengths]
    max_ctx = max_ctx or max(pages) * page_size
    total = sum(pages)
    phys = (torch.randperm(total, generator=g) + 1).tolist()  # page 0 stays the padding page
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
