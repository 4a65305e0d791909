"""``router`` part: mixed-schedule rollouts through sglang-router, each answered exactly once and equal
to the same request sent straight to a worker; then latency and tokens/s with one and two workers.

The comparison (``Fleet.agreement_rule``, recorded in the report as ``agreement_rule``):

- deterministic inference (the default: servers with ``--enable-deterministic-inference``): every answer,
  of every schedule, bit-identical to the direct one -- tokens, logprobs and top-2 gaps
  (``greedy_agreement.exact_problems``). SGLang's batch-invariant kernels and the sparrow backend's
  batch-invariant sparse plan leave no rounding that depends on the batch, so any difference is a bug: a
  request run with another schedule than it named, or with another request's pages, differs at once.
- without it (``fleet_2gpu.py --no-deterministic``): agreement within the bf16 tolerance
  (``greedy_agreement.agreement_problems``), not equality. Runs 1 and 3 (benchmarks/results/fleet_2gpu/)
  found 142 and 154 of 256 answers unequal to the direct ones and the same request sent alone again
  equal to neither: a batch rounds differently from a batch of another size, greedy decoding parts at
  bf16 ties, and under sparse attention a rounding change can flip a page selection, which moved 18
  of run 3's sparse answers beyond the tolerance (no dense one). A request run with another schedule
  moves its logprobs by ~0.2 nats median (sparse vs dense), which the tolerance refuses.

Exactly once is read from both ends: the client gets one 200 per rid (no client retry), and the two
workers' access logs hold exactly as many ``POST /generate`` lines as requests were sent (a request
run twice, by a router retry, would show as one line more).
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from fleet_gpu.common import FLEET_ROUTER, Fleet, complete, generate_lines, load_requests, load_summary, prompts, \
    rollout, send_all
from fleet_router import running_router
from sparrow_server.stats.greedy_agreement import Run, agreement, agreement_problems, exact_problems, \
    run_from_rollouts, summary

LOG_SETTLE_S = 1.0  # uvicorn writes the access line as the answer goes out: let the last ones land


MIN_COMPARED = 0.25  # bf16 tolerance: of all positions before a divergence (ties part runs early, not most)


def answer_problems(fleet: Fleet, ref: Run, got: Run) -> list[str]:
    """What makes ``got`` (a routed answer) differ from ``ref`` (the direct one) under the fleet's rule."""
    if fleet.deterministic:
        return exact_problems(ref, got)
    return agreement_problems(ref, got, min_compared=0.0)


def direct_answers(fleet: Fleet, ps: list[list[int]]) -> dict[tuple[int, str], Run]:
    """Each (prompt, schedule) pair's greedy run from server 0's own ``/rollout``. Server 1 gets a
    few too, so that both workers are warm (kernels compiled) before anything is timed."""
    sizes, base0, base1 = fleet.sizes, fleet.servers[0].base, fleet.servers[1].base
    pairs = [(p, s) for p in range(len(ps)) for s in sizes.schedules]
    ask = lambda pair: rollout(base0, ps[pair[0]], pair[1], sizes.new_tokens, top_logprobs=2)
    with ThreadPoolExecutor(min(sizes.concurrency, 16)) as pool:
        runs = [run_from_rollouts([r]) for r in pool.map(ask, pairs)]
        list(pool.map(lambda s: rollout(base1, ps[0], s, sizes.new_tokens), sizes.schedules))
    return dict(zip(pairs, runs))


def agreement_with_direct(fleet: Fleet, outcomes: list[dict], direct: dict) -> tuple[list[list[str]], float]:
    """Per outcome, what breaks the fleet's rule against its direct run ([] when it holds; an incomplete
    answer is a problem), and the share of all positions before the first token difference."""
    problems, compared, total = [], 0, 0
    for o in outcomes:
        if not complete(o, fleet.sizes):
            problems.append(["incomplete"])
            continue
        ref = direct[(o["prompt"], o["schedule"])]
        problems.append(answer_problems(fleet, ref, o["run"]))
        row = agreement(ref, o["run"])[0]
        compared, total = compared + row.first_divergence, total + row.length
    return problems, compared / max(total, 1)


def diagnose(fleet: Fleet, ps: list[list[int]], differing: list[dict], limit: int = 6) -> list[dict]:
    """For answers unequal to server 0's ``/rollout``: where they part, and whether the same request
    sent alone to each server again gives the router's answer (then batch composition, not routing,
    made the difference) or server 0's first one (tokens; and bit for bit, tokens and logprobs)."""
    rows = []
    for o in differing[:limit]:
        if o["status"] != 200:
            continue
        again = [run_from_rollouts([rollout(s.base, ps[o["prompt"]], o["schedule"], fleet.sizes.new_tokens)])
                 for s in fleet.servers]
        direct = o["direct"].tokens[0]
        first = next((k for k, (a, b) in enumerate(zip(o["output_ids"], direct)) if a != b), None)
        bare = lambda run: Run(run.tokens, run.logprobs)  # tokens and logprobs (the repeats ask no top-2)
        rows.append({"rid": o["rid"], "schedule": o["schedule"], "first_differing_token": first,
                     "agreement": summary(o["direct"], o["run"]), "exact_problems": exact_problems(o["direct"], o["run"]),
                     "alone_equal_router_answer": [a.tokens[0] == o["output_ids"] for a in again],
                     "alone_equal_first_direct": [a.tokens[0] == direct for a in again],
                     "alone_identical_to_first_direct": [not exact_problems(bare(o["direct"]), a) for a in again]})
    return rows


def check_exactly_once(fleet: Fleet, outcomes: list[dict], per_worker: list[int], direct: dict, rec: dict,
                       ps: list[list[int]]) -> None:
    sizes = fleet.sizes
    n = len(outcomes)
    statuses = Counter(str(o["status"]) for o in outcomes)
    rids = Counter(o["rid"] for o in outcomes)
    same = [complete(o, sizes) and o["output_ids"] == direct[(o["prompt"], o["schedule"])].tokens[0] for o in outcomes]
    problems, compared = agreement_with_direct(fleet, outcomes, direct)
    reported = [o for o in outcomes if o.get("ran_schedule") is not None]
    rec.update({
        "statuses": dict(statuses), "completed": sum(complete(o, sizes) for o in outcomes),
        "per_worker_generate_requests": per_worker, "equal_to_direct_rollout": sum(same),
        "agreement_rule": fleet.agreement_rule,
        "agree_with_direct_rollout": sum(not p for p in problems), "positions_compared": round(compared, 4),
        "agree_per_schedule": per_schedule(outcomes, problems),
        "disagreeing": [{"rid": o["rid"], "schedule": o["schedule"], "problems": p}
                        for o, p in zip(outcomes, problems) if p][:20],
        "differing": [{"rid": o["rid"], "schedule": o["schedule"], "prompt": o["prompt"], "status": o["status"]}
                      for o, ok in zip(outcomes, same) if not ok][:20],
        "schedule_reported": len(reported),
        "schedule_reported_wrong": sum(o["ran_schedule"] != o["schedule"] for o in reported),
        "per_schedule": dict(Counter(o["schedule"] for o in outcomes)),
    })
    # diagnosed: answers with other tokens (and, under the exact rule, any that breaks it)
    differing = [{**o, "direct": direct[(o["prompt"], o["schedule"])]} for o, ok, p in zip(outcomes, same, problems)
                 if not ok or (fleet.deterministic and p and complete(o, sizes))]
    if differing:
        rec["differing_diagnosis"] = diagnose(fleet, ps, differing)
    assert len(rids) == n and all(complete(o, sizes) for o in outcomes), f"not every request completed: {dict(statuses)}"
    assert sum(per_worker) == n, f"workers logged {per_worker} POST /generate for {n} requests"
    assert all(k > 0 for k in per_worker), f"a worker served nothing: {per_worker}"
    assert rec["schedule_reported_wrong"] == 0, "a request ran with another schedule than it named"
    bad = sum(bool(p) for p in problems)
    assert not bad, f"{bad} router answers break the rule against the worker's own /rollout ({fleet.agreement_rule}): " \
                    f"{rec['agree_per_schedule']}"
    if not fleet.deterministic:
        assert compared >= MIN_COMPARED, f"only {compared:.2f} of the positions precede a divergence"


def per_schedule(outcomes: list[dict], problems: list[list[str]]) -> dict:
    """Schedule -> [answers that hold the rule, answers]."""
    counts: dict = {}
    for o, p in zip(outcomes, problems):
        row = counts.setdefault(o["schedule"], [0, 0])
        row[0] += not p
        row[1] += 1
    return counts


def run(fleet: Fleet, rec: dict) -> None:
    sizes = fleet.sizes
    ps = prompts(sizes.distinct_prompts, sizes.prompt_len)
    rec.update(schedules=list(sizes.schedules), prompt_len=sizes.prompt_len, new_tokens=sizes.new_tokens,
               router_settings=dataclasses.asdict(FLEET_ROUTER), deterministic=fleet.deterministic,
               agreement_rule=fleet.agreement_rule)
    t0 = time.monotonic()
    direct = direct_answers(fleet, ps)
    rec["direct_rollouts"] = {"pairs": len(direct), "wall_s": round(time.monotonic() - t0, 2)}

    # the same load, twice: both workers behind the router (checked), then server 0 alone (timed)
    two = rec.setdefault("two_workers", {})
    offsets = [s.log_offset() for s in fleet.servers]
    with running_router([s.base for s in fleet.servers], fleet.out, FLEET_ROUTER) as router:
        outcomes, wall = send_all(router.url, load_requests(sizes, "two"), ps, sizes)
    time.sleep(LOG_SETTLE_S)
    per_worker = [generate_lines(s.log_path, off) for s, off in zip(fleet.servers, offsets)]
    two.update(load_summary(outcomes, wall, sizes))

    one = rec.setdefault("one_worker", {})
    with running_router([fleet.servers[0].base], fleet.out, FLEET_ROUTER) as router:
        alone, wall = send_all(router.url, load_requests(sizes, "one"), ps, sizes)
    one.update(load_summary(alone, wall, sizes))
    one["equal_to_direct_rollout"] = sum(complete(o, sizes) and o["output_ids"] == direct[(o["prompt"], o["schedule"])].tokens[0]
                                         for o in alone)
    one_problems, one["positions_compared"] = agreement_with_direct(fleet, alone, direct)
    one["agree_with_direct_rollout"] = sum(not p for p in one_problems)
    one["agree_per_schedule"] = per_schedule(alone, one_problems)
    check_exactly_once(fleet, outcomes, per_worker, direct, two, ps)
    assert one["completed"] == len(alone), f"one worker: {one['completed']} of {len(alone)} completed"
    if fleet.deterministic:  # the same rule, with one worker (the timed run): nothing else may differ either
        assert one["agree_with_direct_rollout"] == len(alone), \
            f"one worker: answers break the rule ({fleet.agreement_rule}): {one['agree_per_schedule']}"
