"""Rollouts to distil on: token sequences with the length of their (densely prefilled) prompt.

JSONL, one object per line, either ``{"input_ids": [...], "prompt_len": n}`` or
``{"prompt_ids": [...], "output_ids": [...]}``; other keys are ignored. Only the generated
tokens (positions ``prompt_len ..``) enter the loss and the acceptance statistics.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


class RolloutError(ValueError):
    """A malformed rollout; the message names the line (when read from a file) and the field."""


@dataclass(frozen=True)
class Rollout:
    """One sequence: ``input_ids`` = prompt + generated tokens; the first ``prompt_len`` are the prompt."""

    input_ids: tuple[int, ...]
    prompt_len: int

    def __post_init__(self) -> None:
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.input_ids):
            raise RolloutError(f"input_ids: must be non-negative integers, got {list(self.input_ids)[:8]}...")
        if isinstance(self.prompt_len, bool) or not isinstance(self.prompt_len, int):
            raise RolloutError(f"prompt_len = {self.prompt_len!r}: must be an integer")
        if not 1 <= self.prompt_len < len(self.input_ids):
            raise RolloutError(
                f"prompt_len = {self.prompt_len}: must be in [1, {len(self.input_ids) - 1}] "
                f"(a non-empty prompt and at least one generated token in {len(self.input_ids)} tokens)"
            )

    @property
    def n_generated(self) -> int:
        return len(self.input_ids) - self.prompt_len


def rollout_from_dict(data: Mapping[str, Any]) -> Rollout:
    """Parse one JSON object (either accepted shape)."""
    if not isinstance(data, Mapping):
        raise RolloutError(f"a rollout must be a JSON object, got {type(data).__name__}")
    if "input_ids" in data:
        if "prompt_len" not in data:
            raise RolloutError("prompt_len: required with input_ids")
        return Rollout(tuple(_id_list("input_ids", data["input_ids"])), data["prompt_len"])
    if "prompt_ids" in data and "output_ids" in data:
        prompt = _id_list("prompt_ids", data["prompt_ids"])
        return Rollout(tuple(prompt) + tuple(_id_list("output_ids", data["output_ids"])), len(prompt))
    raise RolloutError(f"needs input_ids + prompt_len or prompt_ids + output_ids; keys are {sorted(data)}")


def _id_list(name: str, value: Any) -> list[int]:
    if not isinstance(value, list):
        raise RolloutError(f"{name}: must be a list of token ids, got {type(value).__name__}")
    return value


def load_rollouts(path: str | Path) -> list[Rollout]:
    """Read a JSONL file of rollouts (blank lines skipped). Errors name the line."""
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(rollout_from_dict(json.loads(line)))
            except (json.JSONDecodeError, RolloutError) as exc:
                raise RolloutError(f"{path}:{lineno}: {exc}") from exc
    if not out:
        raise RolloutError(f"{path}: no rollouts")
    return out


def dump_rollouts(rollouts: Iterable[Rollout], path: str | Path) -> None:
    """Write rollouts as JSONL (the ``input_ids`` + ``prompt_len`` shape)."""
    with open(path, "w") as f:
        for r in rollouts:
            f.write(json.dumps({"input_ids": list(r.input_ids), "prompt_len": r.prompt_len}) + "\n")


def split_heldout(rollouts: Sequence[Rollout], fraction: float, seed: int) -> tuple[list[Rollout], list[Rollout]]:
    """Seeded (train, heldout) split by *prompt*: every sample of a prompt lands on the same side, so
    held-out acceptance is measured on prompts the adapter never saw. Holds out ``round(fraction *
    prompts)`` prompts, at least one when ``fraction > 0``, and keeps at least one for training."""
    if not rollouts:
        raise RolloutError("no rollouts to split")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r.input_ids[: r.prompt_len], []).append(i)
    keys = list(groups)
    random.Random(seed).shuffle(keys)
    if fraction == 0:
        n_held = 0
    elif len(keys) < 2:
        raise RolloutError(f"{len(rollouts)} rollout(s) of {len(keys)} prompt: need 2 prompts or more to hold one out")
    else:
        n_held = min(max(1, round(fraction * len(keys))), len(keys) - 1)
    held = sorted(i for k in keys[:n_held] for i in groups[k])
    train = sorted(i for k in keys[n_held:] for i in groups[k])
    return [rollouts[i] for i in train], [rollouts[i] for i in held]
