"""``kill`` part: one worker SIGKILLed (its whole process group) while rollouts run through the router,
then restarted on its port; the clients see the router's retry or a clear error, nothing hangs, and
the restarted worker rejoins the rotation and serves.

The client does not retry (``RetryPolicy(retries=0)``), so each outcome is what the router answered.
A request counts as hung if it has no answer after ``Sizes.client_timeout_s``.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

from fleet_gpu.common import FLEET_ROUTER, Fleet, complete, generate_lines, kill_group, load_requests, load_summary, \
    prompts, router_retries, send_all
from fleet_router import wait_until, running_router

VICTIM = 1
LOG_SETTLE_S = 1.0
DROP_TIMEOUT_S = 60.0  # the router must take the dead worker out within this
REJOIN_TIMEOUT_S = 120.0  # ... and take the restarted one back within this after it is healthy


class Chaos(threading.Thread):
    """Kill the victim once ``kill_after`` requests have finished, wait until the router drops it,
    restart it on its port and wait until the router marks it healthy again. Timings in ``events``."""

    def __init__(self, fleet: Fleet, router, finished: list, kill_after: int):
        super().__init__(daemon=True)
        self.fleet, self.router, self.finished, self.kill_after = fleet, router, finished, kill_after
        self.events: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the part, after the load has finished
            self.error = exc

    def _run(self) -> None:
        deadline = self.fleet.sizes.client_timeout_s * 4
        wait_until(lambda: len(self.finished) >= self.kill_after, deadline, f"{self.kill_after} requests to finish")
        victim = self.fleet.servers[VICTIM]
        t0 = time.monotonic()
        self.events["killed_after_finished"] = len(self.finished)
        kill_group(victim)
        self.router.wait_unhealthy(victim.base, DROP_TIMEOUT_S)
        self.events["dropped_after_s"] = round(time.monotonic() - t0, 2)
        self.events["finished_when_dropped"] = len(self.finished)
        self.events["restart_to_healthy_s"] = round(self.fleet.restart(VICTIM, f"server-{VICTIM}-restart.log"), 1)
        # SGLang's own warm-up /generate is in the log by now: count only what the router sends after it
        self.events["restarted_log_offset"] = self.fleet.servers[VICTIM].log_offset()
        self.router.wait_healthy([victim.base], REJOIN_TIMEOUT_S)
        self.events["rejoined_after_s"] = round(time.monotonic() - t0, 2)
        self.events["finished_when_rejoined"] = len(self.finished)


def outcome_counts(outcomes: list[dict], sizes) -> dict:
    failures = [o for o in outcomes if not complete(o, sizes)]
    # a clear error: an HTTP status from the router with a body saying why
    unclear = [o for o in failures if not (isinstance(o["status"], int) and o["status"] >= 400 and o.get("error"))]
    return {"unclear_failures": len(unclear), "statuses": dict(Counter(str(o["status"]) for o in outcomes)),
            "succeeded": len(outcomes) - len(failures), "failed": len(failures),
            "hung": sum(o["status"] == "timeout" for o in outcomes),
            "failures": [{k: o.get(k) for k in ("rid", "status", "error", "latency_s")} for o in failures][:20],
            "max_latency_s": round(max(o["latency_s"] for o in outcomes), 2)}


def run(fleet: Fleet, rec: dict) -> None:
    sizes = fleet.sizes
    ps = prompts(sizes.distinct_prompts, sizes.prompt_len)
    old_victim = fleet.servers[VICTIM]
    offsets = [s.log_offset() for s in fleet.servers]
    finished: list = []
    rec.update(victim=old_victim.base, kill_after_finished=sizes.requests // 3,
               client_timeout_s=sizes.client_timeout_s, client_retries=0)
    with running_router([s.base for s in fleet.servers], fleet.out, FLEET_ROUTER) as router:
        retries_before = router_retries(router)
        chaos = Chaos(fleet, router, finished, sizes.requests // 3)
        chaos.start()
        outcomes, wall = send_all(router.url, load_requests(sizes, "kill"), ps, sizes, on_done=finished.append)
        rec["load"] = load_summary(outcomes, wall, sizes)
        rec["outcomes"] = outcome_counts(outcomes, sizes)
        chaos.join(timeout=600)
        rec["events"] = chaos.events
        rec["router_retries"] = router_retries(router) - retries_before
        time.sleep(LOG_SETTLE_S)
        restarted = fleet.servers[VICTIM]
        rec["generate_lines_during_load"] = {
            "worker0": generate_lines(fleet.servers[0].log_path, offsets[0]),
            "victim_before_kill": generate_lines(old_victim.log_path, offsets[VICTIM]),
            "victim_restarted": (generate_lines(restarted.log_path, chaos.events.get("restarted_log_offset", 0))
                                 if restarted is not old_victim else 0)}
        # more lines than answers: a request ran to the end twice (its first answer lost on the way)
        rec["generate_lines_minus_succeeded"] = sum(rec["generate_lines_during_load"].values()) - rec["outcomes"]["succeeded"]
        if chaos.error is not None or chaos.is_alive():
            raise RuntimeError(f"kill/restart did not complete: {chaos.error!r} (events {chaos.events})")
        offset = restarted.log_offset()
        after, wall = send_all(router.url, load_requests(sizes, "after", sizes.after_kill_requests), ps, sizes)
        time.sleep(LOG_SETTLE_S)
        rec["after_restart"] = {**load_summary(after, wall, sizes),
                                "restarted_worker_generate_requests": generate_lines(restarted.log_path, offset),
                                "router_workers": [{k: w.get(k) for k in ("url", "is_healthy")} for w in router.workers()]}
    counts = rec["outcomes"]
    assert counts["hung"] == 0, f"{counts['hung']} requests had no answer within {sizes.client_timeout_s} s"
    assert counts["unclear_failures"] == 0, f"failures without a status and body: {counts['failures']}"
    assert rec["after_restart"]["completed"] == sizes.after_kill_requests, rec["after_restart"]
    assert rec["after_restart"]["restarted_worker_generate_requests"] > 0, "the restarted worker served nothing"
