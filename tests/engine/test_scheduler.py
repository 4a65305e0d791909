"""The reference engine's scheduler on its own: queues, admission, gate, aborts, retract, finish
(no model; a tiny real KV pool of 16-token pages)."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from sparrow_server.engine.base import DuplicateRequestError, FinishReason, GenerationRequest, SamplingParams
from sparrow_server.engine.reference.kv_cache import PagedKVCache
from sparrow_server.engine.reference.live_request import LiveRequest
from sparrow_server.engine.reference.scheduler import QueueCounts, Scheduler
from sparrow_server.sparsity.schedule import dense_schedule

PAGE = 16


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def scheduler(usable_pages: int = 8, max_batch_size: int = 4) -> Scheduler:
    return Scheduler(PagedKVCache(1, usable_pages + 1, PAGE, 1, 4, torch.float32), max_batch_size)


def live(loop, rid: str, tokens: int) -> LiveRequest:
    """A request reserving ``tokens`` tokens (a one-token prompt plus ``tokens - 1`` new ones)."""
    request = GenerationRequest(rid=rid, input_ids=(1,), sampling=SamplingParams(max_new_tokens=tokens - 1))
    return LiveRequest(request=request, schedule=dense_schedule(), adapter=None, queue=asyncio.Queue(), loop=loop,
                       generator=torch.Generator(), reserved_pages=-(-tokens // PAGE))


def received(loop, req: LiveRequest) -> list:
    loop.run_until_complete(asyncio.sleep(0))  # run the call_soon_threadsafe deliveries
    return [req.queue.get_nowait() for _ in range(req.queue.qsize())]


def rids(requests) -> list[str]:
    return [r.rid for r in requests]


def test_enqueue_refuses_a_live_rid(loop):
    s = scheduler()
    s.enqueue(live(loop, "a", 10))
    with pytest.raises(DuplicateRequestError):
        s.enqueue(live(loop, "a", 10))
    assert s.counts() == QueueCounts(waiting=1, running=0, live=1) and s.is_live("a") and not s.idle()


def test_admission_is_fifo_and_bounded_by_pages_and_batch_size(loop):
    s = scheduler(usable_pages=8, max_batch_size=2)
    for rid, tokens in (("a", 5 * PAGE), ("b", 4 * PAGE), ("c", PAGE), ("d", PAGE)):
        s.enqueue(live(loop, rid, tokens))
    # a reserves 5 of 8 pages; b (4) does not fit and c (1) may not overtake it
    assert rids(s.admit()) == ["a"]
    assert s.counts() == QueueCounts(waiting=3, running=1, live=4)
    s.finish(s.decode_batch()[0], FinishReason("length", length=1))
    # b fits now; c would too but the batch holds 2 at most
    assert rids(s.admit()) == ["b", "c"] and rids(s.decode_batch()) == ["b", "c"]


def test_admission_counts_the_pages_an_admitted_request_still_reserves(loop):
    s = scheduler(usable_pages=4)
    s.enqueue(live(loop, "a", 3 * PAGE))
    s.enqueue(live(loop, "b", 2 * PAGE))
    admitted = s.admit()
    a = next(admitted)
    s.cache.allocate(a.table, PAGE)  # a holds 1 page and reserves 2 more: 1 of 4 is left for b (needs 2)
    assert list(admitted) == []


def test_the_gate_stops_admission_and_decode_steps(loop):
    s = scheduler()
    s.enqueue(live(loop, "a", 10))
    s.set_gate(admitting=False, stepping=True)
    assert list(s.admit()) == []
    s.set_gate(admitting=True, stepping=True)
    assert rids(s.admit()) == ["a"]
    s.set_gate(admitting=True, stepping=False)  # paused in place: running but not decoded
    assert s.decode_batch() == [] and s.any_running()


def test_a_released_pool_admits_nothing(loop):
    s = scheduler()
    s.enqueue(live(loop, "a", 10))
    s.cache.release()
    assert list(s.admit()) == []
    s.cache.restore()
    assert rids(s.admit()) == ["a"]


def test_an_abort_is_a_mark_the_next_step_applies(loop):
    s = scheduler()
    a, b = live(loop, "a", 10), live(loop, "b", 10)
    s.enqueue(a)
    s.enqueue(b)
    list(s.admit())
    assert s.request_abort("a") and not s.request_abort("nobody")
    assert s.is_live("a")  # only marked
    aborts = s.next_step()  # returns at once: a mark is work
    assert aborts == {"a"}
    s.apply_aborts(aborts)
    (last,) = received(loop, a)
    assert last.finish.type == "abort" and not s.is_live("a") and rids(s.decode_batch()) == ["b"]


def test_next_step_waits_for_work_and_returns_none_once_stopped_and_empty(loop):
    s = scheduler()
    results = []
    waiter = threading.Thread(target=lambda: results.append(s.next_step()))
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive()  # nothing to do: it waits
    s.enqueue(live(loop, "a", 10))
    waiter.join(5)
    assert results == [set()]  # woken by the new request, nothing to abort
    s.stop()
    aborts = s.next_step()
    assert aborts == {"a"}  # stop aborts every live request first
    s.apply_aborts(aborts)
    assert s.next_step() is None


def test_retract_frees_kv_and_requeues_in_front_in_order(loop):
    s = scheduler()
    a, b, c = live(loop, "a", 20), live(loop, "b", 20), live(loop, "c", 20)
    for req in (a, b):
        s.enqueue(req)
    for req in s.admit():
        s.cache.allocate(req.table, 17)
        req.output.append(5)
    s.enqueue(c)
    s.set_gate(admitting=False, stepping=True)
    s.retract()
    assert s.cache.free_pages == s.cache.usable_pages and not s.any_running()
    assert rids(s.retracted()) == ["a", "b"]  # c holds no tokens: not retracted
    s.set_gate(admitting=True, stepping=True)
    assert rids(s.admit()) == ["a", "b", "c"]


def test_finish_sends_the_last_chunk_frees_pages_and_forgets(loop):
    s = scheduler()
    a = live(loop, "a", 20)
    s.enqueue(a)
    list(s.admit())
    s.cache.allocate(a.table, 20)
    a.output += [7, 8]
    s.finish(a, FinishReason("stop", matched=8), token_ids=(8,), logprobs=(-0.5,), extra={"kv_budget_tokens": (3,)})
    (last,) = received(loop, a)
    assert (last.rid, last.token_ids, last.logprobs, last.completion_tokens, last.finish.type) == \
        ("a", (8,), (-0.5,), 2, "stop")
    assert last.kv_budget_tokens == (3,)
    assert s.idle() and s.cache.free_pages == s.cache.usable_pages and s.counts() == QueueCounts(0, 0, 0)
    assert s.abort_all() == ()
