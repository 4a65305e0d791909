"""The verify side of exact acceptance (issue 25): in the dense verify prefill, at the kept positions,
``Σ_v min(softmax(stored sparse row), softmax(dense row))`` in float32, one value per kept position.

The verify request's input is the sparse request's prompt followed by its completion; the dense row
predicting generated position ``g`` is input position ``prompt_len + g - 1``. A long input is prefilled
in chunks (one forward each): each chunk scores the kept positions whose input position it holds, and
the last one publishes the payload on the request and frees the stored rows.

The dense rows are computed for every kept position in the chunk whether or not a sparse row is stored:
under tensor parallelism the LM head gathers across ranks, so every rank must ask for the same rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from sparrow_server.sglang_plugin.scheduler.exact_rows import RowStore, req_verify
from sparrow_server.stats import exact_wire
from sparrow_server.stats.exact_subsample import KeptAcceptance, kept_acceptance, kept_bound


@dataclass(frozen=True)
class VerifyJob:
    """One verify request in an extend batch: its tokens start at ``token_start`` of the batch's hidden
    states and cover input positions ``[prefix, prefix + extend)``."""

    req: Any
    verify: exact_wire.ExactVerify
    token_start: int
    prefix: int
    extend: int

    @property
    def is_last_chunk(self) -> bool:
        return self.prefix + self.extend >= self.verify.prompt_len + self.verify.n_generated

    def positions_here(self) -> list[int]:
        """Kept generated positions whose dense row is in this chunk."""
        v = self.verify
        return [int(g) for g in v.kept.positions(v.n_generated)
                if self.prefix <= v.row_position(int(g)) < self.prefix + self.extend]

    def hidden_index(self, position: int) -> int:
        return self.token_start + self.verify.row_position(position) - self.prefix


def verify_jobs(reqs: Sequence[Any], prefix_lens: Sequence[int], extend_lens: Sequence[int]) -> list[VerifyJob]:
    out, start = [], 0
    for i, req in enumerate(reqs):
        verify = req_verify(req)
        if verify is not None:
            out.append(VerifyJob(req, verify, start, int(prefix_lens[i]), int(extend_lens[i])))
        start += int(extend_lens[i])
    return out


def score_chunk(job: VerifyJob, store: RowStore, dense_rows: Callable[[Tensor], Tensor], device: Any) -> None:
    """Score this chunk's kept positions into the sparse request's entry (``dense_rows``: hidden-state
    row indices [K] -> dense logits [K, V]): the exact value where a sparse row is stored, and at those
    and at the dense steps (value 1, no row: the two lists are the dense row's) the top-k lower bound."""
    v = job.verify
    entry = store.open(v.rid, v.kept)  # an entry with no rows: every position is reported missing
    positions = job.positions_here()
    if not positions:
        return
    index = torch.tensor([job.hidden_index(g) for g in positions], dtype=torch.long, device=device)
    dense = dense_rows(index).float()
    have = [k for k, g in enumerate(positions) if g in entry.rows]
    dense_steps = [k for k, g in enumerate(positions) if g not in entry.rows and g in entry.scores]
    if not have and not dense_steps:
        return
    sparse = torch.stack([entry.rows[positions[k]] for k in have]) if have else dense[:0].half()
    values = kept_acceptance(sparse, dense[have])
    bounds = [kept_bound(sparse.float(), dense[have], v.k), kept_bound(dense[dense_steps], dense[dense_steps], v.k)]
    both = torch.cat([values.float(), *bounds]).tolist()  # one sync per verify chunk, not per decode step
    values, bounds = both[:len(have)], both[len(have):]
    entry.scores.update({positions[k]: float(a) for k, a in zip(have, values)})
    entry.bounds.update({positions[k]: float(b) for k, b in zip(have + dense_steps, bounds)})


def finish(job: VerifyJob, store: RowStore) -> KeptAcceptance:
    """The payload of a verify request whose last chunk ran; frees the stored rows."""
    v = job.verify
    entry = store.open(v.rid, v.kept)
    # only the kept positions of the tokens returned: the overlap scheduler's step past a finished
    # request's last token may have captured (or scored, when dense) one more
    kept = [int(g) for g in v.kept.positions(v.n_generated)]
    scored = [g for g in kept if g in entry.scores]
    missing = tuple(g for g in kept if g not in entry.scores)
    store.free(v.rid)
    bound = [entry.bounds.get(g) for g in scored]
    return KeptAcceptance(np.asarray(scored, dtype=np.int64), np.asarray([entry.scores[g] for g in scored], dtype=np.float64),
                          missing, None if None in bound else np.asarray(bound, dtype=np.float64))


def publish(req: Any, result: KeptAcceptance) -> None:
    """Attach the payload to the request's one output token (SGLang's ``customized_info``, which reaches
    the response's ``meta_info[RESULT_KEY]`` as a one-element list)."""
    info = getattr(req, "customized_info", None) or {}
    info[exact_wire.RESULT_KEY] = [result.to_dict()]
    req.customized_info = info


__all__ = ["VerifyJob", "verify_jobs", "score_chunk", "finish", "publish"]
