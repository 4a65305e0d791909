"""The reference engine's step lock lets a caller in after at most the step in progress."""
from __future__ import annotations

import threading
import time

from sparrow_server.engine.reference.step_lock import StepLock

STEPS = 200


class Loop:
    """A loop thread of ``STEPS`` empty steps whose first step waits for ``go``."""

    def __init__(self, lock: StepLock):
        self.steps = 0
        self.in_first_step, self.go = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(lock,), daemon=True)
        self.thread.start()

    def _run(self, lock: StepLock) -> None:
        for _ in range(STEPS):
            with lock.step():
                if not self.steps:
                    self.in_first_step.set()
                    self.go.wait()
                self.steps += 1


def test_a_reserved_caller_gets_in_right_after_the_step_in_progress():
    lock = StepLock()
    loop = Loop(lock)
    loop.in_first_step.wait()
    reservation = lock.reserve()  # announced while the first step runs
    loop.go.set()
    time.sleep(0.05)  # a loop that ignored the reservation would run all its steps meanwhile
    seen: list[int] = []

    def enter() -> None:
        with reservation:
            seen.append(loop.steps)

    caller = threading.Thread(target=enter)
    caller.start()
    caller.join()
    loop.thread.join()
    assert seen == [1] and loop.steps == STEPS


def test_a_caller_that_gives_up_leaves_no_announcement_behind():
    lock = StepLock()
    loop = Loop(lock)
    loop.in_first_step.wait()
    assert not lock.acquire(blocking=False)  # the first step holds it
    loop.go.set()
    loop.thread.join(timeout=60)  # the loop waits for no one: its steps take microseconds
    assert loop.steps == STEPS
    with lock:
        assert not lock.acquire(blocking=False)
