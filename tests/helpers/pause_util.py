"""Pinning a reference engine's requests in a known state over HTTP, whatever the machine's speed.

``pause_in_place``/``continue_generation``: the server's ``/pause_generation {"mode": "in_place"}``
and ``/continue_generation``. Paused in place, running requests decode no further step and
queued ones are not admitted, so nothing finishes by length however long a test takes.

``run_one_step_then_freeze``: requests queued behind an in-place pause are let go together and
frozen again after exactly their prefill and first decode step (two tokens each, streamed),
with a ``DecodeBrake`` holding the loop inside that step until the new pause's gate is closed.
No timing is involved: a test acts on requests that are provably live and provably far from done.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from helpers.engine_brake import DecodeBrake
from helpers.live_server import wait_until

IN_PLACE = "in_place"
TOKENS_WHEN_FROZEN = 2  # the prefill's token and the one decode step's


def pause_in_place(url: str) -> dict:
    reply = httpx.post(f"{url}/pause_generation", json={"mode": IN_PLACE}, timeout=60)
    reply.raise_for_status()
    assert reply.json()["paused"] == IN_PLACE, reply.text
    return reply.json()


def continue_generation(url: str) -> dict:
    reply = httpx.post(f"{url}/continue_generation", json={}, timeout=60)
    reply.raise_for_status()
    assert reply.json()["paused"] is None, reply.text
    return reply.json()


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


__all__ = ["pause_in_place", "continue_generation", "run_one_step_then_freeze", "TOKENS_WHEN_FROZEN"]
