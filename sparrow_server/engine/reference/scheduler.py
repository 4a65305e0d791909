"""The reference engine's scheduler: the one owner of its requests' lifecycle.

It holds the waiting queue (FIFO), the running batch, the live set (every request accepted and not
yet finished), the pending aborts and the gate (may requests be admitted, may decode steps run),
all changed under one condition, and the step lock the engine's loop holds during each step.
Other threads (submit and abort on the event loop, weight sync, memory control, the verifier) use
its verbs and never touch the queues.

A request's life: ``enqueue`` -> ``admit`` (into the running batch; the engine prefills it) ->
``finish``; a pause may ``retract`` it (KV freed, back to the front of the queue, tokens kept).
``request_abort`` only marks it: the loop finishes it at the start of its next step
(``next_step`` wakes on the mark), so an abort lands within one step.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator

from sparrow_server.engine.base import DuplicateRequestError, FinishReason
from sparrow_server.engine.reference.kv_cache import PagedKVCache
from sparrow_server.engine.reference.live_request import LiveRequest
from sparrow_server.engine.reference.step_lock import StepLock


@dataclass(frozen=True)
class QueueCounts:
    """One consistent look at the queues."""

    waiting: int
    running: int
    live: int


class Scheduler:
    def __init__(self, cache: PagedKVCache, max_batch_size: int):
        self.cache = cache
        self.max_batch_size = max_batch_size
        self._cond = threading.Condition()  # every change below happens under it
        self._step_lock = StepLock()  # held by the loop during each step, and by callers between steps
        self._waiting: collections.deque[LiveRequest] = collections.deque()
        self._running: list[LiveRequest] = []
        self._live: dict[str, LiveRequest] = {}
        self._abort_rids: set[str] = set()
        self._stopping = False
        self._admitting = True
        self._stepping = True

    # ----- any thread ----------------------------------------------------------------------------
    def enqueue(self, request: LiveRequest) -> None:
        with self._cond:
            if request.rid in self._live:
                raise DuplicateRequestError(f"rid {request.rid!r} is already live")
            self._live[request.rid] = request
            self._waiting.append(request)
            self._cond.notify_all()

    def request_abort(self, rid: str) -> bool:
        """Mark ``rid`` for abort at the start of the next step; False when it is not live."""
        with self._cond:
            if rid not in self._live:
                return False
            self._abort_rids.add(rid)
            self._cond.notify_all()
            return True

    def abort_all(self) -> tuple[str, ...]:
        """Mark every live request for abort; their rids."""
        with self._cond:
            rids = tuple(self._live)
            self._abort_rids.update(rids)
            self._cond.notify_all()
            return rids

    def start(self) -> None:
        with self._cond:
            self._stopping = False

    def stop(self) -> None:
        """Abort every live request; the loop returns once none is left."""
        with self._cond:
            self._abort_rids.update(self._live)
            self._stopping = True
            self._cond.notify_all()

    def set_gate(self, *, admitting: bool, stepping: bool) -> None:
        """Whether waiting requests may be admitted and running ones decoded (pauses, updates)."""
        with self._cond:
            self._admitting, self._stepping = admitting, stepping
            self._cond.notify_all()

    def wake(self) -> None:
        """Look at the queues again (the KV pool came back)."""
        with self._cond:
            self._cond.notify_all()

    def live(self) -> tuple[LiveRequest, ...]:
        with self._cond:
            return tuple(self._live.values())

    def is_live(self, rid: str) -> bool:
        with self._cond:
            return rid in self._live

    def any_live(self, rids: Iterable[str]) -> bool:
        with self._cond:
            return any(rid in self._live for rid in rids)

    def idle(self) -> bool:
        """No request is live."""
        with self._cond:
            return not self._live

    def counts(self) -> QueueCounts:
        with self._cond:
            return QueueCounts(waiting=len(self._waiting), running=len(self._running), live=len(self._live))

    @property
    def step_lock(self) -> StepLock:
        """Held by the loop for each step; taken by anyone else (after at most the step in progress),
        the loop is between two steps and stays there (model and cache changes, retract, the
        verifier's forward)."""
        return self._step_lock

    # ----- the loop (and callers holding the step lock) --------------------------------------------
    def next_step(self) -> set[str] | None:
        """Block until a step has work; the rids to abort in it, or None once stopped with nothing live."""
        with self._cond:
            while not (self._abort_rids or self._stopping or self._has_work()):
                self._cond.wait()
            if self._stopping and not self._live:
                return None
            aborts, self._abort_rids = self._abort_rids, set()
            return aborts

    def apply_aborts(self, rids: set[str]) -> None:
        with self._cond:
            doomed = [r for r in (*self._waiting, *self._running) if r.rid in rids]
        for request in doomed:
            self.finish(request, FinishReason("abort", message="aborted"))

    def admit(self) -> Iterator[LiveRequest]:
        """Move waiting requests into the running batch while the gate, the batch size and the free
        pages allow, yielding each; the caller prefills it before the next one is considered (its
        pages count then). FIFO: no overtaking, so large requests are not starved."""
        while True:
            with self._cond:
                if not (self._waiting and len(self._running) < self.max_batch_size and self._may_admit()):
                    return
                head = self._waiting[0]
                if self.cache.free_pages - self._outstanding_reservations() < head.reserved_pages:
                    return  # wait for pages
                self._running.append(self._waiting.popleft())
            yield head

    def decode_batch(self) -> list[LiveRequest]:
        """The running requests this step decodes (none while paused in place)."""
        with self._cond:
            return list(self._running) if self._stepping else []

    def any_running(self) -> bool:
        with self._cond:
            return bool(self._running)

    def finish(self, request: LiveRequest, reason: FinishReason, token_ids=(), logprobs=(),
               extra: dict | None = None) -> None:
        """Send the last chunk, free the pages and forget the request."""
        with self._cond:
            if request in self._running:
                self._running.remove(request)
            if request in self._waiting:
                self._waiting.remove(request)
            self._live.pop(request.rid, None)
        self.cache.free(request.table)
        request.send(request.chunk(token_ids=tuple(token_ids), logprobs=tuple(logprobs), finish=reason,
                                   **(extra or {})))

    def retract(self) -> None:
        """Free the running requests' KV and put them back in front of the queue, tokens kept."""
        with self._cond:
            running, self._running = self._running, []
            self._waiting.extendleft(reversed(running))
        for request in running:
            self.cache.free(request.table)

    def retracted(self) -> list[LiveRequest]:
        """Waiting requests that were retracted (they hold tokens already)."""
        with self._cond:
            return [r for r in self._waiting if r.output]

    # ----- internals (under the condition) ---------------------------------------------------------
    def _may_admit(self) -> bool:
        return self._admitting and not self.cache.released

    def _has_work(self) -> bool:
        return bool((self._waiting and self._may_admit()) or (self._running and self._stepping))

    def _outstanding_reservations(self) -> int:
        return sum(r.reserved_pages - len(r.table.pages) for r in self._running)


__all__ = ["QueueCounts", "Scheduler"]
