"""Schedule autopilot: find and hold, live, the cheapest budgets that keep the tail at the target.

- ``controller``: the pure controller (verified per-bin acceptance in, next budgets out);
- ``history``: versioned schedule changes with their evidence, persisted as JSON lines.
"""
from sparrow_server.autopilot.controller import (
    AutopilotConfig,
    AutopilotConfigError,
    BinEvidence,
    BudgetChange,
    BudgetController,
    quantile_interval,
)

__all__ = ["AutopilotConfig", "AutopilotConfigError", "BinEvidence", "BudgetChange", "BudgetController",
           "quantile_interval"]
