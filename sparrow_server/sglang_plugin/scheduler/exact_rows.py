"""Sparse logits rows kept for exact acceptance (issue 25), per request, in one scheduler process.

A request whose ``custom_params`` carry kept positions (``stats.exact_wire.KEEP_PARAM``) has, at each
kept generated position, its sparse logits row (after the logits processor, before any sampling
transform: temperature 1) stored here as ``compact_logits`` (float16 logits - max) on its device,
until the dense verify request for it (``VERIFY_PARAM``) compares it with the dense row and frees it.

Which batch row is which position is decided on the host (``decode_captures``/``extend_captures``,
from the batch's CPU lengths: no device sync). Generated position ``g`` is predicted by the forward
whose sequence, the input token included, holds ``prompt_len + g`` tokens.

A kept position whose step attended every page of the sequence on every layer (the prefill's position
0, a request whose budget still covers its length, the dense schedule) of a request without an adapter
is the dense step itself: its acceptance is 1 by construction and no row is kept (``put_dense``).
Measuring it would report the numeric difference between the decode and verify kernels instead (p5
0.966 on SmolLM2-135M at 8K tokens, H200: ``benchmarks/results/fidelity/live_tail_gpu/``), which no
budget can change. With an adapter such a step is measured like any other: the rollout sampled from the
base model plus the adapter, the dense verify runs the base model alone (a DistillSparse adapter moves
the dense steps too).

Bounded: at most ``max_bytes`` of rows (a row past it is refused and its position reported missing,
never evicting rows already kept, which would bias the sample toward short requests) and entries
older than ``ttl_s`` are dropped (a verify request that never came: its rollout was dropped, failed
or went stale). An abort frees the request's rows.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from torch import Tensor

from sparrow_server.stats import exact_wire
from sparrow_server.stats.exact_subsample import KeptPositions

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB: ~40K kept rows at V = 49,152 (~85 verified 8K-token requests at s = 16)
DEFAULT_TTL_S = 3600.0
_UNSET = object()
KEEP_ATTR = "_sparrow_exact_keep"  # cached on SGLang's Req: its custom_params are parsed once
VERIFY_ATTR = "_sparrow_exact_verify"


@dataclass
class Entry:
    """One request's kept rows and, while its verify prefill runs (possibly in chunks), the values so far."""

    kept: KeptPositions
    created: float
    rows: dict[int, Tensor] = field(default_factory=dict)  # generated position -> [V] float16
    invalid: set[int] = field(default_factory=set)  # kept positions whose row is not sparse decode's
    scores: dict[int, float] = field(default_factory=dict)  # generated position -> exact acceptance
    bounds: dict[int, float] = field(default_factory=dict)  # generated position -> top-k lower bound


class RowStore:
    """``rid`` -> ``Entry`` (see the module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        if max_bytes < 0:
            raise ValueError(f"max_bytes = {max_bytes!r}: must be >= 0")
        self.max_bytes, self.ttl_s, self._clock = max_bytes, ttl_s, clock
        self._entries: dict[str, Entry] = {}
        self.bytes = 0
        self.refused_rows = 0  # rows not kept because the store was full
        self.expired = 0  # entries dropped by the TTL

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, rid: str) -> Entry | None:
        return self._entries.get(rid)

    def open(self, rid: str, kept: KeptPositions) -> Entry:
        entry = self._entries.get(rid)
        if entry is None:
            self._expire()
            entry = self._entries[rid] = Entry(kept, self._clock())
        return entry

    def put(self, rid: str, kept: KeptPositions, position: int, row: Tensor) -> bool:
        """Keep ``row`` (already compact) for ``position``; False (and the position invalid) when full."""
        entry = self.open(rid, kept)
        size = row.numel() * row.element_size()
        old = entry.rows.pop(position, None)
        if old is not None:
            self.bytes -= old.numel() * old.element_size()
        if self.bytes + size > self.max_bytes:
            self.refused_rows += 1
            entry.invalid.add(position)
            return False
        entry.rows[position] = row
        self.bytes += size
        return True

    def put_dense(self, rid: str, kept: KeptPositions, position: int) -> None:
        """``position`` ran the dense step (every page attended): acceptance 1, no row kept."""
        entry = self.open(rid, kept)
        self._drop_row(entry, position)
        entry.scores[position] = 1.0

    def mark_invalid(self, rid: str, kept: KeptPositions, position: int) -> None:
        entry = self.open(rid, kept)
        self._drop_row(entry, position)
        entry.scores.pop(position, None)
        entry.invalid.add(position)

    def _drop_row(self, entry: Entry, position: int) -> None:
        old = entry.rows.pop(position, None)
        if old is not None:
            self.bytes -= old.numel() * old.element_size()

    def has_value(self, rid: str, position: int) -> bool:
        """A row kept for ``position``, or its value already known (a dense step)."""
        entry = self._entries.get(rid)
        return entry is not None and (position in entry.rows or position in entry.scores)

    def free(self, rid: str) -> None:
        entry = self._entries.pop(rid, None)
        if entry is not None:
            self.bytes -= sum(r.numel() * r.element_size() for r in entry.rows.values())

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def free_prefix(self, prefix: str) -> None:
        """Free every request whose rid starts with ``prefix`` (SGLang's abort matches rids so)."""
        for rid in [r for r in self._entries if r.startswith(prefix)]:
            self.free(rid)

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl_s
        for rid in [r for r, e in self._entries.items() if e.created < cutoff]:
            self.free(rid)
            self.expired += 1


# ---- reading a request's ask (cached on SGLang's Req) ----------------------------------------------
def _custom_params(req: Any) -> Any:
    return getattr(getattr(req, "sampling_params", None), "custom_params", None)


def _cached(req: Any, attr: str, decode: Callable[[Any], Any]) -> Any:
    value = getattr(req, attr, _UNSET)
    if value is _UNSET:
        try:
            value = decode(_custom_params(req))
        except Exception as exc:  # a bad value is this request's problem, never the scheduler's
            logger.warning("request %s: bad exact-acceptance parameter (%s); ignored", getattr(req, "rid", "?"), exc)
            value = None
        try:
            setattr(req, attr, value)
        except AttributeError:  # a Req with __slots__: parse again next time
            pass
    return value


def req_keep(req: Any) -> KeptPositions | None:
    return _cached(req, KEEP_ATTR, exact_wire.decode_keep)


def req_verify(req: Any) -> exact_wire.ExactVerify | None:
    return _cached(req, VERIFY_ATTR, exact_wire.decode_verify)


# ---- which rows of a batch to keep ---------------------------------------------------------------
@dataclass(frozen=True)
class Capture:
    """Keep row ``index`` of the batch's next-token logits as request ``rid``'s position ``position``
    (``dense``: the step attended every page; its value is 1, no row is kept)."""

    index: int
    rid: str
    kept: KeptPositions
    position: int
    dense: bool = False


def _prompt_len(req: Any) -> int:
    return len(getattr(req, "origin_input_ids", ()) or ())


def _base_model(req: Any) -> bool:
    """The request runs the base model, the one the dense verify runs (SGLang: ``lora_id`` None)."""
    return getattr(req, "lora_id", None) is None


def decode_captures(reqs: Sequence[Any], seq_lens: Sequence[int],
                    attends_every_page: Callable[[Any, int], bool] | None = None) -> list[Capture]:
    """Decode: request ``i``'s row predicts position ``seq_lens[i] - prompt_len`` (its input token included);
    ``attends_every_page(req, seq_len)``: whether that step attended every page (None: never assumed); it is
    the dense step only for a request without an adapter."""
    out = []
    for i, req in enumerate(reqs):
        kept = req_keep(req)
        if kept is None:
            continue
        length = int(seq_lens[i])
        position = length - _prompt_len(req)
        if position >= 0 and kept.is_kept(position):
            dense = _base_model(req) and attends_every_page is not None and attends_every_page(req, length)
            out.append(Capture(i, req.rid, kept, position, dense))
    return out


def extend_captures(reqs: Sequence[Any], prefix_lens: Sequence[int], extend_lens: Sequence[int],
                    store: RowStore) -> list[Capture]:
    """Extend: only a fresh prefill's last row is kept: position 0, a dense step (the prefill attends every page)
    unless the request has an adapter.

    A row for a later position comes from a re-prefill after a retraction (or a mixed batch): it ran
    the dense extend path, not sparse decode, so that kept position is marked invalid (reported
    missing). A position that already has its row (or value) is an earlier chunk of such a re-prefill: untouched.
    """
    out = []
    for i, req in enumerate(reqs):
        kept = req_keep(req)
        if kept is None:
            continue
        position = int(prefix_lens[i]) + int(extend_lens[i]) - _prompt_len(req)
        if position < 0 or not kept.is_kept(position):
            continue  # a middle chunk of the prompt, or a position not kept
        if position == 0:
            out.append(Capture(i, req.rid, kept, 0, dense=_base_model(req)))
        elif not store.has_value(req.rid, position):
            store.mark_invalid(req.rid, kept, position)
    return out


__all__ = ["RowStore", "Entry", "Capture", "decode_captures", "extend_captures", "req_keep", "req_verify",
           "DEFAULT_MAX_BYTES", "DEFAULT_TTL_S"]
