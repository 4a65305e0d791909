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
