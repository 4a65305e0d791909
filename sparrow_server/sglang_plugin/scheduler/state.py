"""Process-wide state shared by the hooks and the attention backend (one per scheduler process)."""
from __future__ import annotations

import logging

from sparrow_server.sglang_plugin.config import PluginConfig
from sparrow_server.sglang_plugin.scheduler.exact_rows import RowStore
from sparrow_server.sglang_plugin.scheduler.side_table import ScheduleTable
from sparrow_server.sparsity.registry import ScheduleRegistry

logger = logging.getLogger(__name__)

_config: PluginConfig | None = None
_registry: ScheduleRegistry | None = None
_table: ScheduleTable | None = None
_exact: RowStore | None = None


def config() -> PluginConfig:
    global _config
    if _config is None:
        _config = PluginConfig.from_env()
    return _config


def registry() -> ScheduleRegistry:
    global _registry
    if _registry is None:
        _registry = ScheduleRegistry.load(persist_dir=config().schedule_dir)
    return _registry


def table(num_rows: int) -> ScheduleTable:
    """The schedule side table, created on first use with ``num_rows`` rows (pool size + 1)."""
    global _table
    if _table is None:
        default = registry().get(config().default_schedule)
        _table = ScheduleTable(num_rows, default=default)
        logger.info("sparrow: schedule table with %d rows, default schedule %s", num_rows, default.id)
    elif _table.num_rows < num_rows:
        raise ValueError(f"num_rows={num_rows}: the schedule table already has {_table.num_rows} rows")
    return _table


def schedule_table() -> ScheduleTable | None:
    """The schedule side table if this process created it (the first batch's allocation does)."""
    return _table


def exact_store() -> RowStore:
    """The sparse rows kept for exact acceptance (``exact_rows``), bounded by ``SPARROW_EXACT_MAX_MIB``."""
    global _exact
    if _exact is None:
        _exact = RowStore(max_bytes=config().exact_max_mib << 20)
    return _exact


def reset() -> None:
    """Forget all state (tests)."""
    global _config, _registry, _table, _exact
    _config = _registry = _table = _exact = None
