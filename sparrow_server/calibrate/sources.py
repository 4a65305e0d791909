"""Where calibration rollouts come from: an in-process engine (the reference engine) or a running
server (through the client). Both generate sparse rollouts under one fixed-budget schedule."""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from sparrow_server.engine.base import GenerationRequest, SamplingParams
from sparrow_server.sparsity.schedule import Schedule

DEFAULT_CONCURRENCY = 8

Progress = Callable[[int], None]  # called with the number of rollouts just finished


@dataclass(frozen=True)
class Rollout:
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


class EngineRolloutSource:
    """Sparse rollouts from an in-process ``Engine`` (its batching loop decodes them together)."""

    def __init__(self, engine: Any):
        self.engine = engine

    def generate(self, prompts: Sequence[tuple[int, ...]], schedule: Schedule, sampling: SamplingParams,
                 samples_per_prompt: int = 1, progress: Progress | None = None) -> list[Rollout]:
        requests = [
            GenerationRequest(rid=f"calib-{uuid.uuid4().hex[:12]}", input_ids=tuple(p), schedule=schedule,
                              sampling=_with_seed(sampling, i * samples_per_prompt + j))
            for i, p in enumerate(prompts) for j in range(samples_per_prompt)
        ]
        return asyncio.run(self._run(requests, progress))

    async def _run(self, requests: list[GenerationRequest], progress: Progress | None) -> list[Rollout]:
        await self.engine.start()

        async def one(request: GenerationRequest) -> Rollout:
            tokens: list[int] = []
            async for chunk in self.engine.submit(request):
                tokens.extend(chunk.token_ids)
                if chunk.finish is not None and chunk.finish.type not in ("stop", "length"):
                    raise RuntimeError(f"calibration rollout {request.rid} ended with {chunk.finish.to_dict()}")
            if progress is not None:
                progress(1)
            return Rollout(request.input_ids, tuple(tokens))

        return list(await asyncio.gather(*(one(r) for r in requests)))


class ServerRolloutSource:
    """Sparse rollouts from a running server: registers the schedule (``PUT /schedules/{name}``),
    then posts ``/rollout`` requests ``concurrency`` at a time."""

    def __init__(self, client: Any, concurrency: int = DEFAULT_CONCURRENCY):
        self.client = client
        self.concurrency = concurrency

    def generate(self, prompts: Sequence[tuple[int, ...]], schedule: Schedule, sampling: SamplingParams,
                 samples_per_prompt: int = 1, progress: Progress | None = None) -> list[Rollout]:
        self.client.put_schedule(schedule.name, schedule.to_dict())
        bodies = [
            {"input_ids": list(p), "schedule": schedule.name, "n": 1, "rid": f"calib-{uuid.uuid4().hex[:12]}",
             "sampling_params": _sampling_json(_with_seed(sampling, i * samples_per_prompt + j))}
            for i, p in enumerate(prompts) for j in range(samples_per_prompt)
        ]
        out: list[Rollout] = []
        for start in range(0, len(bodies), self.concurrency):
            batch = bodies[start:start + self.concurrency]
            for body, result in zip(batch, self.client.rollout_batch(batch, concurrency=self.concurrency)):
                out.append(Rollout(tuple(body["input_ids"]), tuple(result.token_ids)))
            if progress is not None:
                progress(len(batch))
        return out


def _with_seed(sampling: SamplingParams, offset: int) -> SamplingParams:
    return sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + offset)


def _sampling_json(sampling: SamplingParams) -> dict[str, Any]:
    body = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
            "ignore_eos": sampling.ignore_eos}
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body
