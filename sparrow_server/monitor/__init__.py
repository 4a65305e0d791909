"""Dense verification of sparse rollouts and the live tail-mismatch metrics.

- ``scoring``: per-token acceptance of one finished rollout against the dense, adapter-free
  policy (exact from two teacher-forced forwards, or the top-k lower bound from recorded top-k);
- ``verifier``: ``DenseVerifier``, which samples finished rollouts and scores them on a
  background thread, off the decode path;
- ``metrics``: the Prometheus metrics of ``docs/metrics.md`` ("Tail mismatch").
"""
from sparrow_server.monitor.metrics import ACCEPTANCE_BUCKETS, AcceptanceMetrics
from sparrow_server.monitor.scoring import (
    AcceptanceScores,
    HFScorer,
    completion_basis_lengths,
    score_rollout,
)
from sparrow_server.monitor.verifier import (
    DEFAULT_RECORD_TOPK,
    DEFAULT_SAMPLE_FRACTION,
    DenseVerifier,
    VerificationJob,
    VerificationResult,
)

__all__ = [
    "ACCEPTANCE_BUCKETS", "AcceptanceMetrics", "AcceptanceScores", "HFScorer", "completion_basis_lengths",
    "score_rollout", "DEFAULT_RECORD_TOPK", "DEFAULT_SAMPLE_FRACTION", "DenseVerifier", "VerificationJob",
    "VerificationResult",
]
