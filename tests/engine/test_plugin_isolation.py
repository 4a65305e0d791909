"""What the SGLang plug-in adds per request can never raise for a batch: a schedule that fails to
parse or to plan affects only its own request (default schedule, or a dense plan), and the
reported ``kv_budget_tokens`` is the one definition both engines share. No SGLang needed."""
from __future__ import annotations

import json
from types import SimpleNamespace as NS

import numpy as np

from sparrow_server.sglang_plugin.scheduler import planning
from sparrow_server.sglang_plugin.frontend.engine import BudgetPlan
from sparrow_server.sglang_plugin.scheduler.planning import plan_step
from sparrow_server.sglang_plugin.scheduler.side_table import ScheduleTable, assign_request, resolve_request_schedule
from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule, dense_schedule, dump_schedule, kv_budget_tokens

PS, HKV, CAP = 16, 2, 64
SPARSE = Schedule(name="sp", budgets_tokens=(64, 128), bin_tokens=200)


def req(rid: str, row: int | None, custom_params=None, prompt: int = 10):
    return NS(rid=rid, req_pool_idx=row, origin_input_ids=list(range(prompt)),
              sampling_params=NS(custom_params=custom_params), extra_key=None)


def test_a_bad_side_table_entry_affects_only_its_request():
    table, registry = ScheduleTable(8, SPARSE), ScheduleRegistry()
    deep = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError, not a ValueError
    other_pages = json.dumps({**json.loads(dump_schedule(SPARSE)), "page_size": 32, "budgets_tokens": [128]})
    requests = [req("good-1", 1, {"sparrow_schedule": "qwen3-4b-0.86"}),
                req("deep", 2, {"sparrow_schedule_json": deep}),
                req("pages", 3, {"sparrow_schedule_json": other_pages}),
                req("not-json", 4, {"sparrow_schedule_json": "{"}),
                req("bad-row", 99, None),  # outside the table: logged, nothing recorded, no exception
                req("good-2", 5, {"sparrow_schedule_json": dump_schedule(SPARSE)}, prompt=7)]
    for r in requests:
        assign_request(table, r, registry)
    assert table.schedule_of(1).name == "qwen3-4b-0.86" and table.schedule_of(5) == SPARSE
    assert all(table.schedule_of(row) is table.default for row in (2, 3, 4))
    assert table.prompt_len[5] == 7 and table.prompt_len[2] == 10
    assert resolve_request_schedule(requests[2], registry, table.default) is table.default


def test_a_schedule_that_fails_to_plan_plans_only_its_request_dense(monkeypatch):
    real = planning.attended_pages
    faulty = Schedule(name="faulty", budgets_tokens=(64,))

    def attended_pages(schedule, *args, **kwargs):
        if schedule.name == "faulty":
            raise OverflowError("injected budget failure")
        return real(schedule, *args, **kwargs)

    lengths, prompts = np.array([300, 500, 900]), np.array([10, 10, 10])
    alone = [plan_step([s], lengths[i:i + 1], prompts[i:i + 1], HKV, PS, CAP) for i, s in ((0, SPARSE), (2, SPARSE))]
    monkeypatch.setattr(planning, "attended_pages", attended_pages)
    plan = plan_step([SPARSE, faulty, SPARSE], lengths, prompts, HKV, PS, CAP)
    for i, one in zip((0, 2), alone):  # the neighbours' plans are what they get alone
        assert plan.count[i] == one.count[0] and plan.k[i] == one.k[0] and plan.budget_tokens[i] == one.budget_tokens[0]
    assert plan.count[1] == plan.n_pages[1] == 32 and plan.k[1] == 0 and plan.budget_tokens[1] == 500  # dense
    assert plan.row_indptr[-1] == HKV * int(plan.count.sum())


def test_both_engines_report_the_same_kv_budget_tokens():
    """The planner (what the GPU attends), the SGLang engine's per-token report and the shared
    definition agree at every length, the partial last page counted by its real tokens."""
    prompt = 30
    lengths = np.arange(prompt + 1, prompt + 700)
    plan = plan_step([SPARSE] * len(lengths), lengths, np.full(len(lengths), prompt), HKV, PS, CAP)
    reported = BudgetPlan(SPARSE, prompt, CAP).tokens(1, len(lengths))
    for length, count, planned, one in zip(lengths, plan.count, plan.budget_tokens, reported):
        assert planned == one == kv_budget_tokens(SPARSE, int(length), prompt, CAP)
        assert planned == (int(count) - 1) * PS + (int(length) - 1) % PS + 1 <= length  # the pages the GPU reads
    assert {int(b) % PS for b in plan.budget_tokens} != {0}  # partial pages counted as they are
    dense = plan_step([dense_schedule()], np.array([37]), np.array([5]), HKV, PS, CAP)
    assert dense.budget_tokens[0] == 37 == kv_budget_tokens(dense_schedule(), 37)
