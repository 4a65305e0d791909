"""Per-token acceptance of one finished rollout against the dense policy.

The dense policy is the *base* model with stock (dense) attention: the request's LoRA adapter
is never applied to it (``adapter_scope(model, None)`` disables peft adapters). The sparse
policy is what produced the rollout: the model (with the request's adapter) under the request's
schedule. Two ways to get its distribution per generated token:

- exact: a teacher-forced sparse forward (``teacher_forced_logits``, which reproduces decode's
  page selections at every position), then ``exact_acceptance`` against the dense forward;
- top-k lower bound: the top-k (ids, logprobs) recorded during decoding (SGLang), against the
  dense pass's top-k (``topk_acceptance_lower_bound``; never above the exact value);
- exact on a subsample (SGLang, issue 25): the exact value at the kept positions (``stats.exact_subsample``),
  which is the evidence (``AcceptanceScores.evidence_*``), and the top-k lower bound of the same rows there.

Positions: completion token ``i`` (0-based) is produced by the step that attends ``prompt_len + i``
tokens (token 0 by the dense prefill); logit row ``prompt_len - 1 + i`` of the sequence predicts it.
Shapes: ``P`` prompt tokens, ``N`` completion tokens, ``V`` vocabulary, ``K`` top-k.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from sparrow_server.autopilot.controller import EXACT_ACCEPTANCE, TOPK_BOUND_ACCEPTANCE
from sparrow_server.modeling.sparse_forward import attention_implementation, teacher_forced_logits
from sparrow_server.sparsity.schedule import Schedule
from sparrow_server.stats.acceptance import exact_acceptance, logits_to_topk, topk_acceptance_lower_bound
from sparrow_server.stats.exact_subsample import KeptAcceptance, KeptPositions
from sparrow_server.stats.exact_wire import BOUND_TOPK

# The kinds of acceptance (the names an autopilot's ``acceptance`` setting selects).
EXACT, TOPK_LOWER_BOUND = EXACT_ACCEPTANCE, TOPK_BOUND_ACCEPTANCE
DENSE_ATTENTION = "sdpa"  # the dense pass's attention implementation (stock, causal)
DEFAULT_ROW_CHUNK = 256  # acceptance rows per step: bounds the [chunk, V] float temporaries


@dataclass(frozen=True)
class AcceptanceScores:
    """Acceptance of each generated token and the schedule-basis length of the step that made it.

    ``exact``: the exact values at a uniform subsample of positions; they are then the evidence
    (``evidence_*``: what the metrics, the alert and the autopilot read; fewer tokens, but exact), and
    ``acceptance`` is the top-k lower bound, at the generated positions ``bound_positions`` (None: at
    every token).
    """

    acceptance: np.ndarray  # [N] float64 in [0, 1], or [len(bound_positions)]
    basis_lengths: np.ndarray  # [N] int64
    kind: str  # EXACT or TOPK_LOWER_BOUND
    exact: KeptAcceptance | None = None
    bound_positions: np.ndarray | None = None

    def __post_init__(self) -> None:
        expected = self.basis_lengths.shape if self.bound_positions is None else np.shape(self.bound_positions)
        assert self.acceptance.shape == expected, (self.acceptance.shape, expected)

    @property
    def has_exact_subsample(self) -> bool:
        return self.exact is not None and self.exact.n_tokens > 0

    @property
    def evidence_kind(self) -> str:
        return EXACT if self.has_exact_subsample else self.kind

    @property
    def evidence_acceptance(self) -> np.ndarray:
        return np.asarray(self.exact.acceptance, dtype=np.float64) if self.has_exact_subsample else self.acceptance

    @property
    def evidence_basis_lengths(self) -> np.ndarray:
        if self.has_exact_subsample:
            return self.basis_lengths[self.exact.positions]
        return self.basis_lengths if self.bound_positions is None else self.basis_lengths[self.bound_positions]

    @property
    def n_tokens(self) -> int:
        """Tokens of evidence (the kept positions when exact on a subsample)."""
        return int(self.evidence_acceptance.size)

    @property
    def p5(self) -> float:
        a = self.evidence_acceptance
        return float(np.quantile(a, 0.05)) if a.size else float("nan")

    @property
    def mean(self) -> float:
        a = self.evidence_acceptance
        return float(a.mean()) if a.size else float("nan")

    @property
    def bound_p5(self) -> float:
        """p5 of ``acceptance`` (the lower bound when ``kind`` is the top-k bound), over every token or over
        ``bound_positions``."""
        return float(np.quantile(self.acceptance, 0.05)) if self.acceptance.size else float("nan")


def completion_basis_lengths(schedule: Schedule, prompt_len: int, n_completion: int) -> np.ndarray:
    """Length on the schedule's basis of the step producing each completion token: [N] int64.

    ``total``: ``prompt_len + i`` (tokens attended); ``generated``: ``i``.
    """
    i = np.arange(n_completion, dtype=np.int64)
    return i + prompt_len if schedule.length_basis == "total" else i


def chunked_exact_acceptance(sparse_logits: Tensor, dense_logits: Tensor, temperature: float,
                             chunk: int = DEFAULT_ROW_CHUNK) -> np.ndarray:
    """``exact_acceptance`` row-chunk by row-chunk. [N, V], [N, V] -> [N] float64."""
    parts = [exact_acceptance(sparse_logits[s:s + chunk], dense_logits[s:s + chunk], temperature)
             for s in range(0, sparse_logits.shape[0], chunk)]
    return torch.cat(parts).double().cpu().numpy() if parts else np.zeros(0)


@contextlib.contextmanager
def adapter_scope(model: Any, adapter: str | None):
    """Run ``model`` as the base model (``adapter=None``: peft adapters disabled) or with one adapter."""
    if not hasattr(model, "peft_config"):
        if adapter is not None:
            raise ValueError(f"adapter = {adapter!r}: the scoring model has no adapters loaded")
        yield
        return
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    if adapter not in model.peft_config:
        raise ValueError(f"adapter = {adapter!r}: not loaded (loaded: {sorted(model.peft_config)})")
    previous = model.active_adapter
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(previous)


class HFScorer:
    """Scores rollouts with a transformers causal LM (optionally wrapped by peft).

    ``model``: the model, or a zero-argument callable returning it (the reference engine swaps in a
    ``PeftModel`` when the first adapter loads). ``lock``: held around each forward when the model
    is shared with a running engine (its step lock), so a forward never interleaves with a decode
    step and the attention implementation can be switched safely; decode then pauses for one
    forward at a time, the cost of a prefill of the rollout.
    """

    def __init__(self, model: Any, lock: contextlib.AbstractContextManager | None = None):
        self._model: Callable[[], Any] = model if callable(model) and not isinstance(model, torch.nn.Module) else (lambda: model)
        self._lock = lock if lock is not None else contextlib.nullcontext()

    @property
    def model(self) -> Any:
        return self._model()

    def _ids(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Tensor:
        """The sequence minus its last token (no row predicts past the completion): [P + N - 1]."""
        if not prompt_ids:
            raise ValueError("prompt_ids: must not be empty")
        if not completion_ids:
            raise ValueError("completion_ids: must not be empty")
        device = next(self.model.parameters()).device
        return torch.tensor([*prompt_ids, *completion_ids][:-1], dtype=torch.long, device=device)

    @torch.inference_mode()
    def dense_logits(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Tensor:
        """Dense, adapter-free logits predicting each completion token: [N, V] float32."""
        ids, n = self._ids(prompt_ids, completion_ids), len(completion_ids)
        with self._lock:
            model = self.model
            with adapter_scope(model, None), attention_implementation(model, DENSE_ATTENTION):
                out = model(input_ids=ids[None], use_cache=False, logits_to_keep=n)
        return out.logits[0, -n:].float()

    @torch.inference_mode()
    def sparse_logits(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], schedule: Schedule,
                      adapter: str | None = None, landmark_dtype: torch.dtype = torch.float32) -> Tensor:
        """The rollout policy's logits (schedule + adapter) predicting each completion token: [N, V];
        ``landmark_dtype``: ``teacher_forced_logits``'s."""
        ids, p = self._ids(prompt_ids, completion_ids), len(prompt_ids)
        with self._lock:
            model = self.model
            with adapter_scope(model, adapter):
                logits = teacher_forced_logits(model, ids, p, schedule, landmark_dtype=landmark_dtype)
        return logits[p - 1:]

    def exact(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], schedule: Schedule,
              temperature: float, adapter: str | None = None, sparse_logits: Tensor | None = None) -> AcceptanceScores:
        """Exact acceptance; ``sparse_logits`` ([N, V], recorded in full) skips the sparse forward."""
        if sparse_logits is None:
            sparse_logits = self.sparse_logits(prompt_ids, completion_ids, schedule, adapter)
        elif sparse_logits.shape[0] != len(completion_ids):
            raise ValueError(f"sparse_logits: {sparse_logits.shape[0]} rows for {len(completion_ids)} completion tokens")
        dense = self.dense_logits(prompt_ids, completion_ids)
        acc = chunked_exact_acceptance(sparse_logits, dense.to(sparse_logits.device), temperature)
        return AcceptanceScores(acc, completion_basis_lengths(schedule, len(prompt_ids), len(completion_ids)), EXACT)

    def dense_topk(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], k: int,
                   temperature: float) -> tuple[Tensor, Tensor]:
        """Top-k (ids, logprobs) of the dense policy at ``temperature``: ([N, k], [N, k])."""
        return logits_to_topk(self.dense_logits(prompt_ids, completion_ids), k, temperature)


def score_rollout(scorer: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int], schedule: Schedule,
                  temperature: float, adapter: str | None = None, sparse_topk: tuple[Tensor, Tensor] | None = None,
                  sparse_logits: Tensor | None = None, rid: str | None = None,
                  exact_keep: KeptPositions | None = None) -> AcceptanceScores:
    """Acceptance of one rollout: with ``exact_keep`` (and ``rid``, the rollout's engine id) the exact values at
    the kept positions and their top-``BOUND_TOPK`` bound (``scorer.dense_exact``); else exact unless only the
    recorded top-k ([N, K] ids, logprobs) is given (the top-k bound of every token)."""
    basis = completion_basis_lengths(schedule, len(prompt_ids), len(completion_ids))
    if exact_keep is not None:
        exact = scorer.dense_exact(prompt_ids, completion_ids, BOUND_TOPK, temperature, rid, exact_keep)
        return _kept_scores(exact, basis)
    if sparse_topk is None:
        return scorer.exact(prompt_ids, completion_ids, schedule, temperature, adapter, sparse_logits)
    ids, logprobs = sparse_topk
    if ids.shape != logprobs.shape or ids.dim() != 2 or ids.shape[0] != len(completion_ids):
        raise ValueError(f"sparse_topk: ids {tuple(ids.shape)} and logprobs {tuple(logprobs.shape)} must both be "
                         f"[{len(completion_ids)}, K]")
    dense_ids, dense_lp = scorer.dense_topk(prompt_ids, completion_ids, ids.shape[1], temperature)
    acc = topk_acceptance_lower_bound(ids, logprobs, dense_ids.cpu(), dense_lp.cpu()).double().numpy()
    return AcceptanceScores(acc, basis, TOPK_LOWER_BOUND)


def _kept_scores(exact: KeptAcceptance, basis: np.ndarray) -> AcceptanceScores:
    """The exact subsample as the evidence; its bound, at the same positions, as ``acceptance``."""
    if exact.n_tokens == 0:  # a completion shorter than its first kept position, or no row stored
        raise ValueError(f"no exact acceptance at any kept position of {basis.size} generated tokens "
                         f"({len(exact.missing)} kept positions missing)")
    if exact.bound is None:
        raise ValueError("the exact acceptance came without its top-k bound")
    return AcceptanceScores(np.asarray(exact.bound, dtype=np.float64), basis, TOPK_LOWER_BOUND, exact,
                            bound_positions=np.asarray(exact.positions, dtype=np.int64))


__all__ = [
    "AcceptanceScores", "HFScorer", "adapter_scope", "completion_basis_lengths", "chunked_exact_acceptance",
    "score_rollout", "EXACT", "TOPK_LOWER_BOUND",
]
