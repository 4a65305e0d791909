"""``router`` part: mixed-schedule rollouts through sglang-router, each answered exactly once and equal
to the same request sent straight to a worker; then latency and tokens/s with one and two workers.

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

LOG_SETTLE_S = 1.0  # uvicorn writes the access line as the answer goes out: let the last ones land


def direct_answers(fleet: Fleet, ps: list[list[int]]) -> dict[tuple[int, str], list[int]]:
    """Each (prompt, schedule) pair's greedy tokens from server 0's own ``/rollout``. Server 1 gets a
    few too, so that both workers are warm (kernels compiled) before anything is timed."""
    sizes, base0, base1 = fleet.sizes, fleet.servers[0].base, fleet.servers[1].base
    pairs = [(p, s) for p in range(len(ps)) for s in sizes.schedules]
    with ThreadPoolExecutor(min(sizes.concurrency, 16)) as pool:
        tokens = list(pool.map(lambda ps_: rollout(base0, ps[ps_[0]], ps_[1], sizes.new_tokens)["token_ids"], pairs))
        list(pool.map(lambda s: rollout(base1, ps[0], s, sizes.new_tokens), sizes.schedules))
    return dict(zip(pairs, tokens))


def diagnose(fleet: Fleet, ps: list[list[int]], differing: list[dict], limit: int = 6) -> list[dict]:
    """For answers unequal to server 0's ``/rollout``: where they part, and whether the same request
    sent alone to each server again gives the router's answer (then batch composition, not routing,
    made the difference) or server 0's first one."""
    rows = []
    for o in differing[:limit]:
        if o["status"] != 200:
            continue
        again = [rollout(s.base, ps[o["prompt"]], o["schedule"], fleet.sizes.new_tokens)["token_ids"] for s in fleet.servers]
        first = next((k for k, (a, b) in enumerate(zip(o["output_ids"], o["direct"])) if a != b), None)
        rows.append({"rid": o["rid"], "schedule": o["schedule"], "first_differing_token": first,
                     "alone_equal_router_answer": [a == o["output_ids"] for a in again],
                     "alone_equal_first_direct": [a == o["direct"] for a in again]})
    return rows


def check_exactly_once(fleet: Fleet, outcomes: list[dict], per_worker: list[int], direct: dict, rec: dict,
                       ps: list[list[int]]) -> None:
    sizes = fleet.sizes
    n = len(outcomes)
    statuses = Counter(str(o["status"]) for o in outcomes)
    rids = Counter(o["rid"] for o in outcomes)
    same = [complete(o, sizes) and o["output_ids"] == direct[(o["prompt"], o["schedule"])] for o in outcomes]
    reported = [o for o in outcomes if o.get("ran_schedule") is not None]
    rec.update({
        "statuses": dict(statuses), "completed": sum(complete(o, sizes) for o in outcomes),
        "per_worker_generate_requests": per_worker, "equal_to_direct_rollout": sum(same),
        "differing": [{"rid": o["rid"], "schedule": o["schedule"], "prompt": o["prompt"], "status": o["status"]}
                      for o, ok in zip(outcomes, same) if not ok][:20],
        "schedule_reported": len(reported),
        "schedule_reported_wrong": sum(o["ran_schedule"] != o["schedule"] for o in reported),
        "per_schedule": dict(Counter(o["schedule"] for o in outcomes)),
    })
    differing = [{**o, "direct": direct[(o["prompt"], o["schedule"])]} for o, ok in zip(outcomes, same) if not ok]
    if differing:
        rec["differing_diagnosis"] = diagnose(fleet, ps, differing)
    assert len(rids) == n and all(complete(o, sizes) for o in outcomes), f"not every request completed: {dict(statuses)}"
    assert sum(per_worker) == n, f"workers logged {per_worker} POST /generate for {n} requests"
    assert all(k > 0 for k in per_worker), f"a worker served nothing: {per_worker}"
    assert rec["schedule_reported_wrong"] == 0, "a request ran with another schedule than it named"
    assert all(same), f"{n - sum(same)} router answers differ from the worker's own /rollout"


def run(fleet: Fleet, rec: dict) -> None:
    sizes = fleet.sizes
    ps = prompts(sizes.distinct_prompts, sizes.prompt_len)
    rec.update(schedules=list(sizes.schedules), prompt_len=sizes.prompt_len, new_tokens=sizes.new_tokens,
               router_settings=dataclasses.asdict(FLEET_ROUTER))
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
    one["equal_to_direct_rollout"] = sum(complete(o, sizes) and o["output_ids"] == direct[(o["prompt"], o["schedule"])]
                                         for o in alone)
    check_exactly_once(fleet, outcomes, per_worker, direct, two, ps)
    assert one["completed"] == len(alone), f"one worker: {one['completed']} of {len(alone)} completed"
