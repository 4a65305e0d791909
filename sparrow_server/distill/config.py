"""Settings of one DistillSparse run (a frozen dataclass, validated at construction).

Defaults follow the paper's DistillSparse worker where it publishes them (LoRA alpha 16,
"all-linear" targets, no bias, k3 loss on sampled tokens, AdamW with weight decay 0.01);
the rank is not published there, so ours is a small default.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

LOSSES = ("k3", "topk_forward_kl", "tv")
ALL_LINEAR = "all-linear"  # peft: every linear layer of the blocks (attention + MLP), not lm_head

DEFAULT_RANK = 16
DEFAULT_ALPHA = 16.0
DEFAULT_TARGET_MODULES: tuple[str, ...] = (ALL_LINEAR,)
DEFAULT_LR = 1e-4
DEFAULT_WEIGHT_DECAY = 0.01
DEFAULT_STEPS = 50
DEFAULT_BATCH = 4
DEFAULT_LOSS = "k3"
DEFAULT_CLAMP = 10.0  # |k3| per token, as the reference's low_var_kl
DEFAULT_DELTA_CLAMP = 20.0  # |logp_dense - logp_sparse| before exp, as the reference
DEFAULT_TOPK = 20  # the rollout's top-k list length (SGLang top_logprobs_num in the paper)
DEFAULT_TEMPERATURE = 1.0
DEFAULT_MAX_GRAD_NORM = 1.0
DEFAULT_HELDOUT_FRACTION = 0.25
DEFAULT_SEED = 0


class DistillConfigError(ValueError):
    """A ``DistillConfig`` field with a bad value; ``field`` names it."""

    def __init__(self, field_name: str, value: Any, reason: str):
        self.field = field_name
        self.value = value
        super().__init__(f"distill config {field_name} = {value!r}: {reason}")


@dataclass(frozen=True)
class DistillConfig:
    """One distillation run.

    ``steps`` counts optimizer steps; each takes ``batch`` sequences (rollouts are reshuffled
    every pass, so ``steps * batch / len(train)`` is the number of epochs). The loss is a
    token mean over the generated tokens of the batch. ``heldout_fraction`` of the prompts
    (at least one; all their samples) is kept out of training to measure acceptance before and after.
    """

    rank: int = DEFAULT_RANK
    alpha: float = DEFAULT_ALPHA
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    lr: float = DEFAULT_LR
    weight_decay: float = DEFAULT_WEIGHT_DECAY
    steps: int = DEFAULT_STEPS
    batch: int = DEFAULT_BATCH
    loss: str = DEFAULT_LOSS
    clamp: float = DEFAULT_CLAMP
    delta_clamp: float = DEFAULT_DELTA_CLAMP
    topk: int = DEFAULT_TOPK
    temperature: float = DEFAULT_TEMPERATURE
    max_grad_norm: float = DEFAULT_MAX_GRAD_NORM
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        _positive_int("rank", self.rank)
        _positive_int("steps", self.steps)
        _positive_int("batch", self.batch)
        _positive_int("topk", self.topk)
        for name in ("alpha", "lr", "clamp", "delta_clamp", "temperature", "max_grad_norm"):
            _positive_float(name, getattr(self, name))
        if not _finite(self.weight_decay) or self.weight_decay < 0:
            raise DistillConfigError("weight_decay", self.weight_decay, "must be a finite number >= 0")
        if not _finite(self.heldout_fraction) or not 0 <= self.heldout_fraction < 1:
            raise DistillConfigError("heldout_fraction", self.heldout_fraction, "must be in [0, 1)")
        if self.loss not in LOSSES:
            raise DistillConfigError("loss", self.loss, f"must be one of {list(LOSSES)}")
        if isinstance(self.target_modules, str) or not self.target_modules:
            raise DistillConfigError("target_modules", self.target_modules, "must be a non-empty tuple of names")
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise DistillConfigError("target_modules", self.target_modules, f"{ALL_LINEAR!r} must stand alone")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DistillConfigError("seed", self.seed, "must be an integer >= 0")

    def peft_target_modules(self) -> str | list[str]:
        """``target_modules`` as peft's ``LoraConfig`` takes it."""
        return ALL_LINEAR if self.target_modules == (ALL_LINEAR,) else list(self.target_modules)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_modules"] = list(self.target_modules)
        return d


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DistillConfigError(name, value, "must be an integer >= 1")


def _positive_float(name: str, value: Any) -> None:
    if not _finite(value) or value <= 0:
        raise DistillConfigError(name, value, "must be a finite number > 0")
