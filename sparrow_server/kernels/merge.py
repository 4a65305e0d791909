"""Merge of a row's partial attention states (Triton): the sparse decode split into sub-rows (``planning.split_rows``)
attends each sub-row on its own and this kernel merges them, one program a row, in float32.

Why: past about two rows per SM FlashInfer's CUDA-core decode splits each row's pages so that the SMs run uneven
loads: at 32K x 34 (272 rows) it read the selected KV at 0.78-0.84 of the dense decode's bandwidth on four H200 hosts,
at 16K x 64 at 0.79-0.86 (``benchmarks/results/speed/call37/``). Four sub-rows a row, each unsplit on the tensor-core
kernel, then this merge: 154.1 against 167.1 us a layer at 32K x 34, 235.4 against 274.8 at 16K x 64 (one host; at
batch 16 and 28 the CUDA-core kernel is faster). FlashInfer fixes a split only outside CUDA graphs (its graph plan
bounds the work list by the rows); sub-rows planned as rows of their own, unsplit, hold under a graph. Served they
did not gain (``SPARROW_SUB_ROWS``, off by default; ``benchmarks/results/speed/call38/``): the server's CUDA-core
decode is faster than the bench's at these batches (139.4 us a layer at 32 x 32K; 140.4 at 34, which SGLang
replays in its graph of 40, against 158.8 for 2 sub-rows' kernel plus 4.2 for the query copy and this merge).

A partial state is FlashInfer's: the sub-row's output and its log-sum-exp of the scaled logits in base 2 (an
empty sub-row: output 0, log-sum-exp -inf, weight 0)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _merge_kernel(v_ptr, s_ptr, out_ptr, PARTS: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, GP)
    d = tl.arange(0, D)
    hm = h < G
    s_row = s_ptr + r * PARTS * G
    m = tl.full([GP], float("-inf"), tl.float32)
    for p in tl.static_range(PARTS):
        m = tl.maximum(m, tl.load(s_row + p * G + h, mask=hm, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)  # padded heads: weights exp2(-inf) = 0, no NaN
    acc = tl.zeros([GP, D], tl.float32)
    den = tl.zeros([GP], tl.float32)
    for p in tl.static_range(PARTS):
        w = tl.exp2(tl.load(s_row + p * G + h, mask=hm, other=float("-inf")) - m)
        v = tl.load(v_ptr + ((r * PARTS + p) * G + h[:, None]) * D + d[None, :], mask=hm[:, None], other=0.0)
        acc += w[:, None] * v.to(tl.float32)
        den += w
    out = acc / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(out_ptr + (r * G + h[:, None]) * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=hm[:, None])


def merge_parts(v: Tensor, s: Tensor, parts: int, out: Tensor) -> Tensor:
    """v [rows * parts, G, D] sub-row outputs (row r's sub-rows r * parts .. r * parts + parts - 1), s [rows * parts,
    G] their float32 base-2 log-sum-exps -> ``out`` [rows, G, D], the rows' attention."""
    rows, g, d = out.shape
    assert v.shape == (rows * parts, g, d) and s.shape == (rows * parts, g), (v.shape, s.shape, out.shape, parts)
    assert v.is_contiguous() and s.is_contiguous() and out.is_contiguous()
    if rows:
        _merge_kernel[(rows,)](v, s, out, PARTS=parts, G=g, GP=triton.next_power_of_2(g), D=d)
    return out


def sub_row_queries(q: Tensor, parts: int, lead: int, out: Tensor | None = None) -> Tensor:
    """q [rows, G, D] -> [lead + rows * parts, G, D]: ``lead`` rows left unwritten (empty rows, which FlashInfer reads
    no key for), then each row's query once per sub-row (sub-row ``lead + r * parts + c`` of row ``r``). One copy."""
    rows = q.shape[0]
    if out is None:
        out = torch.empty(lead + rows * parts, *q.shape[1:], dtype=q.dtype, device=q.device)
    out[lead:].view(rows, parts, *q.shape[1:]).copy_(q[:, None].expand(rows, parts, *q.shape[1:]))
    return out
