"""The schedule's wire contract (``sparsity.wire``) has one home: its keys, encode/decode, the
``extra_key`` rule and the page-size check, used by client, server and both halves of the plug-in."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import sparrow_server
from sparrow_server.sparsity import wire
from sparrow_server.sparsity.schedule import Schedule, ScheduleError, dense_schedule

TIGHT = Schedule(name="tight", budgets_tokens=(64,), page_size=16, dense_layers=(0,))


def test_encode_then_decode_gives_the_schedule_back():
    params = wire.encode_schedule(TIGHT)
    assert wire.names_schedule(params) and wire.decode_schedule(params) == TIGHT


def test_decode_a_name_nothing_or_a_wrong_type():
    assert wire.decode_schedule({wire.SCHEDULE_PARAM: "tight@2"}) == "tight@2"
    assert wire.decode_schedule(None) is None and wire.decode_schedule({"other": 1}) is None
    assert not wire.names_schedule({"other": 1}) and not wire.names_schedule(None)
    with pytest.raises(ScheduleError) as bad_name:
        wire.decode_schedule({wire.SCHEDULE_PARAM: 3})
    with pytest.raises(ScheduleError) as bad_json:
        wire.decode_schedule({wire.SCHEDULE_JSON_PARAM: {"name": "x"}})
    assert (bad_name.value.field, bad_json.value.field) == (wire.SCHEDULE_PARAM, wire.SCHEDULE_JSON_PARAM)


def test_the_extra_key_rule():
    assert wire.schedule_name_from_extra_key(wire.extra_key_for("tight@2")) == "tight@2"
    assert wire.schedule_name_from_extra_key("cache-salt") is None and wire.schedule_name_from_extra_key(None) is None
    assert wire.schedule_name_from_extra_key("salt" + wire.extra_key_for("tight")) is None  # the prefix must come first
    with pytest.raises(ScheduleError) as empty:
        wire.schedule_name_from_extra_key(wire.EXTRA_KEY_PREFIX)
    assert empty.value.field == "extra_key"


def test_the_page_size_check():
    wire.check_page_size(dense_schedule(), 16)
    with pytest.raises(ScheduleError, match="hold 32 tokens") as err:
        wire.check_page_size(TIGHT, 32)
    assert (err.value.field, err.value.value) == ("page_size", 16)


def test_no_other_module_spells_the_wire_keys():
    root = Path(sparrow_server.__file__).parent
    literal = re.compile(r"""["']sparrow_schedule(_json|=)?["']""")
    spelled = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p != root / "sparsity" / "wire.py" and literal.search(p.read_text())]
    assert not spelled
