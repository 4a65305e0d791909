"""Trainer client for Sparrow Server: sync (``SparrowClient``) and async (``AsyncSparrowClient``),
streaming iterators, a concurrency-limited batch helper with retries (idempotent by ``rid``),
typed results, and the importance-weight / acceptance helpers."""
from sparrow_server.client.aio import AsyncSparrowClient
from sparrow_server.client.common import RetryPolicy, generate_payload, rollout_payload
from sparrow_server.client.helpers import acceptance_estimate, sampled_acceptance, truncated_importance_weights
from sparrow_server.client.sync import SparrowClient
from sparrow_server.client.types import (
    RolloutEvent, RolloutMeta, RolloutResult, SparrowError, results_from_events, results_from_json,
)

__all__ = [
    "SparrowClient", "AsyncSparrowClient", "RetryPolicy", "RolloutEvent", "RolloutMeta", "RolloutResult",
    "SparrowError", "generate_payload", "rollout_payload", "results_from_events", "results_from_json", "truncated_importance_weights",
    "sampled_acceptance", "acceptance_estimate",
]

# Fleet-wide weight updates between RL steps (update_weights / pause / resume on a list of servers).
from sparrow_server.client.weights import (  # noqa: E402
    FleetError, async_pause, async_resume, async_update_weights, pause, resume, update_weights,
)

__all__ += ["update_weights", "pause", "resume", "async_update_weights", "async_pause", "async_resume", "FleetError"]
# The fleet's default schedule (for trainers that cannot name one per request).
from sparrow_server.client.default_schedule import async_set_default_schedule, set_default_schedule  # noqa: E402

__all__ += ["set_default_schedule", "async_set_default_schedule"]
# Weights from the trainer's memory over a process group (SGLang's update_weights_from_distributed).
from sparrow_server.client.weight_broadcast import BroadcastConfig, WeightBroadcaster  # noqa: E402

__all__ += ["BroadcastConfig", "WeightBroadcaster"]
