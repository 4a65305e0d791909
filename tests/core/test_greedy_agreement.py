"""The GPU tests' comparison (sparrow_server/stats/greedy_agreement.py) on made-up runs: what it accepts and what it
refuses, so a GPU test built on it can fail."""
from __future__ import annotations

import random

import numpy as np

from sparrow_server.stats.greedy_agreement import Run, agreement_problems, exact_problems, informative_problems, \
    run_from_outputs, run_from_rollouts


def _run(seed: int, n_req: int = 4, length: int = 48) -> Run:
    rng = random.Random(seed)
    tokens = [[rng.randrange(4096) for _ in range(length)] for _ in range(n_req)]
    lps = [[-rng.random() for _ in range(length)] for _ in range(n_req)]
    gaps = [[0.5 + 3 * rng.random() for _ in range(length)] for _ in range(n_req)]
    return Run(tokens, lps, gaps)


def _with(run: Run, req: int, pos: int, token=None, lp_shift=0.0) -> Run:
    tokens = [list(t) for t in run.tokens]
    lps = [list(x) for x in run.logprobs]
    if token is not None:
        tokens[req][pos:] = [token + i for i in range(len(tokens[req]) - pos)]
    for i in range(pos, len(lps[req])):
        lps[req][i] += lp_shift
    return Run(tokens, lps, run.top2_gap)


def test_identical_runs_agree():
    a = _run(0)
    assert agreement_problems(a, a) == []


def test_rounding_noise_and_a_few_flipped_positions_agree():
    a = _run(0)
    rng = random.Random(1)
    lps = [[x + rng.uniform(-0.02, 0.02) for x in row] for row in a.logprobs]
    lps[1][10] += 0.9  # one position moved by a flipped page selection
    assert agreement_problems(a, Run(a.tokens, lps, a.top2_gap)) == []


def test_a_divergence_at_a_near_tie_is_excused_but_not_at_a_clear_margin():
    a = _run(0)
    gaps = [list(g) for g in a.top2_gap]
    gaps[2][40] = 0.05
    a = Run(a.tokens, a.logprobs, gaps)
    assert agreement_problems(a, _with(a, 2, 40, token=5000)) == []
    gaps[2][40] = 2.0
    a = Run(a.tokens, a.logprobs, gaps)
    assert any("diverge at 40" in p for p in agreement_problems(a, _with(a, 2, 40, token=5000)))


def test_a_shifted_request_fails_even_when_its_tokens_agree():
    """What another request's schedule or a wrong page does: every position of one request moves."""
    a = _run(0)
    problems = agreement_problems(a, _with(a, 3, 1, lp_shift=0.3))
    assert len(problems) == 1 and problems[0].startswith("request 3")


def test_early_divergences_everywhere_fail():
    a = _run(0)
    gaps = [[0.0] * 48 for _ in range(4)]  # every position a tie: each divergence is excused ...
    a = Run(a.tokens, a.logprobs, gaps)
    b = a
    for r in range(4):
        b = _with(b, r, 5, token=9000)
    assert any("precede a divergence" in p for p in agreement_problems(a, b))  # ... but too little is compared


def test_unknown_gaps_excuse_no_divergence_and_shorter_runs_diverge():
    a = _run(0)
    bare = Run(a.tokens, a.logprobs)
    assert agreement_problems(bare, _with(bare, 0, 47, token=9000))
    short = Run([t[:40] for t in a.tokens], [x[:40] for x in a.logprobs])
    assert any("diverge at 40" in p for p in agreement_problems(bare, short))


def test_informative_refuses_repeated_tokens():
    a = _run(0)
    assert informative_problems(a, 20, 4) == []
    flat = Run([[7] * 48 for _ in range(4)], a.logprobs)
    assert len(informative_problems(flat, 20, 4)) == 2


def test_run_from_sglang_outputs():
    outs = [{"output_ids": [5, 6], "meta_info": {
        "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None]],
        "output_top_logprobs": [[[-0.1, 5, None], [-2.6, 9, None]], [[-0.2, 6, None], [-0.3, 1, None]]]}}]
    run = run_from_outputs(outs)
    assert run.tokens == [[5, 6]] and run.logprobs == [[-0.1, -0.2]]
    assert [round(g, 6) for g in run.top2_gap[0]] == [2.5, 0.1]


def test_run_from_rollouts():
    outs = [{"token_ids": [5, 6], "logprobs": [-0.1, -0.2], "top_logprobs": [[[-0.1, 5], [-2.6, 9]], [[-0.2, 6], [-0.3, 1]]]}]
    run = run_from_rollouts(outs)
    assert run.tokens == [[5, 6]] and run.logprobs == [[-0.1, -0.2]]
    assert [round(g, 6) for g in run.top2_gap[0]] == [2.5, 0.1]
    assert run_from_rollouts([{"token_ids": [5], "logprobs": [-0.1]}]).top2_gap == []


def test_exact_accepts_only_bit_equal_runs():
    """Deterministic inference's rule: what the tolerance excuses (rounding noise, a near-tie divergence)
    is a difference here, named by request, field and first position."""
    a = _run(0)
    assert exact_problems(a, Run([list(t) for t in a.tokens], [list(x) for x in a.logprobs],
                                 [list(g) for g in a.top2_gap])) == []
    ulp = Run(a.tokens, [list(x) for x in a.logprobs], a.top2_gap)
    ulp.logprobs[2][30] = float(np.nextafter(ulp.logprobs[2][30], 0.0))
    assert agreement_problems(a, ulp) == []
    assert exact_problems(a, ulp) == [f"request 2: logprobs differ from position 30 ({a.logprobs[2][30]!r} vs "
                                      f"{ulp.logprobs[2][30]!r}; 48 vs 48 positions)"]
    tie = _with(a, 1, 47, token=5000)
    assert exact_problems(a, tie) == ["request 1: tokens differ from position 47 (" + repr(a.tokens[1][47])
                                      + " vs 5000; 48 vs 48 positions)"]
    gaps = Run(a.tokens, a.logprobs, [list(g) for g in a.top2_gap])
    gaps.top2_gap[0][3] += 1e-9
    assert [p.split(":")[1].strip().split(" ")[0] for p in exact_problems(a, gaps)] == ["top-2"]
    assert exact_problems(a, Run(a.tokens, a.logprobs)) == []  # gaps compared only where both runs have them
    short = Run([t[:40] for t in a.tokens], [x[:40] for x in a.logprobs])
    assert len(exact_problems(Run(a.tokens, a.logprobs), short)) == 8 and "end; 48 vs 40" in exact_problems(
        Run(a.tokens, a.logprobs), short)[0]
    assert exact_problems(a, a.select([0, 1])) == ["4 vs 2 requests"]
