"""The case of the per-request dense-layers GPU test (``tests/gpu/test_dense_layers.py``), CPU-checked
in ``tests/engine/test_plugin_dense_layers.py``.

The tiny checkpoint has 6 layers; the server's default schedule (``dense``) keeps layers 0-1 dense, so
layers 2-5 run the sparse path. ``odd_schedule`` is the base preset with layers 2-4 kept dense as
well (layer 5 stays sparse, so one request mixes dense-by-budget and sparse layers). Four 1.5K-token
prompts decode sparsely under the base preset's 512-token budget; in the mixed batch one of them asks
for the odd schedule.
"""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from sparrow_server.sparsity.registry import ScheduleRegistry
from sparrow_server.sparsity.schedule import Schedule, dump_schedule

BASE = "qwen3-1.7b-0.86"
ODD_DENSE_LAYERS = (0, 1, 2, 3, 4)
ODD = "qwen3-1.7b-0.86-dense-0-4"
ODD_AT = 1                      # the mixed batch's request with the odd schedule
NUM_LAYERS = 6                  # benchmarks/sglang_server.TINY
PROMPT_TOKENS = 1500
NEW = 48


def odd_schedule(registry: ScheduleRegistry | None = None) -> Schedule:
    base = (registry or ScheduleRegistry()).get(BASE)
    return replace(base, name=ODD, dense_layers=ODD_DENSE_LAYERS, threshold=None,
                   description=f"{BASE} with layers {list(ODD_DENSE_LAYERS)} dense (GPU test of per-request dense layers)")


def write_schedule_dir(folder: Path) -> Path:
    """A ``SPARROW_SCHEDULE_DIR`` holding the odd schedule (the schedulers load it at start)."""
    folder.mkdir(parents=True, exist_ok=True)
    s = odd_schedule()
    (folder / f"{s.name}.json").write_text(dump_schedule(s))
    return folder


def prompts(n: int = 4) -> list[list[int]]:
    rng = random.Random(24)
    return [[rng.randrange(10, 4000) for _ in range(PROMPT_TOKENS + 7 * i)] for i in range(n)]


def mixed_schedules(n: int = 4) -> list[str]:
    return [ODD if i == ODD_AT else BASE for i in range(n)]


def queries() -> dict[str, tuple[list[list[int]], str | list[str]]]:
    """name -> (prompts, schedule or one per prompt), as ``sglang_server.generate`` takes them."""
    long = prompts()
    return {"base": (long, BASE), "mixed": (long, mixed_schedules()), "odd_alone": ([long[ODD_AT]], ODD),
            "odd": (long, ODD), "dense": (long, "dense")}
