"""``benchmarks/fidelity/paired_p5.py``: two configurations' p5 per length bin and the bootstrap interval of their
difference, on acceptance whose answer is known."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity" / "paired_p5.py"


def _script():
    spec = importlib.util.spec_from_file_location("paired_p5", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rollouts(rng, shift: float, n_rollouts: int = 6, tokens: int = 1100, prompt: int = 40):
    return [(np.clip(rng.uniform(0.5, 1.0, tokens) + shift, 0, 1), prompt + np.arange(tokens))
            for _ in range(n_rollouts)]


def test_a_shift_of_every_token_is_the_difference_and_its_interval():
    P = _script()
    base = _rollouts(np.random.default_rng(1), 0.0)
    other = [(np.clip(a - 0.1, 0, 1), n) for a, n in base]  # the same tokens, 0.1 lower (none clipped)
    rows = P.paired_rows(base, other, np.random.default_rng(0))
    assert len(rows) == 3  # bins from 0, 512, 1024 (the last: 116 tokens a rollout)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[4].startswith("-0.100 [-0.100, -0.100]"), row
        p5_base, p5_other = float(cells[2]), float(cells[3])
        assert abs(p5_base - p5_other - 0.1) < 1e-3


def test_a_bin_under_the_minimum_is_left_out_and_unpaired_noise_gets_an_interval():
    P = _script()
    rng = np.random.default_rng(2)
    base, other = _rollouts(rng, 0.0, tokens=1000), _rollouts(rng, 0.0, tokens=1000)
    rows = P.paired_rows(base, other, np.random.default_rng(0))
    assert [r.split("|")[1].strip() for r in rows] == ["0", "512"]  # bin 1024: 6 rollouts x 16 tokens < 100
    low, high = (float(x) for x in rows[0].split("[")[1].split("]")[0].split(","))
    assert low < 0 < high
