"""Samplers: n rollouts per prompt from Sparrow servers, as uniform ``Sample`` records.

* ``RolloutSampler`` sends ``POST /rollout`` straight to the servers (prompts spread round-robin),
  with the schedule and adapter as top-level fields.
* ``GenerateSampler`` sends SGLang's ``POST /generate`` to a router (or one server). The client
  puts the schedule in ``sampling_params.custom_params.sparrow_schedule`` and in ``extra_key``
  (``sparrow_schedule=NAME``), the one of the two that SGLang's router keeps (docs/fleet.md).
  Every sample records the schedule the server reports, and the importance weights use the
  logprobs the server returned, so the correction stays right whichever schedule served it.

All prompts of a step are in flight at once so that each server batches them; every request
carries a ``rid`` and connection errors are retried with the same ``rid`` (the client's policy).
"""
from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

from sparrow_server.client import SparrowClient
from sparrow_server.client.common import DEFAULT_TIMEOUT_S
from sparrow_server.client.types import RolloutResult


@dataclass(frozen=True)
class Sample:
    """One completion. ``sparse_logprobs[i]``: behaviour-policy logprob of ``token_ids[i]`` at the
    sampling temperature, as the server computed it (sparse attention, adapter if any)."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    sparse_logprobs: tuple[float, ...]
    schedule: str
    adapter: str | None
    weight_version: str
    kv_budget_tokens_mean: float | None


@dataclass(frozen=True)
class SamplingSettings:
    n: int
    max_new_tokens: int
    temperature: float
    seed: int


def http_client(url: str, api_key: str | None, timeout: float = DEFAULT_TIMEOUT_S) -> SparrowClient:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return SparrowClient(http=httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers=headers))


def _parallel(fn, items: Sequence[Any]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        return list(pool.map(fn, items))


class RolloutSampler:
    """``POST /rollout`` on the servers themselves (the router does not forward /rollout)."""

    def __init__(self, urls: Sequence[str], schedule: str, api_key: str | None = None):
        if not urls:
            raise ValueError("urls: give at least one server URL")
        self.clients = [http_client(u, api_key) for u in urls]
        self.schedule = schedule
        self.adapter: str | None = None

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def sample(self, prompts: Sequence[Sequence[int]], settings: SamplingSettings) -> list[Sample]:
        def one(index: int) -> list[Sample]:
            client = self.clients[index % len(self.clients)]
            results = client.rollout(
                input_ids=list(prompts[index]), n=settings.n, schedule=self.schedule, adapter=self.adapter,
                sampling_params={"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                                 "seed": settings.seed + index * settings.n},
            )
            results = results if isinstance(results, list) else [results]
            return [_from_rollout(index, prompts[index], r) for r in results]

        return [s for group in _parallel(one, range(len(prompts))) for s in group]


def _from_rollout(index: int, prompt: Sequence[int], r: RolloutResult) -> Sample:
    return Sample(index, tuple(prompt), tuple(r.token_ids), tuple(r.logprobs), r.meta.schedule, r.meta.adapter,
                  r.meta.weight_version, r.meta.kv_budget_tokens_mean)


class GenerateSampler:
    """SGLang ``POST /generate`` (one request per prompt with ``sampling_params.n``) to a router."""

    def __init__(self, url: str, schedule: str, api_key: str | None = None):
        self.client = http_client(url, api_key)
        self.schedule = schedule
        self.adapter: str | None = None

    def close(self) -> None:
        self.client.close()

    def payload(self, prompt: Sequence[int], index: int, settings: SamplingSettings) -> dict[str, Any]:
        body: dict[str, Any] = {
            "input_ids": list(prompt), "rid": uuid.uuid4().hex, "return_logprob": True,
            "sampling_params": {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                                "n": settings.n, "sampling_seed": settings.seed + index * settings.n},
        }
        if self.adapter:
            body["lora_path"] = self.adapter
        return body

    def sample(self, prompts: Sequence[Sequence[int]], settings: SamplingSettings) -> list[Sample]:
        def one(index: int) -> list[Sample]:
            answer = self.client.generate(self.payload(prompts[index], index, settings), schedule=self.schedule)
            answers = answer if isinstance(answer, list) else [answer]
            return [_from_generate(index, prompts[index], a) for a in answers]

        return [s for group in _parallel(one, range(len(prompts))) for s in group]


def _from_generate(index: int, prompt: Sequence[int], answer: dict[str, Any]) -> Sample:
    meta = answer["meta_info"]
    sparrow = meta.get("sparrow", {})
    logprobs = tuple(float(entry[0]) for entry in meta["output_token_logprobs"])
    return Sample(index, tuple(prompt), tuple(answer["output_ids"]), logprobs, sparrow.get("schedule", "?"),
                  sparrow.get("adapter"), str(meta.get("weight_version", "")), sparrow.get("kv_budget_tokens_mean"))
