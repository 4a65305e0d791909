"""Where distillation rollouts come from: a JSONL file, the in-process reference engine, or a
running server (``generate_rollouts`` over calibration's ``ServerRolloutSource``, which ``sparrow
distill --server`` builds: the client is a layer above). The last two generate *sparse* rollouts under the schedule being distilled (the
k3 loss estimates KL(sparse || dense) only on tokens sampled from the sparse actor)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from sparrow_server.engine.base import SamplingParams
from sparrow_server.sparsity.schedule import Schedule

from .rollouts import Rollout


def generate_rollouts(source: Any, prompts: Sequence[tuple[int, ...]], schedule: Schedule, sampling: SamplingParams,
                      samples_per_prompt: int, progress: Callable[[int], None] | None = None) -> list[Rollout]:
    """Sparse rollouts from a calibration rollout source (``EngineRolloutSource`` / ``ServerRolloutSource``);
    empty completions are dropped (nothing to learn from)."""
    raw = source.generate(prompts, schedule, sampling, samples_per_prompt, progress)
    return [Rollout(tuple(r.prompt_ids) + tuple(r.completion_ids), len(r.prompt_ids)) for r in raw if r.completion_ids]


def engine_rollouts(model: Any, prompts: Sequence[tuple[int, ...]], schedule: Schedule, sampling: SamplingParams,
                    samples_per_prompt: int, progress: Callable[[int], None] | None = None) -> list[Rollout]:
    """Sparse rollouts from an in-process reference engine over ``model`` (shut down afterwards)."""
    import asyncio

    from sparrow_server.calibrate.sources import EngineRolloutSource
    from sparrow_server.engine.reference import ReferenceEngine

    engine = ReferenceEngine(model, None, "distill", page_size=schedule.page_size)
    try:
        return generate_rollouts(EngineRolloutSource(engine), prompts, schedule, sampling, samples_per_prompt, progress)
    finally:
        asyncio.run(engine.shutdown())

