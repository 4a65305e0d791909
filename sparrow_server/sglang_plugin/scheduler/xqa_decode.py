"""FlashInfer's XQA decode kernel (TensorRT-LLM's GQA decode) over the sparse rows' selected pages.

Why: FlashInfer's CUDA-core decode splits each (request, KV head) row's pages over CTAs and merges the partial
softmax states in a second launch; at 256 selected pages a row that merge and the kernel's own start and tail
cost 8-9.5 us a layer over the bytes at dense's bandwidth (issue 24, ``benchmarks/results/speed/``). XQA's
multi-block mode splits a row over ``sub_seqs`` CTAs and the last CTA of a row merges, in the same launch. Its
grid follows the shapes only (rows, the table's width, ``sub_seqs``), so a CUDA graph holds it as captured.

Each sparse row is one XQA sequence of one KV head (``num_kv_heads`` 1, the row's query heads its group); its
pages are the per-head page ids of ``sparse_decode.per_head_kv_view``, read through XQA's page, token and head
strides, so no copy. XQA takes a block table [rows, width] where the sparse plan packs rows by ``row_indptr``:
``block_table`` gathers one from the other."""
from __future__ import annotations

import torch

SEMAPHORE_BYTES = 8 << 20  # what FlashInfer's ``xqa_batch_decode_with_kv_cache`` reserves ahead of the scratch


def block_table(indices: torch.Tensor, row_indptr: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, width] int32: row r's page ids ``indices[row_indptr[r]:row_indptr[r + 1]]``, then page 0."""
    start = row_indptr[:-1].long()[:, None]
    count = (row_indptr[1:] - row_indptr[:-1]).long()[:, None]
    col = torch.arange(width, device=indices.device)[None, :]
    pos = (start + col).clamp(max=indices.numel() - 1)
    return torch.where(col < count, indices[pos], 0).to(torch.int32)


def seq_lens(row_indptr: torch.Tensor, last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """[rows, 1] uint32 tokens a row attends (its pages, the last one ``last_page_len`` long), as XQA reads them."""
    pages = (row_indptr[1:] - row_indptr[:-1]).long()
    tokens = (pages - 1) * page_size + last_page_len.long()
    return tokens.to(torch.int32).view(torch.uint32)[:, None]


class XqaDecode:
    """XQA over per-head pages: ``run`` writes [rows, group, head_dim] into ``out``. ``sub_seqs``: CTAs a row
    (XQA's multi-block mode; None: XQA's own count from the device's SMs, one a row once the rows fill them)."""

    def __init__(self, workspace: torch.Tensor, page_size: int, sub_seqs: int | None = None):
        if workspace.numel() <= SEMAPHORE_BYTES or workspace.dtype != torch.uint8:
            raise ValueError(f"workspace of {workspace.numel()} {workspace.dtype}: uint8 past {SEMAPHORE_BYTES} bytes")
        if sub_seqs is not None and sub_seqs < 1:
            raise ValueError(f"sub_seqs={sub_seqs}: must be >= 1")
        self.workspace, self.page_size, self.sub_seqs = workspace, page_size, sub_seqs
        workspace.zero_()  # XQA's semaphores start at 0 and each launch leaves them so

    def sm_count(self, rows: int) -> int:
        """The SM count XQA is told: it gives each row max(1, sm_count // rows) CTAs (capped by its tiles)."""
        if self.sub_seqs is None:
            return torch.cuda.get_device_properties(self.workspace.device).multi_processor_count
        return self.sub_seqs * rows

    def run(self, q: torch.Tensor, kv: tuple, table: torch.Tensor, lens: torch.Tensor, sm_scale: float,
            out: torch.Tensor) -> torch.Tensor:
        """q [rows, group, head_dim]; kv: per-head K and V page views [pages, page_size, 1, head_dim]; table
        [rows, width] int32; lens [rows, 1] uint32 (``seq_lens``)."""
        from flashinfer.xqa import xqa

        rows, _, head_dim = q.shape
        xqa(q[:, None], kv[0], kv[1], table, lens, out[:, None], self.workspace[SEMAPHORE_BYTES:],
            self.workspace[:SEMAPHORE_BYTES], 1, self.page_size, q_scale=sm_scale * head_dim ** 0.5,
            kv_scale=1.0, kv_layout="NHD", sm_count=self.sm_count(rows))
        return out
