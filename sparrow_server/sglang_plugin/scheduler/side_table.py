"""Per-request schedules on the scheduler side, indexed by SGLang's KV row (``req_pool_idx``).

A hook on ``ReqToTokenPool.alloc`` calls ``ScheduleTable.assign`` for every request that gets a
row; the attention backend reads the table once per decode step (host side, no device sync).
Row 0 is SGLang's padding row (CUDA-graph dummy lanes point at it): it always holds ``dense``.
The table also accumulates the KV budget each row used, for per-request reporting.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Mapping

import numpy as np

from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity import wire
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

logger = logging.getLogger(__name__)


def schedule_from_custom_params(
    custom_params: Mapping[str, Any] | None, registry: ScheduleRegistry, default: Schedule
) -> Schedule:
    """The schedule a request asks for in ``sampling_params.custom_params`` (``sparsity.wire``);
    ``default`` if none. Raises ``ScheduleError`` / ``UnknownScheduleError`` on a bad value."""
    asked = wire.decode_schedule(custom_params)
    if asked is None:
        return default
    return registry.get(asked) if isinstance(asked, str) else asked


class ScheduleTable:
    """``req_pool_idx`` -> (schedule, prompt length), plus KV-budget accounting per row."""

    def __init__(self, num_rows: int, default: Schedule | None = None):
        if num_rows < 1:
            raise ValueError(f"num_rows={num_rows}: must be >= 1 (row 0 is the padding row)")
        self.default = default or dense_schedule()
        self._schedules: list[Schedule] = [dense_schedule(), self.default]
        self._slot_of: dict[Schedule, int] = {s: i for i, s in enumerate(self._schedules)}
        self.schedule_slot = np.full(num_rows, 1, dtype=np.int32)
        self.schedule_slot[0] = 0
        self.prompt_len = np.zeros(num_rows, dtype=np.int64)
        self.budget_token_sum = np.zeros(num_rows, dtype=np.int64)
        self.steps = np.zeros(num_rows, dtype=np.int64)
        self.clamped_steps = 0

    @property
    def num_rows(self) -> int:
        return int(self.schedule_slot.shape[0])

    def _slot(self, schedule: Schedule) -> int:
        slot = self._slot_of.get(schedule)
        if slot is None:
            stock = sorted(set(self.default.dense_layers) - set(schedule.dense_layers))
            if stock and not schedule.is_dense:  # extra dense layers are honoured; the server's stay dense
                logger.info("schedule %s keeps layers %s sparse, but this server runs them dense for every request "
                            "(its default schedule's dense layers %s, the stock path): they run dense for it",
                            schedule.id, stock, list(self.default.dense_layers))
            slot = len(self._schedules)
            self._schedules.append(schedule)
            self._slot_of[schedule] = slot
        return slot

    def assign(self, row: int, schedule: Schedule, prompt_len: int) -> None:
        """Give KV row ``row`` to a request; resets its budget accounting."""
        if not 0 < row < self.num_rows:
            raise ValueError(f"row={row}: must be in [1, {self.num_rows})")
        self.schedule_slot[row] = self._slot(schedule)
        self.prompt_len[row] = prompt_len
        self.budget_token_sum[row] = 0
        self.steps[row] = 0

    def schedule_of(self, row: int) -> Schedule:
        return self._schedules[int(self.schedule_slot[row])]

    def schedule_in(self, slot: int) -> Schedule:
        """The schedule of a slot (``schedule_slot`` values); a slot never changes schedule."""
        return self._schedules[slot]

    def record_step(self, rows: np.ndarray, budget_tokens: np.ndarray) -> None:
        """Accumulate one decode step's attended tokens per row (padding row 0 included, harmless)."""
        np.add.at(self.budget_token_sum, rows, budget_tokens)
        np.add.at(self.steps, rows, 1)

    def mean_budget_tokens(self, row: int) -> float | None:
        steps = int(self.steps[row])
        return None if steps == 0 else float(self.budget_token_sum[row]) / steps


NO_LORA_ID = "0"  # SGLang's ``Req.lora_id`` of a request without an adapter (nothing appended to extra_key)


def client_extra_key(req: Any) -> Any:
    """The ``extra_key`` the client sent: SGLang's ``Req`` appends the LoRA id to it, unseparated."""
    extra_key, lora_id = getattr(req, "extra_key", None), getattr(req, "lora_id", None)
    if isinstance(extra_key, str) and isinstance(lora_id, str) and lora_id != NO_LORA_ID and extra_key.endswith(lora_id):
        return extra_key[:-len(lora_id)]
    return extra_key


def schedule_name_of_request(req: Any) -> str | None:
    """The schedule a ``Req``'s ``extra_key`` names (``sparsity.wire``'s rule). The HTTP edge refuses
    what this rule refuses; SGLang's own routes do not, so here a problem is logged, never raised."""
    extra_key = client_extra_key(req)
    if isinstance(extra_key, str) and wire.EXTRA_KEY_PREFIX in extra_key and not extra_key.startswith(wire.EXTRA_KEY_PREFIX):
        logger.warning("request %s: extra_key %r has %r after other text (a cache_salt?); it names no schedule",
                       getattr(req, "rid", "?"), extra_key, wire.EXTRA_KEY_PREFIX)
    return wire.schedule_name_from_extra_key(extra_key)


def resolve_request_schedule(req: Any, registry: ScheduleRegistry, default: Schedule) -> Schedule:
    """Schedule of an SGLang ``Req``: ``custom_params`` first, then ``extra_key``; a bad value falls
    back to ``default`` with a warning (the HTTP edge validates; the scheduler must not die on one request)."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    try:
        if not wire.names_schedule(params):
            name = schedule_name_of_request(req)
            params = {wire.SCHEDULE_PARAM: name} if name is not None else None
        schedule = schedule_from_custom_params(params, registry, default)
        wire.check_page_size(schedule, default.page_size)
        return schedule
    except Exception as exc:  # anything a request sent (deeply nested JSON included) is this request's problem
        logger.warning("request %s: bad sparrow schedule (%s); using %s", getattr(req, "rid", "?"), exc, default.id)
        return default


def assign_request(table: ScheduleTable, req: Any, registry: ScheduleRegistry) -> None:
    """Record a request that got a KV row (the ``ReqToTokenPool.alloc`` hook): its schedule and
    prompt length. Never raises: the hook runs for a whole batch inside SGLang's scheduler."""
    row = getattr(req, "req_pool_idx", None)
    if row is None:
        return
    prompt_len = len(getattr(req, "origin_input_ids", ()) or ())
    try:
        table.assign(int(row), resolve_request_schedule(req, registry, table.default), prompt_len)
    except Exception:
        logger.exception("request %s: could not record its sparrow schedule; row %s runs the default %s",
                         getattr(req, "rid", "?"), row, table.default.id)
        with contextlib.suppress(Exception):
            table.assign(int(row), table.default, prompt_len)
