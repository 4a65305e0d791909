"""Calibration: sparse rollouts at fixed budgets, dense verification, p5 per (budget, length bin)
with bootstrap intervals, the cheapest feasible non-decreasing schedule, and a report folder."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparrow_server.lazy_exports import lazy_getattr

# Public name -> defining module, imported on first use: ``sparrow-server calibrate --help``
# reads the defaults in ``pipeline`` without torch.
_EXPORTS = {
    "sparrow_server.calibrate.pipeline": ("BudgetMeasurement", "CalibrationConfig", "CalibrationResult",
                                          "fixed_budget_schedule", "measure_budget", "run_calibration"),
    "sparrow_server.calibrate.prompts": ("PromptError", "load_prompts"),
    "sparrow_server.calibrate.sources": ("EngineRolloutSource", "Rollout", "ServerRolloutSource"),
}
__all__ = [name for names in _EXPORTS.values() for name in names]

if TYPE_CHECKING:  # the same names, for type checkers and the layering test
    from sparrow_server.calibrate.pipeline import (
        BudgetMeasurement, CalibrationConfig, CalibrationResult, fixed_budget_schedule, measure_budget,
        run_calibration,
    )
    from sparrow_server.calibrate.prompts import PromptError, load_prompts
    from sparrow_server.calibrate.sources import EngineRolloutSource, Rollout, ServerRolloutSource


__getattr__ = lazy_getattr(__name__, _EXPORTS)
