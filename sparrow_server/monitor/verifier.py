"""``DenseVerifier``: re-score a sample of finished rollouts densely, off the decode path.

Each finished rollout is verified when its request asked (``verify: true``) or, otherwise, with
probability ``sample_fraction`` (default 5%). The decision is made at admission
(``should_verify``), so the engine records the sparse top-k (``record_topk``) only for verified
requests. Scoring runs on one background thread; a sampled job is dropped (and counted) when
``max_pending`` jobs already wait, so verification never queues without bound; a requested job
is always accepted. Results feed ``AcceptanceMetrics`` and, for requested jobs, the response's
``meta`` (``VerificationResult.meta()``).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from sparrow_server.monitor.metrics import AcceptanceMetrics
from sparrow_server.monitor.scoring import EXACT, TOPK_LOWER_BOUND, AcceptanceScores, score_rollout
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.exact_wire import BOUND_TOPK
from sparrow_server.stats.exact_subsample import KeptPositions, choose_kept_positions

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_FRACTION = 0.05
DEFAULT_RECORD_TOPK = BOUND_TOPK  # the paper's trainer compares top-20 lists
DEFAULT_MAX_PENDING = 32


@dataclass(frozen=True)
class VerificationJob:
    """One finished rollout to re-score.

    ``temperature``: the temperature its logprobs are at (1 for a greedy request, as SGLang reports).
    The sparse side is, in order of preference: ``sparse_logits`` (full, [N, V]), ``sparse_topk``
    (recorded ([N, K] ids, [N, K] logprobs), giving the top-k lower bound), or neither, in which
    case the scorer recomputes it exactly with a teacher-forced sparse forward (reference engine).
    """

    rid: str
    schedule: Schedule
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    temperature: float
    adapter: str | None = None
    sparse_topk: tuple[Any, Any] | None = None
    sparse_logits: Any = None
    requested: bool = False  # verify: true (never dropped)
    weight_version: str | None = None  # the weights the rollout ran on (None: do not check)
    exact_keep: KeptPositions | None = None  # positions whose sparse row the engine kept (exact on a subsample)


class StaleVerificationError(RuntimeError):
    """The server's weights changed between the rollout and its dense pass: the result would compare
    the rollout against another policy, so it is dropped (counted in ``DenseVerifier.stale``)."""


@dataclass(frozen=True)
class VerificationResult:
    rid: str
    schedule: str
    scores: AcceptanceScores
    elapsed_s: float
    kept: KeptPositions | None = None  # the exact subsample's positions (None: none, or every position)

    @property
    def p5(self) -> float:
        return self.scores.p5

    @property
    def mean(self) -> float:
        return self.scores.mean

    def meta(self) -> dict[str, Any]:
        """Fields a verified request's response ``meta`` carries."""
        out = {"acceptance_p5": self.p5, "acceptance_mean": self.mean, "acceptance_kind": self.scores.evidence_kind,
               "verified_tokens": self.scores.n_tokens}
        if self.scores.has_exact_subsample:  # the top-k bound of the same positions stays reported, as what it is
            out.update(acceptance_lower_bound_p5=self.scores.bound_p5, exact_missing_tokens=len(self.scores.exact.missing))
            if self.kept is not None:  # the evidence itself: which positions, and their exact values
                out["exact_subsample"] = {**self.kept.to_dict(), **self.scores.exact.to_dict()}
        return out


def topk_tensors(rows: list[list[tuple[float, int]]], k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token ``[(logprob, id), ...]`` -> ([N, K] ids, [N, K] logprobs), -1 / -inf padded; K is ``k`` (longer
    rows cut) or the longest row. One array conversion, not an element at a time (``benchmarks/topk_conversion.py``)."""
    k = max((len(r) for r in rows), default=0) if k is None else k
    pad = [(float("-inf"), -1)]
    table = np.asarray([[*r[:k], *pad * (k - len(r[:k]))] for r in rows], dtype=np.float64).reshape(len(rows), k, 2)
    return torch.from_numpy(table[..., 1].astype(np.int64)), torch.from_numpy(np.ascontiguousarray(table[..., 0]))


def topk_from_chunks(top_logprobs: list[tuple[tuple[float, int], ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine top-logprobs (per token ``((logprob, id), ...)``) -> ([N, K] ids, [N, K] logprobs), -1 padded."""
    return topk_tensors([list(t) for t in top_logprobs])


class DenseVerifier:
    """Samples finished rollouts and scores them on a background thread (see the module docstring).

    ``scorer``: an ``HFScorer`` (or anything with its ``exact`` and ``dense_topk`` methods; with
    ``exact_stride`` > 0, ``dense_exact``). ``record_topk``: how many sparse top logprobs the engine
    records per token for a verified request (>= 20 for the top-k lower bound, as the paper's trainer);
    0 when the scorer recomputes the sparse side exactly (reference engine) or gets exact values on the
    kept positions (``exact_stride`` > 0: SGLang), so nothing is recorded.
    """

    def __init__(self, scorer: Any, metrics: AcceptanceMetrics | None = None,
                 sample_fraction: float = DEFAULT_SAMPLE_FRACTION, record_topk: int = DEFAULT_RECORD_TOPK,
                 max_pending: int = DEFAULT_MAX_PENDING, seed: int | None = None,
                 weight_version: Callable[[], str | None] | None = None, exact_stride: int = 0):
        if not 0.0 <= sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction = {sample_fraction!r}: must be in [0, 1]")
        if record_topk < 0:
            raise ValueError(f"record_topk = {record_topk!r}: must be >= 0 (0: exact, nothing recorded)")
        if max_pending < 1:
            raise ValueError(f"max_pending = {max_pending!r}: must be >= 1")
        if isinstance(exact_stride, bool) or not isinstance(exact_stride, int) or exact_stride < 0:
            raise ValueError(f"exact_stride = {exact_stride!r}: must be an integer >= 0 (0: no exact subsample)")
        self.exact_stride = exact_stride
        self.scorer = scorer
        self.metrics = metrics
        self.sample_fraction = sample_fraction
        self.record_topk = record_topk
        self.max_pending = max_pending
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._pending = 0
        self.dropped = 0
        self.stale = 0
        # The weight version the dense pass ran on, read after scoring: a job whose rollout ran on other
        # weights is dropped (a swap before or during scoring shows here).
        self.weight_version = weight_version
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparrow-verifier")
        # Called with (job, scores) after each scored rollout, on the verifier's thread (the schedule autopilot).
        self.listeners: list[Callable[[VerificationJob, AcceptanceScores], None]] = []

    @property
    def acceptance_kind(self) -> str:
        """What this verifier measures: exact (on every token, or on the kept positions), else the top-k lower
        bound from the sparse top-k the engine records."""
        return TOPK_LOWER_BOUND if self.record_topk and not self.exact_stride else EXACT

    def choose_kept(self) -> KeptPositions | None:
        """At admission of a verified request: the positions whose sparse rows the engine keeps (every
        ``exact_stride``-th from a random offset, chosen before any token), or None without a subsample."""
        if not self.exact_stride:
            return None
        with self._lock:
            return choose_kept_positions(self.exact_stride, self._rng)

    def should_verify(self, requested: bool) -> bool:
        """Decide at admission: always when requested, else with probability ``sample_fraction``."""
        if requested:
            return True
        with self._lock:
            return self._rng.random() < self.sample_fraction

    def score(self, job: VerificationJob) -> VerificationResult:
        """Score synchronously (on the calling thread) and record the metrics."""
        start = time.monotonic()
        try:
            scores = score_rollout(self.scorer, job.prompt_ids, job.completion_ids, job.schedule, job.temperature,
                                   job.adapter, job.sparse_topk, job.sparse_logits, job.rid, job.exact_keep)
        except Exception:
            if self.metrics is not None:  # counted, then reported (the response's acceptance_error, the log)
                self.metrics.unscored(job.schedule, len(job.completion_ids))
            raise
        self._check_weights(job)
        result = VerificationResult(job.rid, job.schedule.name, scores, time.monotonic() - start, job.exact_keep)
        if self.metrics is not None:
            # Only evidence of this verifier's kind enters the windows: a lower bound is never mixed into
            # exact windows (it is counted instead).
            if scores.evidence_kind == self.acceptance_kind:
                self.metrics.observe(job.schedule, scores.evidence_acceptance, scores.evidence_basis_lengths)
            else:
                self.metrics.unscored(job.schedule, len(job.completion_ids))
            if scores.exact is not None:
                self.metrics.exact_missing(job.schedule, len(scores.exact.missing))
        for listener in self.listeners:
            listener(job, scores)
        return result

    def _check_weights(self, job: VerificationJob) -> None:
        current = self.weight_version() if self.weight_version is not None else None
        if job.weight_version is None or current is None or current == job.weight_version:
            return
        with self._lock:
            self.stale += 1
        raise StaleVerificationError(f"rollout {job.rid} ran on weights {job.weight_version!r}, the dense pass on "
                                     f"{current!r}: not scored")

    def submit(self, job: VerificationJob) -> Future | None:
        """Queue a job for the background thread; ``None`` when a sampled job is dropped (backlog full)."""
        with self._lock:
            if not job.requested and self._pending >= self.max_pending:
                self.dropped += 1
                return None
            self._pending += 1
        future = self._executor.submit(self.score, job)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending -= 1
        if future.cancelled():  # close(wait=False) at shutdown cancels the jobs still queued
            return
        exc = future.exception()
        if isinstance(exc, StaleVerificationError):
            log.info("%s", exc)
        elif exc is not None:
            log.error("dense verification failed: %s: %s", type(exc).__name__, exc)

    @property
    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=not wait)


__all__ = [
    "DenseVerifier", "VerificationJob", "VerificationResult", "StaleVerificationError", "topk_from_chunks", "topk_tensors", "DEFAULT_SAMPLE_FRACTION",
    "DEFAULT_RECORD_TOPK", "DEFAULT_MAX_PENDING",
]
