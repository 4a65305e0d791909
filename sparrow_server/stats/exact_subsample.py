"""Exact acceptance on a uniform subsample of generated positions (issue 25, ``docs/autopilot.md``).

A verified request keeps one generated position in every block of ``stride`` consecutive positions
(block ``b`` = positions ``[b * stride, (b + 1) * stride)``). Which one is fixed before any token exists,
so the kept positions are a uniform, token-independent sample of every length bin:

- jittered (``seed`` set, what ``choose_kept_positions`` draws): in block ``b`` the position
  ``b * stride + (offset + h(seed, b)) % stride``, ``h`` a splitmix64 hash, so each block's choice is
  uniform and independent of the others';
- fixed (``seed`` None): ``offset, offset + stride, offset + 2 * stride, ...``.

The fixed pattern aliases with periodic text: a rollout looping with a period that divides the stride
(a two-token loop, common in long rollouts) keeps one phase of the loop only. In the 8K GPU study the p5 of
a looping bin's even and of its odd positions differed by up to 0.47, and with the fixed pattern the live
p5 needed 2-8x more rollouts for ±0.02 and its interval covered as little as 21% (jittered: 93%+;
``benchmarks/results/fidelity/live_tail/``). Jitter removes that at the same memory (one row per block).

At a kept position the sparse row is stored as ``compact_logits`` (float16 ``logits - max``); the dense pass
compares it with the dense row there (``kept_acceptance``). Generated position ``g`` (0-based) is the
completion's ``g``-th token.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sparrow_server.stats.acceptance import exact_acceptance, logits_to_topk, topk_acceptance_lower_bound

DEFAULT_STRIDE = 16  # 96 KiB per kept row at V = 49,152: 48 MiB for an 8K-token request
SEED_LIMIT = 1 << 53  # seeds drawn below this (exact in any JSON reader); any 64-bit seed is accepted
_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _splitmix64(seed: int, block: int) -> int:
    """The ``block + 1``-th output of splitmix64 started at ``seed`` (Python ints, any block >= 0)."""
    z = (seed + (block + 1) * _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _splitmix64_array(seed: int, blocks: np.ndarray) -> np.ndarray:
    """``_splitmix64`` of each block: [B] int64 >= 0 -> [B] uint64 (the same values, vectorised)."""
    b = blocks.astype(np.uint64)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2^64, as the mask does above
        z = np.uint64(seed) + (b + np.uint64(1)) * np.uint64(_GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class KeptPositions:
    """One generated position per block of ``stride``: ``offset`` in every block (``seed`` None), or
    ``(offset + h(seed, block)) % stride`` in each block (jittered; see the module docstring)."""

    offset: int
    stride: int
    seed: int | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.stride) or self.stride < 1:
            raise ValueError(f"stride = {self.stride!r}: must be an integer >= 1")
        if not _is_int(self.offset) or not 0 <= self.offset < self.stride:
            raise ValueError(f"offset = {self.offset!r}: must be an integer in [0, stride = {self.stride})")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= _MASK64):
            raise ValueError(f"seed = {self.seed!r}: must be None or an integer in [0, 2^64)")

    @property
    def jittered(self) -> bool:
        return self.seed is not None

    def block_offset(self, block: int) -> int:
        """The kept position's place in block ``block`` (0 <= it < stride)."""
        if self.seed is None:
            return self.offset
        return (self.offset + _splitmix64(self.seed, block) % self.stride) % self.stride

    def is_kept(self, position: int) -> bool:
        if position < 0:
            return False
        return position % self.stride == self.block_offset(position // self.stride)

    def positions(self, n_generated: int) -> np.ndarray:
        """The kept positions among ``n_generated`` tokens: [K] int64, ascending (one per whole block)."""
        n = max(int(n_generated), 0)
        blocks = np.arange(-(-n // self.stride), dtype=np.int64)
        if self.seed is None:
            places = np.full(blocks.size, self.offset, dtype=np.int64)
        else:
            hashed = (_splitmix64_array(self.seed, blocks) % np.uint64(self.stride)).astype(np.int64)
            places = (self.offset + hashed) % self.stride
        out = blocks * self.stride + places
        return out[out < n]

    def to_dict(self) -> dict[str, int]:
        out = {"offset": int(self.offset), "stride": int(self.stride)}
        if self.seed is not None:
            out["seed"] = int(self.seed)
        return out

    @classmethod
    def from_dict(cls, data: object) -> "KeptPositions":
        if not isinstance(data, dict):
            raise ValueError(f"kept positions = {data!r}: must be an object with offset and stride")
        return cls(offset=data.get("offset"), stride=data.get("stride"), seed=data.get("seed"))


def choose_kept_positions(stride: int = DEFAULT_STRIDE, rng: random.Random | None = None) -> KeptPositions:
    """One position per block of ``stride``, jittered: a uniform offset and a seed drawn from ``rng``. It
    takes no tokens: the choice cannot depend on them (a token-dependent choice would bias the tail it
    estimates)."""
    KeptPositions(0, stride)  # checks stride first, so the error names it
    rng = rng or random
    return KeptPositions(rng.randrange(stride), stride, seed=rng.randrange(SEED_LIMIT))


def kept_acceptance(compact_rows: Tensor, dense_logits: Tensor) -> Tensor:
    """``Σ_v min(softmax(sparse), softmax(dense))`` per kept row, in float32 on the rows' device.

    compact_rows: [K, V] float16 (``compact_logits``: logits - max; raw bfloat16 logits are refused,
    they move the value by up to 0.044), dense_logits: [K, V] any float dtype -> [K] float32.
    """
    if compact_rows.dtype != torch.float16:
        raise ValueError(f"compact_rows dtype = {compact_rows.dtype}: must be float16 (stats.compact_logits)")
    return exact_acceptance(compact_rows.float(), dense_logits.to(compact_rows.device).float())


def kept_bound(sparse_logits: Tensor, dense_logits: Tensor, k: int) -> Tensor:
    """The top-``k`` lower bound (``topk_acceptance_lower_bound``, temperature 1) of each pair of rows, what
    a trainer comparing top-k lists would compute there. [K, V], [K, V] -> [K] float32."""
    k = min(int(k), sparse_logits.shape[-1])
    return topk_acceptance_lower_bound(*logits_to_topk(sparse_logits, k), *logits_to_topk(dense_logits, k)).float()


@dataclass(frozen=True)
class KeptAcceptance:
    """The dense pass's exact values at one rollout's kept positions.

    ``positions``: [K] int64 kept positions that have a value; ``acceptance``: [K] float64;
    ``missing``: kept positions (< the completion length) without one (no sparse row stored: the
    request was re-prefilled there, or the row store was full), reported, never filled in.
    ``bound``: [K] float64, the top-k lower bound of the same two rows at the same positions (what a
    trainer comparing top-k lists would see; never above ``acceptance``), or None when not computed.
    """

    positions: np.ndarray
    acceptance: np.ndarray
    missing: tuple[int, ...] = ()
    bound: np.ndarray | None = None

    def __post_init__(self) -> None:
        if np.shape(self.positions) != np.shape(self.acceptance) or np.ndim(self.positions) != 1:
            raise ValueError(f"positions {np.shape(self.positions)} and acceptance {np.shape(self.acceptance)}: "
                             "must be the same [K]")
        if self.bound is not None and np.shape(self.bound) != np.shape(self.positions):
            raise ValueError(f"bound {np.shape(self.bound)}: must be [K] like positions {np.shape(self.positions)}")

    @property
    def n_tokens(self) -> int:
        return int(np.size(self.acceptance))

    def to_dict(self) -> dict[str, list]:
        out = {"positions": [int(p) for p in self.positions], "acceptance": [float(a) for a in self.acceptance],
               "missing": [int(m) for m in self.missing]}
        if self.bound is not None:
            out["bound"] = [float(b) for b in self.bound]
        return out

    @classmethod
    def from_dict(cls, data: object, kept: KeptPositions, n_generated: int) -> "KeptAcceptance":
        """Parse and check a payload: every position must be a kept one below ``n_generated``, values in [0, 1]."""
        if not isinstance(data, dict):
            raise ValueError(f"exact acceptance = {data!r}: must be an object")
        positions = np.asarray(data.get("positions", []), dtype=np.int64).ravel()
        acceptance = _unit_values("acceptance", data.get("acceptance", []))
        bound = None if data.get("bound") is None else _unit_values("bound", data["bound"])
        missing = tuple(int(m) for m in data.get("missing", []))
        expected = set(kept.positions(n_generated).tolist())
        wrong = sorted(set(positions.tolist()) - expected) + sorted(set(missing) - expected)
        if wrong:
            raise ValueError(f"positions = {wrong[:5]}: not kept positions ({kept}) below {n_generated}")
        return cls(positions, acceptance, missing, bound)


def _unit_values(name: str, values: object) -> np.ndarray:
    out = np.asarray(values, dtype=np.float64).ravel()
    if out.size and not ((out >= 0) & (out <= 1)).all():
        raise ValueError(f"{name} = {out.tolist()[:5]}...: values must be in [0, 1]")
    return out


__all__ = ["DEFAULT_STRIDE", "SEED_LIMIT", "KeptPositions", "KeptAcceptance", "choose_kept_positions", "kept_acceptance",
           "kept_bound"]
