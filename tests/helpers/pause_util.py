"""Pinning a reference engine's requests in a known state over HTTP, whatever the machine's speed.

``pause_in_place``/``continue_generation``: the server's ``/pause_generation {"mode": "in_place"}``
and ``/continue_generation``. Paused in place, running requests decode no further step and
queued ones are not admitted, so nothing finishes by length however long a test takes.

``run_one_step_then_freeze``: requests queued behind an in-place pause are let go together and
frozen again after exactly their prefill and first decode step (two tokens each, streamed),
with a ``DecodeBrake`` holding the loop inside that step until the new pause's gate is closed.
No timing is involved: a test acts on requests that are provably live and provably far from done.

``update_while_streaming``: a weight update that lands while streams are provably mid-rollout (held in
their first decode step) and must wait ``DRAIN_HOLD_S`` or more for them.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from helpers.engine_brake import DecodeBrake
from helpers.live_server import wait_until
from sparrow_server.client.weights import pause, resume

IN_PLACE = "in_place"
TOKENS_WHEN_FROZEN = 2  # the prefill's token and the one decode step's
DRAIN_HOLD_S = 0.1  # update_while_streaming holds the in-flight streams this long after the update closed the gate


def pause_in_place(url: str) -> dict:
    reply = pause([url], IN_PLACE, timeout=60)[url]
    assert reply["paused"] == IN_PLACE, reply
    return reply


def continue_generation(url: str) -> dict:
    reply = resume([url], timeout=60)[url]
    assert reply["paused"] is None, reply
    return reply


def run_one_step_then_freeze(engine, url: str, count: int, timeout_s: float = 60) -> None:
    """Generation must be paused in place with ``count`` requests queued (none running) when called.
    On return: generation is paused in place again and no step runs; the ``count`` requests were
    admitted together and each has generated exactly ``TOKENS_WHEN_FROZEN`` tokens (all sent to its
    stream; the second after the pause's gate closed), so none can have finished by length."""
    assert engine.weight_sync.mode == IN_PLACE, "pause in place before queueing the requests"
    wait_until(lambda: engine.scheduler.counts().waiting == count, timeout_s, f"{count} requests queued")
    assert engine.scheduler.counts().running == 0
    unbraked = engine.runner.decode
    brake = DecodeBrake(engine, at=1)
    try:
        continue_generation(url)  # the loop admits and prefills every queued request, then decodes them together
        wait_until(brake.reached.is_set, timeout_s, "the requests' first decode step")
        assert engine.scheduler.counts().running == count, "all were queued: all are admitted in one pass"
        running = engine.scheduler.live()  # the loop is held: these are the requests, one token each
        with ThreadPoolExecutor(1) as pool:
            pausing = pool.submit(pause_in_place, url)  # waits for the braked step to end
            wait_until(lambda: engine.weight_sync.mode == IN_PLACE or pausing.done(), timeout_s, "the pause's gate")
            brake.release()
            pausing.result()
    finally:
        brake.release()
        engine.runner.decode = unbraked
    # (a test's clients may already be dropping them: their second token was sent after the gate closed)
    assert len(running) == count and all(len(r.output) == TOKENS_WHEN_FROZEN for r in running), \
        [len(r.output) for r in running]
    assert engine.weight_sync.mode == IN_PLACE


def update_while_streaming(engine, url: str, start_streams: Callable[[], list], update: Callable[[], Any],
                           timeout_s: float = 120) -> tuple[list, Any]:
    """Pauses in place, starts ``start_streams()`` (they queue), lets them go and holds the loop in their first
    decode step; runs ``update()`` on a thread until the swap closes the gate, holds the streams ``DRAIN_HOLD_S``
    longer, then lets them finish. Returns the streams and ``update()``'s result: the update's drain lasted at
    least ``DRAIN_HOLD_S`` and the streams finished on the old weights, unless the swap does not drain."""
    pause_in_place(url)
    streams = start_streams()  # queued behind the pause, then started together
    wait_until(lambda: engine.scheduler.counts().waiting == len(streams), timeout_s, f"{len(streams)} streams queued")
    brake = DecodeBrake(engine, at=1)  # their first decode step: all running, far from done
    continue_generation(url)
    try:
        wait_until(brake.reached.is_set, timeout_s, "the streams' first decode step")
        with ThreadPoolExecutor(1) as pool:
            updating = pool.submit(update)
            wait_until(lambda: engine.weight_sync.updating or updating.done(), timeout_s,
                       "the update to close the gate")
            time.sleep(DRAIN_HOLD_S)  # a sleep lasts at least this long: so does the update's drain
            brake.release()
            return streams, updating.result()
    finally:
        brake.release()


__all__ = ["pause_in_place", "continue_generation", "run_one_step_then_freeze", "update_while_streaming",
           "TOKENS_WHEN_FROZEN", "DRAIN_HOLD_S"]
