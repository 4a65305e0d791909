"""Agreement of two greedy runs of the same prompts, with the tolerance bf16 explains.

Two servers (or one server twice) decoding the same prompts greedily in bf16 need not give the same
tokens: batch composition, the all-reduce order of tensor parallelism or a weight update's path move
logits by a rounding step, and where the top two tokens are (nearly) tied greedy decoding parts. This
module says whether two runs differ only that way; the GPU tests, the fleet benchmark and the weight
update checks use it.

A run is, per request, the generated tokens, the chosen tokens' logprobs and the gap between the
best and second-best logprob at each position (``/generate`` with ``return_logprob`` and
``top_logprobs_num: 2``). Two runs that should be the same computation up to bf16 rounding (a
request alone vs in a batch, CUDA graph on vs off, TP 2 vs TP 1, the dense schedule vs stock
attention) must agree:

- tokens: equal up to each request's first divergence, and a divergence only where the reference
  run's top-2 gap there is within ``tie_nats`` (rounding can swap a near-tie, nothing else);
- logprobs, on the positions before the divergence: per request, median |difference| <=
  ``median_nats`` and 90th percentile <= ``p90_nats``. bf16 logits of magnitude 16-32 are spaced
  0.125-0.25 apart, and a page selection flipped by rounding moves a few positions by up to ~1 nat
  (CPU float32 vs bf16 on the tiny model: p99 0.70 nats, benchmarks/results/gpu_suite/cpu_probe.log),
  so single positions are not required to agree; a bug that changes what a request attends (another
  request's schedule, a wrong page or KV head) moves the median of every affected request (sparse vs
  dense: ~0.2 nats median);
- at least ``min_compared`` of all positions are compared (divergences late or absent).

``informative`` is the other half: a comparison of degenerate runs (one token repeated, sparse
equal to dense) proves nothing, so each test also asserts its runs could differ.

Under SGLang's deterministic inference (``--enable-deterministic-inference``, with which the sparrow
backend plans its sparse decode batch-invariantly: ``sglang_plugin/scheduler/determinism.py``) none of
that rounding is left: the same request gives the same tokens, logprobs and top-2 gaps bit for bit
alone or in any batch, and ``exact_problems`` demands exactly that (the fleet benchmark's rule with the
flag; the tolerance above is its rule without it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

MEDIAN_NATS = 0.05
P90_NATS = 0.5
TIE_NATS = 1.0
MIN_COMPARED = 0.5


@dataclass(frozen=True)
class Run:
    tokens: list[list[int]]
    logprobs: list[list[float]]
    top2_gap: list[list[float]] = field(default_factory=list)  # empty: unknown (then no divergence is excused)

    def select(self, rows: Sequence[int]) -> "Run":
        pick = lambda xs: [xs[i] for i in rows] if xs else []
        return Run(pick(self.tokens), pick(self.logprobs), pick(self.top2_gap))

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "logprobs": self.logprobs, "top2_gap": self.top2_gap}


def _gap(top: Sequence[Sequence[Any]] | None) -> float:
    vals = sorted((float(t[0]) for t in (top or []) if t and t[0] is not None), reverse=True)
    return vals[0] - vals[1] if len(vals) >= 2 else float("inf")


def run_from_outputs(outs: Sequence[dict]) -> Run:
    """A ``Run`` from SGLang ``/generate`` results (``meta_info.output_token_logprobs`` and, when
    asked, ``output_top_logprobs``)."""
    tokens, lps, gaps = [], [], []
    for o in outs:
        meta = o["meta_info"]
        tokens.append(list(o["output_ids"]))
        lps.append([float(x[0]) for x in meta["output_token_logprobs"]])
        top = meta.get("output_top_logprobs")
        if top:
            gaps.append([_gap(t) for t in top])
    return Run(tokens, lps, gaps if len(gaps) == len(tokens) else [])


def run_from_rollouts(outs: Sequence[dict]) -> Run:
    """A ``Run`` from ``/rollout`` results (``logprobs`` and, when asked with ``top_logprobs`` >= 2,
    ``top_logprobs`` as ``[[logprob, token], ...]`` per position)."""
    tops = [o.get("top_logprobs") for o in outs]
    gaps = [[_gap(t) for t in top] for top in tops if top]
    return Run([list(o["token_ids"]) for o in outs], [[float(x) for x in o["logprobs"]] for o in outs],
               gaps if len(gaps) == len(outs) else [])


@dataclass(frozen=True)
class RequestAgreement:
    first_divergence: int       # = length when the tokens never diverge
    length: int
    gap_at_divergence: float | None
    median_abs_lp: float
    p90_abs_lp: float
    max_abs_lp: float


def _request(ref_tokens, ref_lp, ref_gap, got_tokens, got_lp) -> RequestAgreement:
    n, length = min(len(ref_tokens), len(got_tokens)), max(len(ref_tokens), len(got_tokens))
    first = next((i for i in range(n) if ref_tokens[i] != got_tokens[i]), n)  # a shorter run diverges at its end
    d = np.abs(np.asarray(ref_lp[:first], dtype=np.float64) - np.asarray(got_lp[:first], dtype=np.float64))
    gap = None
    if first < length:
        gap = float(ref_gap[first]) if first < len(ref_gap) else float("inf")
    q = lambda p: float(np.quantile(d, p)) if d.size else 0.0
    return RequestAgreement(first, length, gap, q(0.5), q(0.9), float(d.max()) if d.size else 0.0)


def agreement(ref: Run, got: Run) -> list[RequestAgreement]:
    if len(ref.tokens) != len(got.tokens):
        raise ValueError(f"{len(ref.tokens)} vs {len(got.tokens)} requests")
    gaps = ref.top2_gap or [[] for _ in ref.tokens]
    return [_request(rt, rl, rg, gt, gl)
            for rt, rl, rg, gt, gl in zip(ref.tokens, ref.logprobs, gaps, got.tokens, got.logprobs)]


def agreement_problems(ref: Run, got: Run, median_nats: float = MEDIAN_NATS, p90_nats: float = P90_NATS,
                       tie_nats: float = TIE_NATS, min_compared: float = MIN_COMPARED) -> list[str]:
    """What breaks the tolerance (empty when the runs agree)."""
    rows = agreement(ref, got)
    problems = []
    for i, a in enumerate(rows):
        if a.gap_at_divergence is not None and not a.gap_at_divergence <= tie_nats:
            problems.append(f"request {i}: tokens diverge at {a.first_divergence} where the top-2 gap is "
                            f"{a.gap_at_divergence:.3f} > {tie_nats} nats")
        if a.median_abs_lp > median_nats or a.p90_abs_lp > p90_nats:
            problems.append(f"request {i}: |logprob difference| median {a.median_abs_lp:.4f} (<= {median_nats}), "
                            f"p90 {a.p90_abs_lp:.4f} (<= {p90_nats}) over {a.first_divergence} positions")
    compared = sum(a.first_divergence for a in rows) / max(sum(a.length for a in rows), 1)
    if compared < min_compared:
        problems.append(f"only {compared:.2f} of the positions precede a divergence (>= {min_compared})")
    return problems


def summary(ref: Run, got: Run) -> dict:
    rows = agreement(ref, got)
    return {"first_divergence": [a.first_divergence for a in rows],
            "gap_at_divergence": [a.gap_at_divergence for a in rows],
            "median_abs_lp": [round(a.median_abs_lp, 5) for a in rows],
            "p90_abs_lp": [round(a.p90_abs_lp, 5) for a in rows],
            "max_abs_lp": [round(a.max_abs_lp, 5) for a in rows]}


def assert_agree(ref: Run, got: Run, what: str, **tolerance: float) -> None:
    problems = agreement_problems(ref, got, **tolerance)
    assert not problems, f"{what}: " + "; ".join(problems) + f" | {summary(ref, got)}"


def _first_difference(a: Sequence, b: Sequence) -> int | None:
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), n)
    return None if first == n and len(a) == len(b) else first


def exact_problems(ref: Run, got: Run) -> list[str]:
    """What differs between two runs that must be one computation bit for bit: per request, the first
    position whose token, logprob or top-2 gap (where both runs have them) is not equal (empty: equal)."""
    if len(ref.tokens) != len(got.tokens):
        return [f"{len(ref.tokens)} vs {len(got.tokens)} requests"]
    problems = []
    both_gaps = bool(ref.top2_gap) and bool(got.top2_gap)
    for i in range(len(ref.tokens)):
        fields = [("token", ref.tokens[i], got.tokens[i]), ("logprob", ref.logprobs[i], got.logprobs[i])]
        if both_gaps:
            fields.append(("top-2 gap", ref.top2_gap[i], got.top2_gap[i]))
        for name, a, b in fields:
            k = _first_difference(a, b)
            if k is not None:
                at = lambda xs: repr(xs[k]) if k < len(xs) else "end"
                problems.append(f"request {i}: {name}s differ from position {k} ({at(a)} vs {at(b)}; "
                                f"{len(a)} vs {len(b)} positions)")
    return problems


def assert_equal(ref: Run, got: Run, what: str) -> None:
    problems = exact_problems(ref, got)
    assert not problems, f"{what}: " + "; ".join(problems) + f" | {summary(ref, got)}"


def informative_problems(run: Run, min_distinct_total: int, min_distinct_per_request: int) -> list[str]:
    """A run whose requests repeat one token cannot tell a wrong page from a right one."""
    per = [len(set(t)) for t in run.tokens]
    total = len({x for t in run.tokens for x in t})
    problems = []
    if total < min_distinct_total:
        problems.append(f"{total} distinct tokens in the batch (< {min_distinct_total})")
    if per and min(per) < min_distinct_per_request:
        problems.append(f"distinct tokens per request {per} (each >= {min_distinct_per_request})")
    return problems
