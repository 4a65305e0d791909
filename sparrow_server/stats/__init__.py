"""Acceptance statistics: per-token acceptance, per-bin tail quantiles, Beta tail fit, rolling p5."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparrow_server.lazy_exports import lazy_getattr

# Public name -> defining module, imported on first use: the numpy-only modules (``tail``,
# ``rolling``, ``beta``) and their importers (calibration, the CLI) do not pay for torch.
_EXPORTS = {
    "sparrow_server.stats.acceptance": ("compact_logits", "exact_acceptance", "logits_to_topk", "sampled_acceptance",
                                        "topk_acceptance_lower_bound", "topk_acceptance_upper_bound",
                                        "truncated_importance_weights"),
    "sparrow_server.stats.acceptance_bounds": ("residual_sampled_estimate", "sparse_topk_dense_full_bounds",
                                               "topk_acceptance_bounds"),
    "sparrow_server.stats.beta": ("BetaTailFit", "fit_beta_tail"),
    "sparrow_server.stats.exact_subsample": ("KeptAcceptance", "KeptPositions", "choose_kept_positions",
                                             "kept_acceptance"),
    "sparrow_server.stats.rolling": ("RollingQuantile", "RollingTailMonitor"),
    "sparrow_server.stats.tail": ("BinQuantile", "QuantileBracket", "binned_quantile_brackets", "binned_quantiles",
                                  "bootstrap_quantile_ci", "length_bins", "quantile_interval",
                                  "quantile_order_interval", "subsample_bounds_quantile"),
}
__all__ = [name for names in _EXPORTS.values() for name in names]

if TYPE_CHECKING:  # the same names, for type checkers and the layering test
    from sparrow_server.stats.acceptance import (
        compact_logits, exact_acceptance, logits_to_topk, sampled_acceptance, topk_acceptance_lower_bound,
        topk_acceptance_upper_bound, truncated_importance_weights,
    )
    from sparrow_server.stats.acceptance_bounds import (
        residual_sampled_estimate, sparse_topk_dense_full_bounds, topk_acceptance_bounds,
    )
    from sparrow_server.stats.beta import BetaTailFit, fit_beta_tail
    from sparrow_server.stats.exact_subsample import (
        KeptAcceptance, KeptPositions, choose_kept_positions, kept_acceptance,
    )
    from sparrow_server.stats.rolling import RollingQuantile, RollingTailMonitor
    from sparrow_server.stats.tail import (
        BinQuantile, QuantileBracket, binned_quantile_brackets, binned_quantiles, bootstrap_quantile_ci, length_bins,
        quantile_interval, quantile_order_interval, subsample_bounds_quantile,
    )


__getattr__ = lazy_getattr(__name__, _EXPORTS)
