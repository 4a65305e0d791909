"""Optional capabilities of an engine, each a typed port ``Engine`` hands out or answers ``None``
for (the service asks, it never probes attributes)."""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class LoadedAdapter:
    """One LoRA adapter in the engine, under the name requests use."""

    name: str
    path: str


@runtime_checkable
class AdapterPort(Protocol):
    """Loading LoRA adapters into a running engine (blocking: the version manager calls it off the loop)."""

    def load_adapter(self, name: str, path: str) -> None: ...

    def unload_adapter(self, name: str) -> None: ...

    def loaded_adapters(self) -> tuple[LoadedAdapter, ...]:
        """The adapters loaded now (at start: ``serve --adapter NAME=PATH``)."""
        ...


@dataclass(frozen=True)
class LocalModel:
    """The engine's model in this process, for exact verification and the base-model fingerprint."""

    current: Callable[[], Any]  # the model now (weight updates and adapters replace the object)
    step_lock: AbstractContextManager  # held during each engine step: a forward under it never meets a decode

    @property
    def model(self) -> Any:
        return self.current()


class DenseScorer(Protocol):
    """Scores a finished rollout densely on the engine itself (the verifier calls it on its thread)."""

    def dense_topk(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], k: int,
                   temperature: float) -> tuple[Any, Any]:
        """(values, token ids) of the dense top-``k`` logprobs at each completion position."""
        ...

    def weight_version(self) -> str | None:
        """The weight version of the last dense forward (checked against the rollout's)."""
        ...


@dataclass(frozen=True)
class DenseScoring:
    """What an engine without an in-process model offers the verifier: its scorer, and how many
    sparse top-k logprobs each verified request must record for it."""

    scorer: DenseScorer
    record_topk: int
    # > 0: the scorer also gives exact acceptance at every exact_stride-th generated position of a request
    # that asked for them at admission (``GenerationRequest.exact_keep``; issue 25). 0: the bound only.
    exact_stride: int = 0


__all__ = ["AdapterPort", "LoadedAdapter", "LocalModel", "DenseScorer", "DenseScoring"]
