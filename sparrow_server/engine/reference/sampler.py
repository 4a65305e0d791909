"""Token sampling and logprobs, as SGLang reports them.

The reported logprob of a token is ``log_softmax(logits / T)`` at that token, before top-k /
top-p / min-p truncation, with ``T = 1`` when decoding greedily (``temperature == 0``).
"""
from __future__ import annotations

from dataclasses import dataclass

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
    """Sampling distribution after temperature, top-k, top-p and min-p. logits: [V] fp32 -> [V]."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_k > 0 and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass strictly above each token
        drop = torch.zeros_like(probs, dtype=torch.bool)
        drop[order] = before > params.top_p * sorted_probs.sum()
        probs = probs.masked_fill(drop, 0.0)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def sample_token(logits: Tensor, params: SamplingParams, generator: torch.Generator, top_logprobs: int) -> SampledToken:
    """Sample one token. logits: [V] (any float dtype)."""
    logits = logits.to(torch.float32)
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
