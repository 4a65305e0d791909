"""Read-only passes over the landmarks a sparse layer's scoring reads: a floor for the scoring under the bench's
``--landmark-reads`` (``sparse_kernel_bench.py``).

``gather``: each request's candidate pages' landmark rows, every KV head (the 2 KB a page in bfloat16 that the split
grid's scoring reads, found the same way through ``req_to_token``), summed; ``linear``: as many rows read from one
contiguous run of the same tensor. Scoring at the gather's rate would be at its floor for where the pages lie; a gather
slower than the linear read puts the bound in the access pattern, not in any scoring kernel. Both stream their share
through a pipelined loop (``num_stages``), a few programs an SM, and write one float32 sum a program (so nothing is
optimised away; ``row_sums`` returns them for the CPU check).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

READ_BLOCK_P = 8     # pages a tile: 16 KB of bf16 rows of 8 KV heads x 128
READ_STAGES = 3
READ_PROGRAMS_PER_SM = 4


@triton.jit
def _row_sums_kernel(lm_ptr, r2t_ptr, rpi_ptr, lo_ptr, hi_ptr, base_ptr, out_ptr, r2t_stride, NPROG: tl.constexpr,
                     PS: tl.constexpr, ROW: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr,
                     LINEAR: tl.constexpr):
    """Program (b, p): the p-th of NPROG even shares of request b's candidates ``[lo, hi)``; the rows of their pages
    (LINEAR: of pages ``base[b] + j - lo``, one contiguous run) summed into ``out[b * NPROG + p]``."""
    b = tl.program_id(0)
    p = tl.program_id(1)
    lo = tl.load(lo_ptr + b)
    n = tl.load(hi_ptr + b) - lo
    first = lo + (p * n) // NPROG
    end = lo + ((p + 1) * n) // NPROG
    row_r2t = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    base = tl.load(base_ptr + b)
    e = tl.arange(0, ROW)
    acc = tl.zeros([ROW], dtype=tl.float32)
    for start in tl.range(first, end, BLOCK_P, num_stages=STAGES):
        j = start + tl.arange(0, BLOCK_P)
        live = j < end
        if LINEAR:
            page = (base + j - lo).to(tl.int64)
        else:
            page = (tl.load(row_r2t + j.to(tl.int64) * PS, mask=live, other=0) // PS).to(tl.int64)
        x = tl.load(lm_ptr + page[:, None] * ROW + e[None, :], mask=live[:, None], other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    tl.store(out_ptr + b * NPROG + p, tl.sum(acc, axis=0))


def read_programs(batch: int, device: torch.device) -> int:
    """Programs a request: READ_PROGRAMS_PER_SM an SM over the batch (at least 1; 2 on CPU tensors)."""
    if device.type != "cuda":
        return 2
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, triton.cdiv(READ_PROGRAMS_PER_SM * sms, batch))


def linear_bases(landmarks: torch.Tensor, cand_lo: torch.Tensor, cand_hi: torch.Tensor) -> torch.Tensor:
    """[B] int32 first page of each request's contiguous run for ``linear``: page 1 + the candidates before it."""
    n = (cand_hi - cand_lo).to(torch.int64)
    base = 1 + torch.cumsum(n, 0) - n
    assert int(base[-1] + n[-1]) <= landmarks.shape[0], "the contiguous runs lie inside the landmarks"
    return base.to(torch.int32)


def row_sums(landmarks: torch.Tensor, req_to_token: torch.Tensor, rpi: torch.Tensor, cand_lo: torch.Tensor,
             cand_hi: torch.Tensor, page_size: int, linear: bool, base: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """[B, programs] float32 sums of the rows read (``landmarks``: [pages, H, D], one row a page); ``linear``: each
    request's as many rows from a contiguous run (``base``: ``linear_bases``, given where the call is captured in a
    CUDA graph, which cannot read it back)."""
    b = cand_lo.shape[0]
    nprog = read_programs(b, landmarks.device)
    base = linear_bases(landmarks, cand_lo, cand_hi) if base is None else base
    out = torch.empty(b, nprog, dtype=torch.float32, device=landmarks.device) if out is None else out
    _row_sums_kernel[(b, nprog)](landmarks, req_to_token, rpi, cand_lo, cand_hi, base, out, req_to_token.stride(0),
                                 NPROG=nprog, PS=page_size, ROW=landmarks.shape[1] * landmarks.shape[2],
                                 BLOCK_P=READ_BLOCK_P, STAGES=READ_STAGES, LINEAR=linear, num_warps=4)
    return out


def timed_reads(layer, graph_us) -> dict:
    """µs and TB/s of both passes over ``layer``'s candidates (a ``standalone_layer.SparseLayer``), each timed by
    ``graph_us`` (the bench's CUDA-graph timer)."""
    c, f = layer.case, layer.fields
    lm = layer.lm
    rows = int((f["cand_hi"] - f["cand_lo"]).sum())
    nbytes = rows * lm.shape[1] * lm.shape[2] * lm.element_size()
    base = linear_bases(lm, f["cand_lo"], f["cand_hi"])
    out = torch.empty(f["cand_lo"].shape[0], read_programs(f["cand_lo"].shape[0], lm.device), device=lm.device)
    res = {"bytes": nbytes}
    for name, linear in (("gather", False), ("linear", True)):
        us = graph_us(lambda: row_sums(lm, c.req_to_token, c.rpi, f["cand_lo"], f["cand_hi"], c.page_size, linear,
                                       base, out))
        res.update({f"{name}_us": round(us, 1), f"{name}_TBps": round(nbytes / us / 1e6, 3)})
    return res
