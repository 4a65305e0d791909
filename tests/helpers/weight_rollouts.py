"""Greedy rollouts against a live server, for the weight-update tests: a fresh in-process server on a
checkpoint (the one an updated server must now equal), a streamed rollout consumed on a thread, the
weight version a server reports."""
from __future__ import annotations

import threading

import httpx
import torch
from fastapi.testclient import TestClient

from helpers.tiny_models import TINY_VOCAB, load_plain
from sparrow_server.client import SparrowClient
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app

PROMPT = [(i * 7 + 3) % (TINY_VOCAB - 1) for i in range(100)]  # 7 pages
GREEDY = {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True}
TOL = 1e-4


class InProcessServer:
    """A fresh server in this process (the same app and engine, through ``TestClient``; cheaper
    than a second interpreter on a loaded CPU), one torch thread like ``ServerProcess``."""

    def __init__(self, model_dir):
        self.previous_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, model_dir.name, kv_pool_tokens=8192)
        self.http = TestClient(create_app(engine)).__enter__()
        self.url = str(self.http.base_url)

    def stop(self) -> None:
        self.http.__exit__(None, None, None)
        torch.set_num_threads(self.previous_threads)


class StreamInThread:
    """A streamed greedy rollout consumed on a thread; ``started`` is set at its first event."""

    def __init__(self, url: str, max_new_tokens: int = GREEDY["max_new_tokens"]):
        self.started = threading.Event()
        self.events = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(url, max_new_tokens), daemon=True)
        self.thread.start()

    def _run(self, url: str, max_new_tokens: int) -> None:
        try:
            with SparrowClient(url, timeout=120) as client:
                for event in client.stream(input_ids=PROMPT, schedule="dense",
                                           sampling_params={**GREEDY, "max_new_tokens": max_new_tokens}):
                    self.events.append(event)
                    self.started.set()
        except BaseException as exc:  # re-raised by result()
            self.error = exc
            self.started.set()

    def result(self):
        self.thread.join(timeout=120)
        assert not self.thread.is_alive() and self.error is None, self.error
        last = self.events[-1]
        return [t for e in self.events for t in e.token_ids], last.meta


def rollout(server, schedule: str = "dense"):
    """A greedy rollout from a ``ServerProcess`` or an ``InProcessServer``."""
    kwargs = dict(input_ids=PROMPT, schedule=schedule, sampling_params=GREEDY, return_selected_pages=True)
    if isinstance(server, InProcessServer):
        return SparrowClient(http=server.http).rollout(**kwargs)
    with SparrowClient(server.url, timeout=120) as client:
        return client.rollout(**kwargs)


def version(url: str) -> str:
    return httpx.get(f"{url}/get_weight_version", timeout=10).json()["weight_version"]
