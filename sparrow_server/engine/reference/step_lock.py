"""The reference engine's step lock: held by the loop during each step, and by other threads
(pause and retract, weight swaps, memory control, adapter loads, the verifier's forward) between
two steps.

It is fair to those callers. A plain ``threading.Lock`` is not: the loop releases it and takes it
again a few microseconds later, often before a waiting thread wakes, so nothing bounded the steps
a retract could wait through (in CI a 200-token request finished before the pause meant to retract
it). Here a caller announces itself before it waits, and the loop does not start another
step while one is announced: a caller gets in after at most the step in progress. A caller on the
event loop announces itself there (``reserve``), before it hands the work to a thread.
"""
from __future__ import annotations

import contextlib
import threading
from typing import ContextManager, Iterator


class StepLock:
    """``with lock:`` (or ``acquire``/``release``) for callers; ``with lock.step():`` for the loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._callers = 0  # announced callers: waiting for the lock or holding it

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._arrive()
        if self._lock.acquire(blocking, timeout):
            return True
        self._leave()
        return False

    def release(self) -> None:
        self._lock.release()
        self._leave()

    def __enter__(self) -> StepLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def reserve(self) -> ContextManager[None]:
        """Announce a caller now; entering the returned context (on any thread, exactly once) takes the
        lock, leaving it releases the lock. From now on the loop starts no step after the one in progress."""
        self._arrive()
        return self._reserved()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """The loop's hold for one step: it waits first while any caller is announced."""
        with self._cond:
            while self._callers:
                self._cond.wait()
        with self._lock:
            yield

    @contextlib.contextmanager
    def _reserved(self) -> Iterator[None]:
        self._lock.acquire()
        try:
            yield
        finally:
            self.release()

    def _arrive(self) -> None:
        with self._cond:
            self._callers += 1

    def _leave(self) -> None:
        with self._cond:
            self._callers -= 1
            self._cond.notify_all()


__all__ = ["StepLock"]
