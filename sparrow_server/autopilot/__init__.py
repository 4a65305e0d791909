"""Schedule autopilot: find and hold, live, the cheapest budgets that keep the tail at the target.

- ``controller``: the pure controller (verified per-bin acceptance in, next budgets out);
- ``history``: versioned schedule changes with their evidence, persisted as JSON lines;
- ``fleet``: one controller for several servers (``sparrow-server autopilot --servers``).
The server side (routes, metrics, the verifier hook) is ``sparrow_server/server/autopilot.py``.
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
