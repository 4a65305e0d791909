"""Exact acceptance on a subsample of positions: the kept-position chooser, the Σmin from compact rows
against float64 exact acceptance, the result payload's checks, and the wire contract."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sparrow_server.stats import exact_wire
from sparrow_server.stats.acceptance import compact_logits, exact_acceptance
from sparrow_server.stats.exact_subsample import (
    DEFAULT_STRIDE, KeptAcceptance, KeptPositions, choose_kept_positions, kept_acceptance,
)

TOL = 2e-3  # compact rows against float64: float16 steps are <= 2^-7 nats near the maximum


def _pair(t=32, v=2048, seed=0, noise=0.8, shift=30.0):
    """Peaked logits far from 0 (as real models' are), where bfloat16's absolute step is coarse."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(t, v, generator=g, dtype=torch.float64) * 4 + shift
    sparse = dense + noise * torch.randn(t, v, generator=g, dtype=torch.float64)
    return sparse, dense


# --- the chooser ----------------------------------------------------------------------------------
def test_kept_positions_are_every_stride_th_from_the_offset():
    kept = KeptPositions(offset=3, stride=16)
    assert kept.positions(40).tolist() == [3, 19, 35]
    assert kept.positions(3).tolist() == [] and kept.positions(0).tolist() == []
    assert [g for g in range(40) if kept.is_kept(g)] == [3, 19, 35]


def test_the_chooser_is_deterministic_under_a_seed_and_takes_no_tokens():
    a = [choose_kept_positions(16, random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    assert choose_kept_positions(rng=random.Random(7)).stride == DEFAULT_STRIDE
    # token-independent by construction: the only inputs are the stride and the generator
    import inspect
    assert list(inspect.signature(choose_kept_positions).parameters) == ["stride", "rng"]


def test_the_chooser_is_uniform_over_offsets_so_every_position_is_kept_with_probability_one_over_s():
    rng, s, n = random.Random(0), 8, 8000
    counts = np.bincount([choose_kept_positions(s, rng).offset for _ in range(n)], minlength=s)
    assert counts.size == s
    expected = n / s  # chi-square with 7 dof: 24.3 is its 99.9% point
    assert ((counts - expected) ** 2 / expected).sum() < 24.3
    # hence each position g of any bin is kept with probability 1/s, whatever the tokens are
    hits = np.zeros(40)
    for _ in range(4000):
        hits[choose_kept_positions(s, rng).positions(40)] += 1
    assert np.abs(hits / 4000 - 1 / s).max() < 0.03


def test_jittered_positions_keep_one_per_block_and_agree_between_is_kept_and_positions():
    kept = KeptPositions(offset=3, stride=16, seed=12345)
    pos = kept.positions(1000)
    assert pos.tolist() == [g for g in range(1000) if kept.is_kept(g)]  # the vectorised hash = the scalar one
    per_block = np.bincount(pos // 16, minlength=63)
    assert (per_block[:62] == 1).all() and per_block[62] <= 1  # 62 whole blocks; the partial one (992..999)
    assert len(set((pos % 16).tolist())) > 8  # the place moves from block to block
    assert not kept.is_kept(-1) and kept.positions(0).tolist() == []
    assert kept.positions(40).tolist() == [p for p in pos.tolist() if p < 40]
    huge = KeptPositions(0, 7, seed=(1 << 64) - 1)  # the top of the seed range wraps like the scalar code
    assert huge.positions(700).tolist() == [g for g in range(700) if huge.is_kept(g)]


def test_jittered_places_are_uniform_and_independent_between_blocks():
    """Over seeds, each block's place is uniform on [0, s) and the places of two neighbouring blocks are
    independent (the fixed pattern has them equal): a position is kept with probability 1/s, and a pair of
    positions s apart with probability 1/s^2 (not 1/s)."""
    s, n_seeds = 4, 4000
    rng = random.Random(1)
    places = np.array([[k.block_offset(b) for b in range(3)]
                       for k in (choose_kept_positions(s, rng) for _ in range(n_seeds))])
    for b in range(3):
        counts = np.bincount(places[:, b], minlength=s)
        assert ((counts - n_seeds / s) ** 2 / (n_seeds / s)).sum() < 16.3  # chi-square, 3 dof, 99.9%
    same = (places[:, 0] == places[:, 1]).mean()
    assert abs(same - 1 / s) < 0.03  # fixed offsets would give 1.0
    fixed = KeptPositions(2, s)
    assert [fixed.block_offset(b) for b in range(3)] == [2, 2, 2]


def test_the_chooser_jitters_and_its_seed_travels_on_the_wire():
    kept = choose_kept_positions(16, random.Random(3))
    assert kept.jittered and 0 <= kept.seed < (1 << 53)
    back = exact_wire.decode_keep(exact_wire.encode_keep(kept))
    assert back == kept and back.positions(500).tolist() == kept.positions(500).tolist()
    verify = exact_wire.ExactVerify("r", prompt_len=5, n_generated=500, kept=kept)
    assert exact_wire.decode_verify(exact_wire.encode_verify(verify)).kept == kept
    assert KeptPositions.from_dict({"offset": 1, "stride": 4}) == KeptPositions(1, 4)  # no seed: the fixed pattern


def test_a_periodic_rollout_aliases_with_the_fixed_pattern_but_not_with_jitter():
    """A two-token loop: acceptance 0.6 at even positions, 1.0 at odd ones (the pattern of a looping 8K
    rollout of the GPU study). Every fixed stride-16 pattern sees one phase only; a jittered one sees both."""
    values = np.where(np.arange(4096) % 2 == 0, 0.6, 1.0)
    truth = np.quantile(values, 0.05)
    fixed = [np.quantile(values[KeptPositions(o, 16).positions(4096)], 0.05) for o in range(16)]
    assert {round(v, 6) for v in fixed} == {0.6, 1.0} and truth == pytest.approx(0.6)
    rng = random.Random(0)
    jittered = [np.quantile(values[choose_kept_positions(16, rng).positions(4096)], 0.05) for _ in range(50)]
    assert max(abs(v - truth) for v in jittered) < 1e-9


@pytest.mark.parametrize("seed", [-1, 1 << 64, 1.5, "7", True])
def test_a_bad_seed_is_refused_naming_the_field(seed):
    with pytest.raises(ValueError, match="seed"):
        KeptPositions(0, 16, seed=seed)


@pytest.mark.parametrize("stride", [0, -1, 1.5, True, "16", None])
def test_a_bad_stride_is_refused_naming_the_field(stride):
    with pytest.raises(ValueError, match="stride"):
        choose_kept_positions(stride, random.Random(0))
    with pytest.raises(ValueError, match="stride"):
        KeptPositions(0, stride)


@pytest.mark.parametrize("offset", [-1, 16, 2.0, None])
def test_a_bad_offset_is_refused_naming_the_field(offset):
    with pytest.raises(ValueError, match="offset"):
        KeptPositions(offset, 16)


# --- Σmin from compact rows -------------------------------------------------------------------------
def test_kept_acceptance_from_compact_rows_matches_float64_exact_acceptance():
    sparse, dense = _pair()
    truth = exact_acceptance(sparse, dense)  # float64
    got = kept_acceptance(compact_logits(sparse.float()), dense.to(torch.bfloat16))
    assert got.dtype == torch.float32 and got.shape == truth.shape
    # the dense row in bfloat16 is what SGLang's lm_head gives; the reference uses the same rounding
    ref = exact_acceptance(sparse, dense.to(torch.bfloat16).double())
    assert (got.double() - ref).abs().max() < TOL
    assert (got.double() - truth).abs().max() < 0.1  # (bfloat16 dense vs float64 dense: the model's own rounding)


def test_raw_bfloat16_sparse_logits_would_miss_the_tolerance_and_are_refused():
    """The wrong storage (raw bfloat16 logits instead of float16 logits - max) is off by more than the
    tolerance on logits far from 0, and ``kept_acceptance`` refuses it outright."""
    sparse, dense = _pair()
    ref = exact_acceptance(sparse, dense)
    wrong = exact_acceptance(sparse.to(torch.bfloat16).double(), dense)
    assert (wrong - ref).abs().max() > 10 * TOL
    with pytest.raises(ValueError, match="compact_rows dtype"):
        kept_acceptance(sparse.to(torch.bfloat16), dense)


def test_an_off_by_one_row_would_miss_the_tolerance():
    sparse, dense = _pair()
    ref = exact_acceptance(sparse, dense)
    shifted = kept_acceptance(compact_logits(sparse[1:].float()), dense[:-1].float())
    assert (shifted.double() - ref[:-1]).abs().max() > 10 * TOL


# --- the payload ------------------------------------------------------------------------------------
def test_the_payload_round_trips_and_is_checked_against_the_kept_positions():
    kept = KeptPositions(2, 4)
    result = KeptAcceptance(np.array([2, 10]), np.array([0.9, 0.75]), missing=(6,))
    back = KeptAcceptance.from_dict(result.to_dict(), kept, n_generated=12)
    assert back.positions.tolist() == [2, 10] and back.acceptance.tolist() == [0.9, 0.75] and back.missing == (6,)
    with pytest.raises(ValueError, match="positions"):
        KeptAcceptance.from_dict({"positions": [3], "acceptance": [0.5]}, kept, 12)  # not kept: off by one
    with pytest.raises(ValueError, match="positions"):
        KeptAcceptance.from_dict({"positions": [14], "acceptance": [0.5]}, kept, 12)  # past the completion
    with pytest.raises(ValueError, match="acceptance"):
        KeptAcceptance.from_dict({"positions": [2], "acceptance": [1.5]}, kept, 12)
    with pytest.raises(ValueError, match="same"):
        KeptAcceptance(np.array([2]), np.array([0.5, 0.5]))


# --- the wire ----------------------------------------------------------------------------------------
def test_the_wire_carries_kept_positions_and_the_verify_request():
    kept = KeptPositions(5, 16)
    assert exact_wire.decode_keep(exact_wire.encode_keep(kept)) == kept
    assert exact_wire.decode_keep(None) is None and exact_wire.decode_keep({"other": 1}) is None
    verify = exact_wire.ExactVerify("r1", prompt_len=7, n_generated=40, kept=kept)
    assert exact_wire.decode_verify(exact_wire.encode_verify(verify)) == verify
    assert verify.row_position(0) == 6  # the last prompt position predicts generated token 0
    with pytest.raises(ValueError, match="stride"):
        exact_wire.decode_keep({exact_wire.KEEP_PARAM: {"offset": 0, "stride": 0}})
    with pytest.raises(ValueError, match="prompt_len"):
        exact_wire.decode_verify({exact_wire.VERIFY_PARAM: {"rid": "r", "prompt_len": 0, "n_generated": 3,
                                                            "offset": 0, "stride": 4}})
    with pytest.raises(ValueError, match="rid"):
        exact_wire.ExactVerify("", 3, 3, kept)
