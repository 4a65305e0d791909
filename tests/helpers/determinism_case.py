"""The case of the deterministic-inference GPU test (``tests/gpu/test_deterministic.py``), planned on CPU in
``tests/engine/test_plugin_determinism.py``.

Three schedules, as in the fleet run of issue 23: a fixed 256-token budget (a schedule file the
schedulers load from ``SPARROW_SCHEDULE_DIR``), the ``qwen3-1.7b-0.86`` preset and ``dense`` (on the
tiny model's layers 2-5 the dense schedule runs the sparse path, dense by budget). Eight prompts of
1,200-3,300 tokens: past 2,048 tokens the eager plan splits a dense row's KV (a fixed split of 128
pages) where the graph plan does not. Three subjects, one per schedule, are sent alone and sit in two
mixed batches of different sizes, at different places, among other lengths and schedules.
"""
from __future__ import annotations

import random
from pathlib import Path

from sparrow_server.sparsity.schedule import dump_schedule, schedule_from_dict

FIXED = "det-budget-256"
PRESET = "qwen3-1.7b-0.86"
DENSE = "dense"
NEW = 48
LENGTHS = (1500, 3000, 1800, 2600, 1200, 3300, 2100, 1650)
SCHEDULES = (FIXED, DENSE, PRESET, FIXED, DENSE, PRESET, DENSE, FIXED)  # of the mixed batch, by prompt
SUBJECTS = {"fixed": 0, "dense": 1, "preset": 2}  # name -> prompt sent alone (1: 3,000 tokens, split eagerly)
OTHER = (5, 2, 6, 0, 3, 1)  # the second batch (six requests, subjects elsewhere, other neighbours)


def write_schedule_dir(folder: Path) -> Path:
    """A ``SPARROW_SCHEDULE_DIR`` holding the fixed-budget schedule (the schedulers load it at start)."""
    folder.mkdir(parents=True, exist_ok=True)
    schedule = schedule_from_dict({"name": FIXED, "budgets_tokens": [256],
                                   "description": "deterministic GPU test: one fixed KV budget at every length"})
    (folder / f"{FIXED}.json").write_text(dump_schedule(schedule))
    return folder


def prompts() -> list[list[int]]:
    rng = random.Random(23)
    return [[rng.randrange(10, 4000) for _ in range(n)] for n in LENGTHS]


def queries() -> dict[str, tuple[list[list[int]], list[str]]]:
    """name -> (prompts, one schedule per prompt), as ``sglang_server.generate`` takes them."""
    ps = prompts()
    out = {"mixed": (ps, list(SCHEDULES)), "other": ([ps[i] for i in OTHER], [SCHEDULES[i] for i in OTHER])}
    out.update({f"alone_{name}": ([ps[i]], [SCHEDULES[i]]) for name, i in SUBJECTS.items()})
    # the sparse subjects' prompts under dense: their schedules must move their outputs (informative)
    out.update({f"dense_of_{name}": ([ps[SUBJECTS[name]]], [DENSE]) for name in ("fixed", "preset")})
    return out


def in_batch(batch: str, subject: str) -> int:
    """Row of ``subject`` in ``batch`` (``mixed`` or ``other``)."""
    i = SUBJECTS[subject]
    return i if batch == "mixed" else OTHER.index(i)
