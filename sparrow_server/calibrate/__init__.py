"""Calibration: sparse rollouts at fixed budgets, dense verification, p5 per (budget, length bin)
with bootstrap intervals, the cheapest feasible non-decreasing schedule, and a report folder."""
from sparrow_server.calibrate.pipeline import (
    BudgetMeasurement, CalibrationConfig, CalibrationResult, fixed_budget_schedule, measure_budget, run_calibration,
)
from sparrow_server.calibrate.prompts import PromptError, load_prompts
from sparrow_server.calibrate.sources import EngineRolloutSource, Rollout, ServerRolloutSource

__all__ = [
    "BudgetMeasurement", "CalibrationConfig", "CalibrationResult", "fixed_budget_schedule", "measure_budget",
    "run_calibration", "PromptError", "load_prompts", "EngineRolloutSource", "Rollout", "ServerRolloutSource",
]
