"""Schedule parsing under arbitrary input: any mapping (or text) either parses into a valid
schedule or raises ``ScheduleError`` naming a field -- never another exception."""
from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparrow_server.sparsity.schedule import (
    Schedule,
    ScheduleError,
    budget_tokens,
    dump_schedule,
    parse_schedule_text,
    schedule_from_dict,
)

FIELDS = sorted(Schedule.__dataclass_fields__) + ["format_version", "budgets_pages_excluding_reserved"]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from([0, 1, 2, 16, 64, 128, 2000, "total", "generated", "x"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                           max_leaves=12)
int_lists = st.lists(st.one_of(st.integers(-64, 4096), st.sampled_from([16, 64, 128, 256, 512]), scalars), max_size=6)
field_values = st.one_of(json_values, int_lists)
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=8), st.integers(), st.none(), st.tuples(st.integers()))
mappings = st.one_of(
    st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=8),
    st.dictionaries(keys, field_values, max_size=6),
    st.builds(lambda extra, name: {"name": name, **extra}, st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=6),
              st.one_of(st.text(max_size=10), st.sampled_from(["ok", "a.b-c_1"]))),
)


def check(parse, data):
    try:
        schedule = parse(data)
    except ScheduleError as exc:
        assert isinstance(exc.field, str) and repr(exc.field) in str(exc) and exc.reason, exc
        return None
    assert isinstance(schedule, Schedule)
    assert parse_schedule_text(dump_schedule(schedule)) == schedule  # a parsed schedule round-trips
    for length in (1, 17, 2000, 10_000):
        budget = budget_tokens(schedule, length)
        assert budget >= 1 and budget % schedule.page_size == 0
    return schedule


@SETTINGS
@given(mappings)
def test_any_mapping_parses_or_names_a_field(data):
    check(schedule_from_dict, data)


@SETTINGS
@given(st.one_of(json_values, mappings))
def test_any_json_value_parses_or_names_a_field(value):
    check(schedule_from_dict, value)


@SETTINGS
@given(st.one_of(st.text(max_size=80), st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=8).map(json.dumps)))
def test_any_text_parses_or_names_a_field(text):
    check(parse_schedule_text, text)
    check(lambda t: parse_schedule_text(t, yaml_format=True), text)


@SETTINGS
@given(st.lists(st.integers(1, 64), min_size=1, max_size=6), st.integers(0, 3), st.integers(1, 4),
       st.sampled_from([16, 32]), st.sampled_from(["total", "generated"]))
def test_valid_schedules_parse(budget_pages, sink, recent, page_size, basis):
    reserved = sink + recent
    budgets = sorted((reserved + p) * page_size for p in budget_pages)
    data = {"name": "fuzz", "budgets_tokens": budgets, "sink_pages": sink, "recent_pages": recent,
            "page_size": page_size, "length_basis": basis, "dense_layers": [0]}
    schedule = check(schedule_from_dict, data)
    assert schedule is not None and list(schedule.budgets_tokens) == budgets
    assert not math.isnan(schedule.bin_tokens)
