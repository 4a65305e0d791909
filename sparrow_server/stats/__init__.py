"""Acceptance statistics: per-token acceptance, per-bin tail quantiles, Beta tail fit, rolling p5."""
from sparrow_server.stats.acceptance import (
    exact_acceptance, logits_to_topk, sampled_acceptance, topk_acceptance_lower_bound, topk_acceptance_upper_bound,
    truncated_importance_weights,
)
from sparrow_server.stats.beta import BetaTailFit, fit_beta_tail
from sparrow_server.stats.rolling import RollingQuantile, RollingTailMonitor
from sparrow_server.stats.tail import BinQuantile, binned_quantiles, bootstrap_quantile_ci, length_bins

__all__ = [
    "exact_acceptance", "logits_to_topk", "sampled_acceptance", "topk_acceptance_lower_bound", "topk_acceptance_upper_bound",
    "truncated_importance_weights", "BetaTailFit", "fit_beta_tail", "RollingQuantile", "RollingTailMonitor",
    "BinQuantile", "binned_quantiles", "bootstrap_quantile_ci", "length_bins",
]
