"""Debug hook: record the pages the ``sparrow`` backend selects, to compare with the reference.

Off by default. With ``SPARROW_DEBUG_SELECTIONS=DIR`` in the server's environment (and
``--disable-cuda-graph``: under graph replay no Python runs per layer), every sparse layer of
every decode step whose length is a multiple of ``SPARROW_DEBUG_SELECTIONS_EVERY`` (default 64)
copies its page ids to the host, maps them back to logical pages, and appends one record per
(request, KV head): ``layer, prompt_len, length, head, pages``. Records are flushed to
``DIR/sel-<pid>-<n>.npz`` at the start of the next decode step. When the variable is unset the
backend holds ``None`` and each sparse layer pays one attribute test, only when Python runs it.

Under tensor parallelism every rank records its own KV heads, under their global numbers (a
replicated head is recorded once per replica, each with its own query sub-group's selection).

Requests are identified by their prompt length (the backend knows no request ids): a study sends
its debug sequences with distinct prompt lengths. ``length`` is the number of tokens the step
attends, so the query is position ``length - 1``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

ENV_DIR = "SPARROW_DEBUG_SELECTIONS"
ENV_EVERY = "SPARROW_DEBUG_SELECTIONS_EVERY"
DEFAULT_EVERY = 64
FIELDS = ("layer", "prompt_len", "length", "head")


def recorder_from_env(page_size: int, num_kv_heads: int, environ=None,
                      heads: Sequence[int] | None = None) -> "SelectionRecorder | None":
    env = os.environ if environ is None else environ
    out = env.get(ENV_DIR)
    if not out:
        return None
    text = env.get(ENV_EVERY, str(DEFAULT_EVERY))
    try:
        every = int(text)
    except ValueError:
        raise ValueError(f"{ENV_EVERY}={text!r}: must be an integer") from None
    if every < 1:
        raise ValueError(f"{ENV_EVERY}={every}: must be >= 1")
    return SelectionRecorder(Path(out), every, page_size, num_kv_heads, heads)


def logical_pages(ids: np.ndarray, first_slots: np.ndarray, num_kv_heads: int) -> tuple[int, np.ndarray]:
    """(head, sorted logical pages) of one row's FlashInfer page ids ``slot * H + head``.

    first_slots: [n_pages] the first KV slot of each logical page of the request
    (``req_to_token[row, ::page_size]``). Raises when an id is not one of the request's pages.
    """
    heads = ids % num_kv_heads
    if heads.size and (heads != heads[0]).any():
        raise ValueError(f"one row mixes KV heads {sorted(set(heads.tolist()))}")
    slot_to_page = {int(s): j for j, s in enumerate(first_slots)}
    try:
        pages = np.array(sorted(slot_to_page[int(s)] for s in ids // num_kv_heads), dtype=np.int32)
    except KeyError as exc:
        raise ValueError(f"page id of slot {exc.args[0]} is not a page of this request") from None
    return (int(heads[0]) if heads.size else 0), pages


class SelectionRecorder:
    def __init__(self, out_dir: Path, every: int, page_size: int, num_kv_heads: int,
                 heads: Sequence[int] | None = None):
        """``heads``: global number of each local KV head (this TP rank's); ``None``: one rank."""
        self.out_dir, self.every, self.page_size, self.num_kv_heads = out_dir, every, page_size, num_kv_heads
        self.heads = tuple(range(num_kv_heads)) if heads is None else tuple(heads)
        if len(self.heads) != num_kv_heads:
            raise ValueError(f"heads={list(self.heads)}: must name {num_kv_heads} KV heads")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._records: list[tuple[int, int, int, int, np.ndarray]] = []
        self._files = 0

    def wanted(self, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Batch positions to record this step (real rows, length a multiple of ``every``)."""
        return np.flatnonzero((rows > 0) & (lengths % self.every == 0))

    def record(self, layer: int, rows: np.ndarray, lengths: np.ndarray, prompt_lens: np.ndarray,
               row_indptr: np.ndarray, indices, req_to_token, real_bs: int) -> None:
        """One sparse layer's selections (``indices``/``req_to_token`` are device tensors)."""
        import torch

        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{ENV_DIR} is set: start the server with --disable-cuda-graph")
        picked = [b for b in self.wanted(lengths[:real_bs], rows[:real_bs])]
        if not picked:
            return
        ids = indices[: int(row_indptr[real_bs * self.num_kv_heads])].cpu().numpy()
        h = self.num_kv_heads
        for b in picked:
            n_pages = -(-int(lengths[b]) // self.page_size)
            first = req_to_token[int(rows[b]), : n_pages * self.page_size : self.page_size].cpu().numpy()
            for r in range(b * h, (b + 1) * h):
                head, pages = logical_pages(ids[row_indptr[r]:row_indptr[r + 1]], first, h)
                self._records.append((layer, int(prompt_lens[b]), int(lengths[b]), self.heads[head], pages))

    def flush(self) -> Path | None:
        if not self._records:
            return None
        path = self.out_dir / f"sel-{os.getpid()}-{self._files:06d}.npz"
        self._files += 1
        write_records(path, self._records)
        self._records = []
        return path


def write_records(path: Path, records: Sequence[tuple[int, int, int, int, np.ndarray]]) -> None:
    width = max((len(r[4]) for r in records), default=0)
    pages = np.full((len(records), width), -1, dtype=np.int32)
    for i, r in enumerate(records):
        pages[i, : len(r[4])] = r[4]
    cols = {name: np.array([r[i] for r in records], dtype=np.int64) for i, name in enumerate(FIELDS)}
    np.savez(path, pages=pages, **cols)


def load_records(folder: Path) -> dict[str, np.ndarray]:
    """All flushed records of a folder, concatenated: FIELDS -> [n], ``pages`` -> list of arrays."""
    out: dict = {name: [] for name in FIELDS}
    out["pages"] = []
    for path in sorted(Path(folder).glob("sel-*.npz")):
        with np.load(path) as z:
            for name in FIELDS:
                out[name].append(z[name])
            out["pages"].extend(row[row >= 0] for row in z["pages"])
    return {**{n: (np.concatenate(v) if v else np.zeros(0, np.int64)) for n, v in out.items() if n != "pages"},
            "pages": out["pages"]}
