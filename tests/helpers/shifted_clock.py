"""A clock a test moves instead of waiting on: monkeypatched over a module's ``time``, so a deadline
passes at a known point of a request, whatever the machine's speed."""
from __future__ import annotations

import time


class ShiftedClock:
    """Real time plus ``offset``; ``jump`` moves it past every deadline set so far."""

    def __init__(self):
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def jump(self) -> None:
        self.offset += 1e6
