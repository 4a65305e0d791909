"""Token sampling and logprobs, as SGLang reports them.

The reported logprob of a token is ``log_softmax(logits / T)`` at that token, before top-k /
top-p / min-p truncation, with ``T = 1`` when decoding greedily (``temperature == 0``).
Prompt logprobs are at ``T = 1`` whatever the request's temperature (SGLang 0.5.17 scores input
tokens on the raw logits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from sparrow_server.engine.base import SamplingParams, TopLogprobs


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float
    top_logprobs: TopLogprobs | None


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def truncated_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Sampling distribution after temperature, then top-k, top-p and min-p, each judged on the
    untruncated probabilities (as SGLang's sampler does). logits: [V] fp32 -> [V] (sums to 1)."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    drop_sorted = torch.zeros_like(sorted_probs, dtype=torch.bool)
    if params.top_k > 0:
        drop_sorted |= torch.arange(probs.numel(), device=probs.device) >= params.top_k
    if params.top_p < 1.0:
        drop_sorted |= (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) > params.top_p  # mass strictly above
    if params.min_p > 0.0:
        drop_sorted |= sorted_probs < params.min_p * sorted_probs[0]
    drop = torch.empty_like(drop_sorted)
    drop[order] = drop_sorted
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum()


def adjusted_logits(logits: Tensor, params: SamplingParams, output_ids: Sequence[int],
                    stop_ids: Sequence[int]) -> Tensor:
    """SGLang's logit adjustments, in its order: the additive penalties (frequency: ``penalty x
    count``, presence: ``penalty`` once a token occurs; counts over the generated tokens only),
    ``min_new_tokens`` (EOS and stop ids at -inf while fewer tokens exist), then the repetition
    penalty (a generated token's logit divided by it when positive, multiplied when negative), then
    the logit bias. logits: [V] fp32 -> [V] fp32 (a new tensor)."""
    out = logits.clone()
    vocab = out.numel()
    if output_ids and (params.frequency_penalty or params.presence_penalty or params.repetition_penalty != 1.0):
        counts = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long), minlength=vocab)[:vocab]
        counts = counts.to(device=out.device, dtype=torch.float32)
        seen = counts > 0
        out -= params.frequency_penalty * counts + params.presence_penalty * seen.float()
        if params.repetition_penalty != 1.0:
            scaled = torch.where(out < 0, out * params.repetition_penalty, out / params.repetition_penalty)
            out = torch.where(seen, scaled, out)
    if len(output_ids) < params.min_new_tokens and stop_ids:
        out[[t for t in stop_ids if t < vocab]] = float("-inf")
    for token, bias in params.logit_bias:  # ids checked against the vocabulary at admission
        out[token] += bias
    return out


def sample_token(logits: Tensor, params: SamplingParams, generator: torch.Generator, top_logprobs: int,
                 output_ids: Sequence[int] = (), stop_ids: Sequence[int] = ()) -> SampledToken:
    """Sample one token after the request's logit adjustments (``adjusted_logits``; reported
    logprobs are of the adjusted logits, as SGLang's). logits: [V] (any float dtype);
    ``output_ids``: the tokens generated so far; ``stop_ids``: the ids ``min_new_tokens`` masks."""
    logits = logits.to(torch.float32)
    if params.adjusts_logits:
        logits = adjusted_logits(logits, params, output_ids, stop_ids)
    logp = torch.log_softmax(logits / params.logprob_temperature, dim=-1)
    if params.is_greedy:
        token = int(torch.argmax(logits))
    else:
        token = int(torch.multinomial(truncated_probs(logits, params), 1, generator=generator))
    top = None
    if top_logprobs:
        values, ids = torch.topk(logp, top_logprobs)
        top = tuple(zip(values.tolist(), ids.tolist()))
    return SampledToken(token, float(logp[token]), top)


PROMPT_LOGPROB_ROWS = 512  # log_softmax over this many positions at a time: a long prompt x vocab stays small


@dataclass(frozen=True)
class PromptLogprobs:
    logprobs: tuple[float | None, ...]
    top_logprobs: tuple[TopLogprobs | None, ...] | None


def prompt_logprobs(logits: Tensor, tokens: Sequence[int], top_logprobs: int) -> PromptLogprobs:
    """Logprobs of ``tokens`` (prompt tokens from some position on) in SGLang's shape: the first is
    ``None`` (nothing before it was scored), token ``j`` (j >= 1) from ``logits[j - 1]``.
    logits: [>= len(tokens) - 1, V], row ``j - 1`` the position just before ``tokens[j]``."""
    values: list[float | None] = [None] if tokens else []
    tops: list[TopLogprobs | None] | None = ([None] if tokens else []) if top_logprobs else None
    targets = torch.tensor(list(tokens[1:]), dtype=torch.long, device=logits.device)
    for lo in range(0, len(targets), PROMPT_LOGPROB_ROWS):
        logp = torch.log_softmax(logits[lo:lo + PROMPT_LOGPROB_ROWS].to(torch.float32), dim=-1)
        rows = targets[lo:lo + PROMPT_LOGPROB_ROWS]
        logp = logp[:len(rows)]
        values.extend(logp.gather(1, rows[:, None])[:, 0].tolist())
        if tops is not None:
            top_v, top_i = torch.topk(logp, top_logprobs, dim=-1)
            tops.extend(tuple(zip(v, i)) for v, i in zip(top_v.tolist(), top_i.tolist()))
    return PromptLogprobs(tuple(values), tuple(tops) if tops is not None else None)
