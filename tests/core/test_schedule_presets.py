"""Schedules: the shipped presets, budget lookup, validation errors, and the registry."""
from __future__ import annotations

import json
import threading

import pytest

from sparrow_server.sparsity.registry import ScheduleRegistry, UnknownScheduleError, builtin_schedules, preset_names
from sparrow_server.sparsity.schedule import (
    Schedule, ScheduleError, bin_index, budget_pages, budget_tokens, dump_schedule, from_pages_excluding_reserved,
    is_sparse_at, load_schedule, parse_schedule_text, schedule_from_dict,
)

# The issue's four headline presets: top-k pages per 2000-token bin, excluding the 3 reserved pages.
HEADLINE = {
    "qwen3-1.7b-0.86": [29, 61, 93, 93, 125, 157, 189, 221, 221] + [253] * 11,
    "qwen3-4b-0.86": [29, 45, 61, 77, 93, 125, 157, 221, 253, 253, 317, 317, 317, 317, 381, 381, 381, 381, 509, 509],
    "qwen3-8b-0.86": [29, 45, 61, 77, 125, 157, 189, 253, 253, 253, 253] + [317] * 6 + [385, 445, 445],
    "qwen3-14b-0.86": [29, 45, 77, 125, 253] + [381] * 10 + [509, 637, 637, 893, 893],
}
ALL_PRESETS = {f"qwen3-1.7b-{t}" for t in ("0.75", "0.80", "0.83", "0.86", "0.88", "0.90", "0.92", "0.94")} | {
    f"qwen3-4b-{t}" for t in ("0.75", "0.80", "0.86", "0.88", "0.90", "0.92")} | {
    f"qwen3-8b-{t}" for t in ("0.75", "0.80", "0.86", "0.87", "0.92")} | {"qwen3-14b-0.86"}


def test_headline_presets_match_the_issue():
    reg = ScheduleRegistry()
    for name, pages in HEADLINE.items():
        s = reg.get(name)
        assert s.budgets_tokens == tuple((v + 3) * 16 for v in pages)
        assert s == from_pages_excluding_reserved(name, pages, threshold=0.86, description=s.description)
        assert (s.page_size, s.bin_tokens, s.length_basis, s.sink_pages, s.recent_pages, s.dense_layers) == (
            16, 2000, "total", 1, 2, (0, 1))
        assert "Infini-AI-Lab/Sparrow" in s.description
    assert reg.get("qwen3-8b-0.86").budgets_tokens[17] == 6208  # 385 kept as published
    assert "385" in reg.get("qwen3-8b-0.86").description


def test_every_preset_is_valid_and_matches_its_name():
    assert set(preset_names()) == ALL_PRESETS
    for s in builtin_schedules()[1:]:
        assert len(s.budgets_tokens) == 20
        assert list(s.budgets_tokens) == sorted(s.budgets_tokens)
        assert all(b % 16 == 0 for b in s.budgets_tokens)
        assert s.threshold == float(s.name.rsplit("-", 1)[1])
        assert parse_schedule_text(dump_schedule(s)) == s
    # a few table values from the reference notes (total tokens per bin)
    reg = ScheduleRegistry()
    assert reg.get("qwen3-4b-0.92").budgets_tokens[:4] == (768, 1536, 2560, 3072)
    assert reg.get("qwen3-1.7b-0.94").budgets_tokens[-1] == 12288
    assert reg.get("qwen3-8b-0.92").budgets_tokens[-1] == 16384


def test_budget_lookup_by_bin():
    s = ScheduleRegistry().get("qwen3-1.7b-0.86")
    assert budget_tokens(s, 1) == 512 and budget_tokens(s, 1999) == 512 and budget_tokens(s, 2000) == 1024
    assert budget_tokens(s, 10**6) == 4096 and bin_index(s, 10**6) == 19
    assert budget_pages(s, 5000) == 96
    assert not is_sparse_at(s, 512) and is_sparse_at(s, 513)
    g = Schedule("g", budgets_tokens=(512, 1024), length_basis="generated")
    assert budget_tokens(g, 2500, prompt_len=1000) == 512 and budget_tokens(g, 3500, prompt_len=1000) == 1024
    dense = ScheduleRegistry().get("dense")
    assert budget_tokens(dense, 1000) == 1008 and not is_sparse_at(dense, 10**6)


@pytest.mark.parametrize("data,field,reason", [
    ({"name": "x", "budgets_tokens": [512, 500]}, "budgets_tokens[1]", "multiple of page_size"),
    ({"name": "x", "budgets_tokens": [1024, 512]}, "budgets_tokens[1]", "decreases"),
    ({"name": "x", "budgets_tokens": [48]}, "budgets_tokens[0]", "reserved"),
    ({"name": "x", "budgets_tokens": "512"}, "budgets_tokens", "list"),
    ({"name": "x", "page_size": 0}, "page_size", ">= 1"),
    ({"name": "x", "bin_tokens": 2.5}, "bin_tokens", "integer"),
    ({"name": "x", "length_basis": "prompt"}, "length_basis", "one of"),
    ({"name": "x", "threshold": 1.5}, "threshold", "(0, 1]"),
    ({"name": "x", "dense_layers": [0, 0]}, "dense_layers", "duplicates"),
    ({"name": "bad name"}, "name", "letters"),
    ({"budgets_tokens": [512]}, "name", "required"),
    ({"name": "x", "budget": [512]}, "budget", "unknown field"),
    ({"name": "x", "format_version": 9}, "format_version", "unsupported"),
])
def test_malformed_schedules_name_the_field(data, field, reason):
    with pytest.raises(ScheduleError) as info:
        schedule_from_dict(data)
    assert info.value.field == field and reason in str(info.value)
    assert repr(field) in str(info.value)


def test_load_json_and_yaml_files(tmp_path):
    (tmp_path / "a.yaml").write_text("name: a\nbudgets_pages_excluding_reserved: [29, 61]\nthreshold: 0.9\n")
    assert load_schedule(tmp_path / "a.yaml").budgets_tokens == (512, 1024)
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ScheduleError, match="<root>"):
        load_schedule(tmp_path / "b.json")


def test_registry_register_persist_and_reload(tmp_path):
    reg = ScheduleRegistry.load(persist_dir=tmp_path)
    mine = Schedule("mine", budgets_tokens=(512, 1024), threshold=0.9)
    reg.register(mine, persist=True)
    assert json.loads((tmp_path / "mine.json").read_text())["budgets_tokens"] == [512, 1024]
    assert reg.get("mine") is mine and reg.get("mine@1") is mine and "mine" in reg
    assert reg.register(mine) is mine  # identical: no-op
    other = Schedule("mine", budgets_tokens=(512, 2048))
    with pytest.raises(ScheduleError, match="already registered") as info:
        reg.register(other)
    assert info.value.field == "name"
    reg.register(other, persist=True, replace=True)
    again = ScheduleRegistry.load(persist_dir=tmp_path)
    assert again.get("mine") == other and not again.is_builtin("mine")
    assert "mine" in again.names() and again.names()[0] == "dense"
    again.unregister("mine")
    assert not (tmp_path / "mine.json").exists() and "mine" not in again
    assert list(tmp_path.iterdir()) == []  # no temporary files left


def test_registry_refuses_builtins_and_unknown_names(tmp_path):
    reg = ScheduleRegistry()
    for name in ("dense", "qwen3-1.7b-0.86"):
        with pytest.raises(ScheduleError, match="built-in"):
            reg.register(Schedule(name, budgets_tokens=(512,)))
        with pytest.raises(ScheduleError, match="built-in"):
            reg.unregister(name)
    with pytest.raises(UnknownScheduleError) as info:
        reg.get("nope")
    assert isinstance(info.value, KeyError) and info.value.name == "nope" and "nope" in str(info.value)
    with pytest.raises(UnknownScheduleError):
        reg.get("qwen3-1.7b-0.86@2")
    with pytest.raises(ValueError, match="persist_dir"):
        reg.register(Schedule("p", budgets_tokens=(512,)), persist=True)


def test_registry_load_refuses_an_invalid_saved_file(tmp_path):
    (tmp_path / "broken.json").write_text(json.dumps({"name": "broken", "budgets_tokens": [1024, 512]}))
    with pytest.raises(ScheduleError, match="broken.json") as info:
        ScheduleRegistry.load(persist_dir=tmp_path)
    assert info.value.field == "budgets_tokens[1]"
    (tmp_path / "broken.json").unlink()
    (tmp_path / "other.json").write_text(json.dumps({"name": "renamed", "budgets_tokens": [512]}))
    with pytest.raises(ScheduleError, match="other.json") as info:
        ScheduleRegistry.load(persist_dir=tmp_path)
    assert info.value.field == "name"
    (tmp_path / "other.json").unlink()
    (tmp_path / "dense.json").write_text(json.dumps({"name": "dense", "budgets_tokens": [512]}))
    with pytest.raises(ScheduleError, match="built-in"):
        ScheduleRegistry.load(persist_dir=tmp_path)


def test_registry_is_thread_safe(tmp_path):
    reg = ScheduleRegistry(persist_dir=tmp_path)
    errors = []

    def work(i):
        try:
            for j in range(20):
                reg.register(Schedule(f"s{i}-{j}", budgets_tokens=(512 + 16 * j,)), persist=True)
                reg.names()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(ScheduleRegistry.load(persist_dir=tmp_path)) == len(builtin_schedules()) + 80
