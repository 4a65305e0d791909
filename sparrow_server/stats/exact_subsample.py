"""Exact acceptance on a uniform subsample of generated positions (issue 25, ``docs/autopilot.md``).

A verified request keeps every ``stride``-th generated position from an ``offset`` drawn uniformly in
``[0, stride)``. The choice is made before any token exists, so the kept positions are a uniform,
token-independent sample of every length bin. At a kept position the sparse row is stored as
``compact_logits`` (float16 ``logits - max``); the dense pass compares it with the dense row there
(``kept_acceptance``). Generated position ``g`` (0-based) is the completion's ``g``-th token.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sparrow_server.stats.acceptance import exact_acceptance

DEFAULT_STRIDE = 16  # 96 KiB per kept row at V = 49,152: 48 MiB for an 8K-token request


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class KeptPositions:
    """Generated positions ``offset, offset + stride, offset + 2 * stride, ...``."""

    offset: int
    stride: int

    def __post_init__(self) -> None:
        if not _is_int(self.stride) or self.stride < 1:
            raise ValueError(f"stride = {self.stride!r}: must be an integer >= 1")
        if not _is_int(self.offset) or not 0 <= self.offset < self.stride:
            raise ValueError(f"offset = {self.offset!r}: must be an integer in [0, stride = {self.stride})")

    def is_kept(self, position: int) -> bool:
        return position >= self.offset and (position - self.offset) % self.stride == 0

    def positions(self, n_generated: int) -> np.ndarray:
        """The kept positions among ``n_generated`` tokens: [K] int64, ascending."""
        return np.arange(self.offset, max(int(n_generated), 0), self.stride, dtype=np.int64)

    def to_dict(self) -> dict[str, int]:
        return {"offset": int(self.offset), "stride": int(self.stride)}

    @classmethod
    def from_dict(cls, data: object) -> "KeptPositions":
        if not isinstance(data, dict):
            raise ValueError(f"kept positions = {data!r}: must be an object with offset and stride")
        return cls(offset=data.get("offset"), stride=data.get("stride"))


def choose_kept_positions(stride: int = DEFAULT_STRIDE, rng: random.Random | None = None) -> KeptPositions:
    """Every ``stride``-th position from a uniform random offset. It takes no tokens: the choice cannot
    depend on them (a token-dependent choice would bias the tail it estimates)."""
    KeptPositions(0, stride)  # checks stride first, so the error names it
    return KeptPositions((rng or random).randrange(stride), stride)


def kept_acceptance(compact_rows: Tensor, dense_logits: Tensor) -> Tensor:
    """``Σ_v min(softmax(sparse), softmax(dense))`` per kept row, in float32 on the rows' device.

    compact_rows: [K, V] float16 (``compact_logits``: logits - max; raw bfloat16 logits are refused,
    they move the value by up to 0.044), dense_logits: [K, V] any float dtype -> [K] float32.
    """
    if compact_rows.dtype != torch.float16:
        raise ValueError(f"compact_rows dtype = {compact_rows.dtype}: must be float16 (stats.compact_logits)")
    return exact_acceptance(compact_rows.float(), dense_logits.to(compact_rows.device).float())


@dataclass(frozen=True)
class KeptAcceptance:
    """The dense pass's exact values at one rollout's kept positions.

    ``positions``: [K] int64 kept positions that have a value; ``acceptance``: [K] float64;
    ``missing``: kept positions (< the completion length) without one (no sparse row stored: the
    request was re-prefilled there, or the row store was full), reported, never filled in.
    """

    positions: np.ndarray
    acceptance: np.ndarray
    missing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if np.shape(self.positions) != np.shape(self.acceptance) or np.ndim(self.positions) != 1:
            raise ValueError(f"positions {np.shape(self.positions)} and acceptance {np.shape(self.acceptance)}: "
                             "must be the same [K]")

    @property
    def n_tokens(self) -> int:
        return int(np.size(self.acceptance))

    def to_dict(self) -> dict[str, list]:
        return {"positions": [int(p) for p in self.positions], "acceptance": [float(a) for a in self.acceptance],
                "missing": [int(m) for m in self.missing]}

    @classmethod
    def from_dict(cls, data: object, kept: KeptPositions, n_generated: int) -> "KeptAcceptance":
        """Parse and check a payload: every position must be a kept one below ``n_generated``, values in [0, 1]."""
        if not isinstance(data, dict):
            raise ValueError(f"exact acceptance = {data!r}: must be an object")
        positions = np.asarray(data.get("positions", []), dtype=np.int64).ravel()
        acceptance = np.asarray(data.get("acceptance", []), dtype=np.float64).ravel()
        missing = tuple(int(m) for m in data.get("missing", []))
        expected = set(kept.positions(n_generated).tolist())
        wrong = sorted(set(positions.tolist()) - expected) + sorted(set(missing) - expected)
        if wrong:
            raise ValueError(f"positions = {wrong[:5]}: not kept positions ({kept}) below {n_generated}")
        if acceptance.size and not ((acceptance >= 0) & (acceptance <= 1)).all():
            raise ValueError(f"acceptance = {acceptance.tolist()[:5]}...: values must be in [0, 1]")
        return cls(positions, acceptance, missing)


__all__ = ["DEFAULT_STRIDE", "KeptPositions", "KeptAcceptance", "choose_kept_positions", "kept_acceptance"]
