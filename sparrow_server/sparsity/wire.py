"""How a request names its schedule on the wire: the one contract between the client, the HTTP
server, and both halves of the SGLang plug-in (its HTTP process and its scheduler processes).

- ``sampling_params.custom_params[SCHEDULE_PARAM]``: a registered schedule's name (``name`` or
  ``name@version``); ``custom_params[SCHEDULE_JSON_PARAM]``: a whole schedule as JSON text (the
  plug-in's HTTP process resolves names and sends the schedule itself to its schedulers).
- ``extra_key`` = ``EXTRA_KEY_PREFIX + NAME``: the same name in the one field sglang-router keeps
  (it drops ``custom_params``). The prefix must come first; any other ``extra_key`` is only a
  cache salt. ``custom_params`` wins over ``extra_key``.
- a schedule's ``page_size`` must be the server's KV page size (``check_page_size``).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from sparrow_server.sparsity.schedule import Schedule, ScheduleError, dump_schedule, schedule_from_dict

SCHEDULE_PARAM = "sparrow_schedule"
SCHEDULE_JSON_PARAM = "sparrow_schedule_json"
EXTRA_KEY_PREFIX = SCHEDULE_PARAM + "="


def extra_key_for(name: str) -> str:
    """The ``extra_key`` naming schedule ``name``."""
    return EXTRA_KEY_PREFIX + name


def schedule_name_from_extra_key(extra_key: Any) -> str | None:
    """The schedule ``extra_key`` names, or None when it is only a cache salt (not a string, or not
    starting with ``EXTRA_KEY_PREFIX``); ``ScheduleError`` (field ``extra_key``) when the name is empty."""
    if not isinstance(extra_key, str) or not extra_key.startswith(EXTRA_KEY_PREFIX):
        return None
    name = extra_key[len(EXTRA_KEY_PREFIX):]
    if not name:
        raise ScheduleError("extra_key", extra_key, f"names no schedule (expected {EXTRA_KEY_PREFIX}NAME)")
    return name


def encode_schedule(schedule: Schedule) -> dict[str, str]:
    """The ``custom_params`` carrying ``schedule`` itself."""
    return {SCHEDULE_JSON_PARAM: dump_schedule(schedule)}


def decode_schedule(custom_params: Mapping[str, Any] | None) -> Schedule | str | None:
    """What ``custom_params`` asks for: a schedule (``SCHEDULE_JSON_PARAM``, checked), a name to look
    up (``SCHEDULE_PARAM``), or None; ``ScheduleError`` naming the key on a value of the wrong type."""
    if not custom_params:
        return None
    text = custom_params.get(SCHEDULE_JSON_PARAM)
    if text is not None:
        if not isinstance(text, str):
            raise ScheduleError(SCHEDULE_JSON_PARAM, text, "must be a JSON string")
        return schedule_from_dict(json.loads(text))
    name = custom_params.get(SCHEDULE_PARAM)
    if name is not None and not isinstance(name, str):
        raise ScheduleError(SCHEDULE_PARAM, name, "must be a schedule name")
    return name


def names_schedule(custom_params: Mapping[str, Any] | None) -> bool:
    """Whether ``custom_params`` names a schedule at all (then ``extra_key`` is not read)."""
    return bool(custom_params) and (SCHEDULE_PARAM in custom_params or SCHEDULE_JSON_PARAM in custom_params)


def check_page_size(schedule: Schedule, page_size: int) -> None:
    """``ScheduleError`` unless the schedule's pages are the server's."""
    if schedule.page_size != page_size:
        raise ScheduleError("page_size", schedule.page_size, f"this server's KV pages hold {page_size} tokens")


__all__ = ["SCHEDULE_PARAM", "SCHEDULE_JSON_PARAM", "EXTRA_KEY_PREFIX", "extra_key_for", "schedule_name_from_extra_key",
           "encode_schedule", "decode_schedule", "names_schedule", "check_page_size"]
