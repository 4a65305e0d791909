"""The schedule autopilot inside one server, its routes and metrics (``docs/api.md``, ``docs/metrics.md``).

``ServerAutopilot`` listens to the dense verifier: each verified rollout's per-token acceptance
goes to the ``BudgetController`` of its schedule (when an autopilot steers that schedule), and
every change the controller makes is published as a new version of the schedule (registered,
persisted, recorded with its evidence in the ``ScheduleHistory``). A request keeps the version it
resolved at admission; ``meta.schedule_id`` names it. It also keeps the last verified rollouts of
every schedule (``GET /autopilot/evidence``) so one fleet autopilot can pool several servers'
data and publish to each (``POST /schedules/{name}/versions``).

Routes: ``GET /schedules/{name}/history``; ``PUT|GET|DELETE /schedules/{name}/autopilot``;
``POST /schedules/{name}/versions``; ``GET /autopilot/evidence``. State-changing ones need the
admin token, as does the evidence (it is per-token data of live traffic).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, Query
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict

from sparrow_server.autopilot.controller import (
    DEFAULT_ACCEPTANCE,
    DEFAULT_CONFIDENCE,
    DEFAULT_LOWER_PAGES,
    DEFAULT_MARGIN,
    DEFAULT_MIN_TOKENS,
    DEFAULT_RAISE_FACTOR,
    DEFAULT_RETRY_WINDOWS,
    AutopilotConfig,
    AutopilotConfigError,
    BudgetController,
)
from sparrow_server.autopilot.history import ScheduleHistory
from sparrow_server.server.api_models import STRICT
from sparrow_server.server.errors import error_response
from sparrow_server.server.security import require_admin
from sparrow_server.sparsity.registry import UnknownScheduleError
from sparrow_server.sparsity.schedule import Schedule, ScheduleError

log = logging.getLogger(__name__)
EVIDENCE_RECORDS = 2048  # verified rollouts kept for GET /autopilot/evidence


class AutopilotIn(BaseModel):
    """``PUT /schedules/{name}/autopilot``: the fields of ``AutopilotConfig`` (same defaults)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    target: float
    margin: float = DEFAULT_MARGIN
    floor_tokens: int | None = None
    ceiling_tokens: int | None = None
    min_tokens: int = DEFAULT_MIN_TOKENS
    confidence: float = DEFAULT_CONFIDENCE
    raise_factor: float = DEFAULT_RAISE_FACTOR
    lower_pages: int = DEFAULT_LOWER_PAGES
    retry_windows: int = DEFAULT_RETRY_WINDOWS
    acceptance: str = DEFAULT_ACCEPTANCE


class VersionIn(BaseModel):
    """``POST /schedules/{name}/versions``: a version decided elsewhere (the fleet autopilot)."""

    model_config = ConfigDict(extra="forbid", **STRICT)

    version: int
    budgets_tokens: list[int]
    changes: list[dict[str, Any]] = []
    weight_version: str | None = None


class AutopilotMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.version = Gauge("sparrow_schedule_version", "Version of the schedule being served", ["schedule"], registry=r)
        self.budget = Gauge("sparrow_schedule_budget_tokens", "Live KV budget per length bin of the served version",
                            ["schedule", "length_bin"], registry=r)
        self.active = Gauge("sparrow_autopilot_active", "1 while the autopilot steers the schedule", ["schedule"], registry=r)
        self.target = Gauge("sparrow_autopilot_target", "The autopilot's p5 target", ["schedule"], registry=r)
        self.ceiling = Gauge("sparrow_autopilot_ceiling_tokens", "The autopilot's largest budget", ["schedule"], registry=r)
        self.p5 = Gauge("sparrow_autopilot_p5", "p5 of the bin's evidence window (tokens at its current budget)",
                        ["schedule", "length_bin"], registry=r)
        self.window = Gauge("sparrow_autopilot_window_tokens", "Verified tokens in the bin's evidence window",
                            ["schedule", "length_bin"], registry=r)
        self.changes = Counter("sparrow_autopilot_changes_total", "Budget changes the autopilot made",
                               ["schedule", "reason"], registry=r)

    def publish_schedule(self, schedule: Schedule) -> None:
        self.version.labels(schedule.name).set(schedule.version)
        for b, tokens in enumerate(schedule.budgets_tokens):
            self.budget.labels(schedule.name, str(b)).set(tokens)

    def publish_state(self, name: str, ctl: BudgetController) -> None:
        self.active.labels(name).set(1)
        self.target.labels(name).set(ctl.config.target)
        if ctl.config.ceiling_tokens is not None:
            self.ceiling.labels(name).set(ctl.config.ceiling_tokens)
        for b in range(len(ctl.budgets)):
            ev = ctl.evidence(b)
            self.window.labels(name, str(b)).set(ev.n_tokens if ev else 0)
            if ev is not None and ev.n_tokens >= ctl.config.min_tokens:
                self.p5.labels(name, str(b)).set(ev.p5)
            else:
                with contextlib.suppress(KeyError):  # not decided yet: no p5 to show
                    self.p5.remove(name, str(b))


class ServerAutopilot:
    """Per-schedule controllers of one server, their persisted configs, history and evidence log."""

    def __init__(self, service: Any, registry: CollectorRegistry, state_dir: Path | None = None):
        self.service = service
        self.metrics = AutopilotMetrics(registry)
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.history = ScheduleHistory(self.state_dir / "history" if self.state_dir else None)
        self._controllers: dict[str, BudgetController] = {}
        self._evidence: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVIDENCE_RECORDS)
        self._seq = 0
        self._lock = threading.RLock()
        for schedule in service.schedules.schedules():
            if not schedule.is_dense:
                self.metrics.publish_schedule(schedule)
        self._resume()

    # --- configs -----------------------------------------------------------------------------------
    def _config_path(self, name: str) -> Path | None:
        return self.state_dir / "configs" / f"{name}.json" if self.state_dir else None

    def _resume(self) -> None:
        if self.state_dir is None or not (self.state_dir / "configs").is_dir():
            return
        for path in sorted((self.state_dir / "configs").glob("*.json")):
            try:
                # Before the engine starts: the controller takes the weight version of the first verified rollout.
                self.start(path.stem, AutopilotConfig(**json.loads(path.read_text())), persist=False, weights_known=False)
            except (AutopilotConfigError, ScheduleError, UnknownScheduleError, TypeError) as exc:
                log.error("autopilot config %s not resumed: %s", path, exc)

    def start(self, name: str, config: AutopilotConfig, persist: bool = True, weights_known: bool = True) -> dict[str, Any]:
        """Steer ``name`` (a registered, sparse, non-built-in schedule) with ``config``; returns the state."""
        schedules = self.service.schedules
        schedule = schedules.get(name)
        if schedules.is_builtin(name):
            raise ScheduleError("name", name, "is a built-in schedule: register a copy under another name to steer it")
        if schedule.is_dense:
            raise ScheduleError("budgets_tokens", [], "a dense schedule has no budgets to steer")
        verifier = self.service.verifier
        if verifier is not None and config.acceptance != verifier.acceptance_kind:
            raise AutopilotConfigError("acceptance", config.acceptance,
                                       f"this server's verifier measures {verifier.acceptance_kind!r} acceptance; "
                                       f"set acceptance to {verifier.acceptance_kind!r} to steer on it (a top-k bound "
                                       "reads lower than exact: the target is then stated on the bound, docs/autopilot.md)")
        weight_version = (self.service.engine.info().weight_version or None) if weights_known else None
        ctl = BudgetController(config, schedule.budgets_tokens, schedule.page_size, schedule.reserved_pages, weight_version,
                               schedule.bin_tokens)
        with self._lock:
            self._controllers[name] = ctl
            if persist and self.state_dir is not None:
                _write_json(self._config_path(name), config.to_dict())
            self.history.record(schedule, "put", weight_version=weight_version)
            self.metrics.publish_schedule(schedule)
            self.metrics.publish_state(name, ctl)
            return self.state(name)

    def stop(self, name: str) -> bool:
        with self._lock:
            found = self._controllers.pop(name, None) is not None
            path = self._config_path(name)
            if path is not None:
                path.unlink(missing_ok=True)
            self.metrics.active.labels(name).set(0)
            return found

    def state(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            ctl = self._controllers.get(name)
            if ctl is None:
                return None
            return {"schedule": name, "version": self.service.schedules.get(name).version, **ctl.state()}

    def active(self, name: str) -> bool:
        with self._lock:
            return name in self._controllers

    # --- the verifier's listener ---------------------------------------------------------------------
    def on_verified(self, job: Any, scores: Any) -> None:
        """Called on the verifier's thread after a rollout was scored (and its weights checked)."""
        schedule: Schedule = job.schedule
        if schedule.is_dense:
            return
        # The evidence: exact values at the kept positions when the engine gave them, else per-token values
        acceptance = np.asarray(scores.evidence_acceptance, dtype=np.float64)
        basis = np.asarray(scores.evidence_basis_lengths, dtype=np.int64)
        with self._lock:
            self._seq += 1
            # rid: the rollout's id, so a client can join the per-token evidence to its own responses (an engine
            # that verifies every position exactly puts no per-token values in the response's meta)
            self._evidence.append({"seq": self._seq, "rid": job.rid, "schedule": schedule.name, "version": schedule.version,
                                   "budgets_tokens": list(schedule.budgets_tokens), "bin_tokens": schedule.bin_tokens,
                                   "weight_version": job.weight_version, "adapter": job.adapter,
                                   "kind": scores.evidence_kind, "acceptance": acceptance.round(5).tolist(),
                                   "basis_lengths": basis.tolist()})
            ctl = self._controllers.get(schedule.name)
            if ctl is None:
                return
            current = self.service.schedules.get(schedule.name)
            if current.budgets_tokens != ctl.budgets:
                ctl.adopt(current.budgets_tokens)  # replaced by a PUT meanwhile
            if schedule.bin_tokens == current.bin_tokens:
                ctl.observe(schedule.budgets_tokens, acceptance, basis // schedule.bin_tokens, job.weight_version,
                            job.adapter, scores.evidence_kind)
            changes = ctl.step()
            if changes:
                new = dataclasses.replace(current, budgets_tokens=ctl.budgets, version=current.version + 1)
                self._publish(new, "autopilot", [c.to_dict() for c in changes], ctl.weight_version)
                for c in changes:
                    self.metrics.changes.labels(schedule.name, c.reason).inc()
            self.metrics.publish_state(schedule.name, ctl)

    def _publish(self, schedule: Schedule, source: str, changes: list[dict[str, Any]], weight_version: str | None) -> None:
        self.service.engine.check_schedule(schedule)
        registry = self.service.schedules
        registry.register(schedule, persist=registry.persist_dir is not None, replace=True)
        self.history.record(schedule, source, changes, weight_version)
        self.metrics.publish_schedule(schedule)
        log.info("schedule %s: published version %d (%s): %s", schedule.name, schedule.version, source,
                 list(schedule.budgets_tokens))

    def publish_version(self, name: str, body: VersionIn) -> Schedule:
        """A version decided by the fleet autopilot (idempotent for the version already served)."""
        with self._lock:
            current = self.service.schedules.get(name)
            new = dataclasses.replace(current, budgets_tokens=tuple(body.budgets_tokens), version=body.version)
            if new == current:
                return current
            if body.version <= current.version:
                raise ScheduleError("version", body.version, f"must exceed the version served ({current.version})")
            self._publish(new, "fleet", body.changes, body.weight_version)
            return new

    def evidence(self, schedule: str | None, after: int) -> dict[str, Any]:
        with self._lock:
            records = [r for r in self._evidence if r["seq"] > after and (schedule is None or r["schedule"] == schedule)]
            return {"next": self._seq, "records": records}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def install_autopilot_routes(app: FastAPI, autopilot: ServerAutopilot) -> None:
    service = autopilot.service

    @app.exception_handler(AutopilotConfigError)
    async def _config_error(request, exc: AutopilotConfigError):
        return error_response(422, "invalid_autopilot", str(exc), field=exc.field, value=exc.value, reason=exc.reason)

    @app.get("/schedules/{name}/history")
    async def schedule_history(name: str):
        current = service.schedules.get(name)
        return {"schedule": name, "version": current.version, "versions": autopilot.history.records(name)}

    @app.put("/schedules/{name}/autopilot", dependencies=[Depends(require_admin)])
    async def start_autopilot(name: str, body: AutopilotIn):
        return autopilot.start(name, AutopilotConfig(**body.model_dump()))

    @app.get("/schedules/{name}/autopilot")
    async def autopilot_state(name: str):
        service.schedules.get(name)  # 404 for an unknown schedule
        state = autopilot.state(name)
        if state is None:
            return error_response(404, "no_autopilot", f"no autopilot steers schedule {name!r}", name=name)
        return state

    @app.delete("/schedules/{name}/autopilot", dependencies=[Depends(require_admin)])
    async def stop_autopilot(name: str):
        service.schedules.get(name)
        return {"schedule": name, "stopped": autopilot.stop(name)}

    @app.post("/schedules/{name}/versions", dependencies=[Depends(require_admin)])
    async def publish_version(name: str, body: VersionIn):
        if autopilot.active(name):
            return error_response(409, "autopilot_active", f"schedule {name!r} is steered by this server's own "
                                  "autopilot; DELETE /schedules/{name}/autopilot first", name=name)
        return autopilot.publish_version(name, body).to_dict()

    @app.get("/autopilot/evidence", dependencies=[Depends(require_admin)])
    async def evidence(schedule: str | None = None, after: int = Query(0, ge=0)):
        return JSONResponse(autopilot.evidence(schedule, after))


__all__ = ["ServerAutopilot", "AutopilotIn", "VersionIn", "install_autopilot_routes"]
