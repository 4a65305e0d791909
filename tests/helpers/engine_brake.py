"""Holding a reference engine's loop in a known decode step, so that a test acts at a known token
count whatever the machine's speed.

The loop runs on its own thread. A test that waits for a request's n-th token and then pauses or
updates races it: on a busy machine the request can finish first (CI once saw a 200-token request
finish before the pause meant to retract it). Braked, the loop waits inside its ``at``-th decode
call; the test releases it once its control call has taken effect."""
from __future__ import annotations

import asyncio
import itertools
import threading


class DecodeBrake:
    """Holds the engine's loop inside its ``at``-th decode call (counted from here) until released."""

    def __init__(self, engine, at: int):
        self.reached, self._released = threading.Event(), threading.Event()
        decode, calls = engine.runner.decode, itertools.count(1)

        def braked(*args, **kwargs):
            if next(calls) == at:
                self.reached.set()
                self._released.wait()
            return decode(*args, **kwargs)

        engine.runner.decode = braked

    async def until_reached(self) -> None:
        while not self.reached.is_set():
            await asyncio.sleep(0.002)

    def release(self) -> None:
        self._released.set()


class LoopPark:
    """Parks a reference engine's loop BETWEEN two steps while ``when()`` holds (checked on the loop's
    thread after every step, before it collects the next step's aborts), until ``go`` or a new ``park_when``.

    Unlike ``DecodeBrake`` the parked loop holds no step lock: flush, release, pause and the weights
    checker run as they do between any two steps. Nothing the loop applies happens while parked: an abort
    is marked at once (``request_abort``) and applied at the first step after ``go``. Use as a context
    manager: leaving it lets the loop go and restores ``scheduler.next_step``."""

    def __init__(self, engine):
        self._scheduler = engine.scheduler
        self._next_step = engine.scheduler.next_step
        self._own = "next_step" in vars(engine.scheduler)  # already wrapped by someone else: put theirs back
        self._cond = threading.Condition()
        self._when = None
        self._parked = False

        def gated():
            with self._cond:
                while self._when is not None and self._when():
                    self._parked = True
                    self._cond.notify_all()
                    self._cond.wait()
                self._parked = False
            return self._next_step()

        engine.scheduler.next_step = gated

    def park_when(self, when) -> None:
        """From the loop's next check on, park while ``when()`` holds (a parked loop checks again now)."""
        with self._cond:
            self._when, self._parked = when, False
            self._cond.notify_all()

    def wait_parked(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._parked, timeout_s):
                raise AssertionError("the engine loop did not park")

    @property
    def parked(self) -> bool:
        with self._cond:
            return self._parked

    def go(self) -> None:
        with self._cond:
            self._when, self._parked = None, False
            self._cond.notify_all()

    def close(self) -> None:
        self.go()
        if self._own:
            self._scheduler.next_step = self._next_step
        else:
            del self._scheduler.next_step

    def __enter__(self) -> "LoopPark":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
