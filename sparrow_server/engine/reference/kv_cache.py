"""Paged KV cache of the reference engine: one pool of fixed-size pages shared by all layers'
K/V tensors, a free list, per-request page tables, and a landmark side cache (the fp32 mean of
each full page's post-RoPE keys, per layer and KV head).

Shapes: ``NL`` layers, ``N`` pages in the pool, ``ps`` page size, ``Hkv`` KV heads, ``D`` head dim.
Page 0 is the null page: never allocated, all zeros, used to pad gathered page tables.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch
from torch import Tensor

NULL_PAGE = 0


class OutOfPagesError(RuntimeError):
    """The pool has fewer free pages than asked for."""


@dataclass
class PageTable:
    """Pages of one sequence in position order; ``length`` tokens are written."""

    pages: list[int] = field(default_factory=list)
    length: int = 0


class PagedKVCache:
    """K/V pools ``[NL, N, ps, Hkv, D]`` in the model dtype, landmarks ``[NL, N, Hkv, D]`` fp32."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        assert num_pages >= 2, "the pool needs the null page plus at least one page"
        self.page_size = page_size
        self.num_pages = num_pages
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.landmarks = torch.empty((num_layers, num_pages, num_kv_heads, head_dim), dtype=torch.float32, device=device)
        self._zero_pages([NULL_PAGE])
        self._free = list(range(num_pages - 1, NULL_PAGE, -1))  # pop() hands out low ids first
        self._lock = threading.Lock()
        self._shapes: tuple | None = None  # (k, landmarks) shapes while the pool is released

    @property
    def released(self) -> bool:
        return self._shapes is not None

    def release(self) -> None:
        """Free the K/V and landmark tensors (every page must be free); ``restore`` rebuilds them."""
        assert self.free_pages == self.usable_pages, "release with pages in use"
        if self._shapes is None:
            self._shapes = (self.k.shape, self.landmarks.shape)
            self.k = self.v = self.k.new_empty(0)
            self.landmarks = self.landmarks.new_empty(0)

    def restore(self) -> None:
        """Reallocate a released pool, zeroed (as after a flush)."""
        if self._shapes is not None:
            kv, landmarks = self._shapes
            self.k = self.k.new_zeros(kv)
            self.v = self.v.new_zeros(kv)
            self.landmarks = self.landmarks.new_zeros(landmarks)
            self._shapes = None

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def usable_pages(self) -> int:
        return self.num_pages - 1

    def pages_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.page_size)

    def allocate(self, table: PageTable, new_length: int) -> None:
        """Grow ``table`` with zeroed pages so that it holds ``new_length`` tokens."""
        need = self.pages_for(new_length) - len(table.pages)
        if need <= 0:
            return
        with self._lock:
            if need > len(self._free):
                raise OutOfPagesError(f"need {need} pages, {len(self._free)} free")
            pages = [self._free.pop() for _ in range(need)]
        self._zero_pages(pages)
        table.pages.extend(pages)

    def free(self, table: PageTable) -> None:
        """Return every page of ``table`` to the pool (stale landmarks are zeroed on reuse)."""
        with self._lock:
            self._free.extend(reversed(table.pages))
        table.pages.clear()
        table.length = 0

    def _zero_pages(self, pages: list[int]) -> None:
        idx = torch.tensor(pages, dtype=torch.long, device=self.k.device)
        self.k[:, idx] = 0
        self.v[:, idx] = 0
        self.landmarks[:, idx] = 0

    def slots(self, table: PageTable, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(page id, offset) of each position. positions: [L] int64 -> two [L] int64 tensors."""
        pages = torch.tensor(table.pages, dtype=torch.long, device=positions.device)
        return pages[positions // self.page_size], positions % self.page_size

    def write(self, layer: int, page_ids: Tensor, offsets: Tensor, keys: Tensor, values: Tensor) -> None:
        """Store K/V of ``T`` tokens. page_ids/offsets: [T], keys/values: [T, Hkv, D]."""
        self.k[layer, page_ids, offsets] = keys.to(self.k.dtype)
        self.v[layer, page_ids, offsets] = values.to(self.v.dtype)

    def update_landmarks(self, layer: int, page_ids: Tensor) -> None:
        """Recompute the landmarks of full pages. page_ids: [F] -> landmarks[layer, page_ids] = mean keys."""
        if page_ids.numel():
            self.landmarks[layer, page_ids] = self.k[layer, page_ids].to(torch.float32).mean(dim=1)

    def gather(self, layer: int, page_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """K, V and landmarks of padded page tables. page_index: [B, P] (NULL_PAGE padded)
        -> k, v: [B, P * ps, Hkv, D], landmarks: [B, P, Hkv, D] fp32."""
        b, p = page_index.shape
        k = self.k[layer, page_index].reshape(b, p * self.page_size, *self.k.shape[-2:])
        v = self.v[layer, page_index].reshape(b, p * self.page_size, *self.v.shape[-2:])
        return k, v, self.landmarks[layer, page_index]


def padded_page_index(tables: list[PageTable], device: torch.device | str) -> Tensor:
    """[B, Pmax] int64 page ids, NULL_PAGE padded."""
    pmax = max(len(t.pages) for t in tables)
    rows = [t.pages + [NULL_PAGE] * (pmax - len(t.pages)) for t in tables]
    return torch.tensor(rows, dtype=torch.long, device=device)
