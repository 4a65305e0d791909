"""One autopilot for a fleet: pool the servers' verified tokens, publish each new version to every server.

``FleetAutopilot(servers, schedule, config)`` reads each server's ``GET /autopilot/evidence`` (verified
rollouts since its cursor), feeds them all to one ``BudgetController``, and on a change publishes the
next version to every server (``POST /schedules/{name}/versions``), so the fleet serves one version
at a time. ``sync()`` (run before every poll) brings a server that missed a version (down, restarted)
up to the newest one. A server whose evidence cursor went backwards restarted: its cursor starts over.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import httpx
import numpy as np

from sparrow_server.autopilot.controller import EXACT_ACCEPTANCE, AutopilotConfig, BudgetChange, BudgetController

log = logging.getLogger(__name__)
DEFAULT_INTERVAL_S = 15.0
DEFAULT_TIMEOUT_S = 30.0


class FleetAutopilot:
    def __init__(self, servers: Sequence[str], schedule: str, config: AutopilotConfig, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        if not servers:
            raise ValueError("servers: give at least one server URL")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.servers = list(servers)
        self.schedule = schedule
        self.config = config
        self._http = [httpx.Client(base_url=url, headers=headers, timeout=timeout_s) for url in self.servers]
        self._cursors = [0] * len(self.servers)
        self.current: dict[str, Any] | None = None
        self.controller: BudgetController | None = None
        self._warned: set[tuple[int, str]] = set()  # (server, acceptance kind) refused and logged once

    def close(self) -> None:
        for client in self._http:
            client.close()

    def _get(self, i: int, path: str, **params: Any) -> dict[str, Any]:
        r = self._http[i].get(path, params=params)
        r.raise_for_status()
        return r.json()

    def _push(self, i: int, schedule: dict[str, Any], changes: list[dict[str, Any]]) -> bool:
        body = {"version": schedule["version"], "budgets_tokens": schedule["budgets_tokens"], "changes": changes,
                "weight_version": self.controller.weight_version if self.controller else None}
        try:
            r = self._http[i].post(f"/schedules/{self.schedule}/versions", json=body)
            r.raise_for_status()
            return True
        except httpx.HTTPError as exc:
            log.warning("%s: version %d not published: %s", self.servers[i], schedule["version"], exc)
            return False

    def sync(self) -> dict[str, Any]:
        """Newest version any server serves; push it to the servers behind. Returns it."""
        served = []
        for i in range(len(self.servers)):
            try:
                served.append(self._get(i, f"/schedules/{self.schedule}"))
            except httpx.HTTPError as exc:
                log.warning("%s: unreachable: %s", self.servers[i], exc)
                served.append(None)
        reachable = [s for s in served if s is not None]
        if not reachable:
            raise RuntimeError(f"no server answered GET /schedules/{self.schedule}")
        newest = max(reachable, key=lambda s: s["version"])
        for i, s in enumerate(served):
            if s is not None and s != newest:
                self._push(i, newest, [])
        if self.controller is None:
            self.controller = BudgetController(self.config, newest["budgets_tokens"], newest["page_size"],
                                               newest["sink_pages"] + newest["recent_pages"],
                                               bin_tokens=newest["bin_tokens"])
        elif tuple(newest["budgets_tokens"]) != self.controller.budgets:
            self.controller.adopt(newest["budgets_tokens"])
        self.current = newest
        return newest

    def poll(self) -> list[BudgetChange]:
        """One round: sync, pool new evidence from every server, step, publish a change to every server."""
        current = self.sync()
        ctl = self.controller
        assert ctl is not None
        for i in range(len(self.servers)):
            try:
                page = self._get(i, "/autopilot/evidence", schedule=self.schedule, after=self._cursors[i])
            except httpx.HTTPError as exc:
                log.warning("%s: no evidence: %s", self.servers[i], exc)
                continue
            if page["next"] < self._cursors[i]:  # the server restarted: its sequence starts over
                self._cursors[i] = 0
                page = self._get(i, "/autopilot/evidence", schedule=self.schedule, after=0)
            self._cursors[i] = page["next"]
            for rec in page["records"]:
                if rec["bin_tokens"] == current["bin_tokens"]:
                    bins = np.asarray(rec["basis_lengths"], dtype=np.int64) // rec["bin_tokens"]
                    # "adapter" / "kind" absent from an older server's records: no adapter, exact acceptance
                    kind = rec.get("kind", EXACT_ACCEPTANCE)
                    if kind != self.config.acceptance and (i, kind) not in self._warned:
                        self._warned.add((i, kind))
                        log.warning("%s: its %s acceptance is refused (this autopilot steers on %s)",
                                    self.servers[i], kind, self.config.acceptance)
                    ctl.observe(rec["budgets_tokens"], rec["acceptance"], bins, rec["weight_version"],
                                rec.get("adapter"), kind)
        changes = ctl.step()
        if changes:
            new = {**current, "budgets_tokens": list(ctl.budgets), "version": current["version"] + 1}
            published = [self._push(i, new, [c.to_dict() for c in changes]) for i in range(len(self.servers))]
            if any(published):
                self.current = new
        return changes

    def run(self, interval_s: float = DEFAULT_INTERVAL_S, iterations: int | None = None,
            on_change: Callable[[dict[str, Any], list[BudgetChange]], None] | None = None) -> None:
        done = 0
        while iterations is None or done < iterations:
            changes = self.poll()
            if changes and on_change is not None:
                on_change(self.current, changes)
            done += 1
            if iterations is None or done < iterations:
                time.sleep(interval_s)


__all__ = ["FleetAutopilot"]
