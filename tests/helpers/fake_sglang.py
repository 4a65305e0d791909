"""A stand-in for SGLang's tokenizer manager behind ``SGLangEngine`` (what ``TokenizerManagerRuntime``
calls), for CPU tests of the SGLang engine's translation, adapters and verification.

Token ``i`` of a request is ``(sum(prompt) + i) % vocab``; its logprob and top-k come from a
fixed per-position distribution (``distribution``), so a dense prefill over prompt + completion
reproduces the decode-time top-k exactly unless ``dense_shift`` perturbs it. A dense prefill that
asks for exact values at kept positions (``stats.exact_wire``) gets them as the plug-in's scheduler
would, from the full distributions (unless ``exact_payload`` is False: the hooks did not run).
"""
from __future__ import annotations

import asyncio
import math
from typing import Any, AsyncIterator

from sparrow_server.sglang_plugin.frontend.engine import ModelFacts
from sparrow_server.stats import exact_wire

VOCAB = 64


def distribution(position: int, k: int, shift: float = 0.0) -> list[tuple[float, int]]:
    """Top-k (logprob, id) at a position: weights 2^-j over ids starting at ``position % VOCAB``."""
    weights = [2.0 ** -(j + shift * (j % 2)) for j in range(VOCAB)]
    total = sum(weights)
    ids = [(position + j) % VOCAB for j in range(VOCAB)]
    return [(math.log(w / total), i) for w, i in zip(weights[:k], ids[:k])]


class FakeRuntime:
    def __init__(self, chunk_tokens: int = 2, incremental: bool = False, dense_shift: float = 0.0,
                 context_length: int = 4096, weight_version: str = "default"):
        self.chunk_tokens = chunk_tokens
        self.incremental = incremental
        self.dense_shift = dense_shift
        self.context_length = context_length
        self.weight_version = weight_version
        self.calls: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.loras: dict[str, str] = {}
        self.lora_events: list[tuple[str, str]] = []
        self.token_delay_s = 0.0
        self.exact_payload = True

    def model_facts(self) -> ModelFacts:
        return ModelFacts(name="fake", context_length=self.context_length, vocab_size=VOCAB, eos_token_ids=(0,))

    def stream(self, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(kw)
        return self._decode(kw)

    async def _decode(self, kw: dict[str, Any]):
        prompt = kw["input_ids"]
        n = kw["sampling_params"]["max_new_tokens"]
        k = kw.get("top_logprobs_num") or 0
        tokens = [(sum(prompt) + i) % VOCAB for i in range(n)]
        prompt_start = kw.get("logprob_start_len", -1)
        for start in range(0, max(n, 1), self.chunk_tokens):  # max_new_tokens 0: one output, finished
            await asyncio.sleep(self.token_delay_s)
            end = min(start + self.chunk_tokens, n)
            lo = start if self.incremental else 0
            meta: dict[str, Any] = {
                "completion_tokens": end, "prompt_tokens": len(prompt), "weight_version": self.weight_version,
                "output_token_logprobs": [[self._logprob(len(prompt) + j, tokens[j]), tokens[j], None]
                                          for j in range(lo, end)],
                "finish_reason": {"type": "length", "length": n} if end == n else None,
            }
            if k:
                meta["output_top_logprobs"] = [[[lp, i, None] for lp, i in distribution(len(prompt) + j, k)]
                                               for j in range(lo, end)]
            if prompt_start >= 0:  # SGLang repeats the prompt logprobs in every streamed output
                meta.update(self._prompt_rows(prompt, prompt_start, k))
            yield {"output_ids": tokens[lo:end], "meta_info": meta}

    @staticmethod
    def _logprob(position: int, token: int) -> float:
        return dict((i, lp) for lp, i in distribution(position, VOCAB))[token]

    async def generate(self, **kw: Any) -> dict[str, Any]:
        """The dense prefill: prompt logprobs from ``logprob_start_len`` on (first one has no logprob)."""
        self.calls.append(kw)
        rows = self._prompt_rows(kw["input_ids"], kw["logprob_start_len"], kw.get("top_logprobs_num"), self.dense_shift)
        meta = {**rows, "weight_version": self.weight_version}
        verify = exact_wire.decode_verify(kw["sampling_params"].get("custom_params"))
        if verify is not None and self.exact_payload:
            meta[exact_wire.RESULT_KEY] = [self._exact(verify)]
        return {"output_ids": [], "meta_info": meta}

    def _exact(self, verify: exact_wire.ExactVerify) -> dict[str, Any]:
        """Σ min(p_sparse, p_dense) over the whole vocabulary at each kept position, and over the ids in both
        top-``k`` lists (the bound)."""
        positions = [int(g) for g in verify.kept.positions(verify.n_generated)]
        values, bounds = [], []
        for g in positions:
            p = verify.prompt_len + g
            sparse = {i: lp for lp, i in distribution(p, VOCAB)}
            dense = {i: lp for lp, i in distribution(p, VOCAB, self.dense_shift)}
            values.append(sum(min(math.exp(lp), math.exp(dense[i])) for i, lp in sparse.items()))
            top_dense = {i for _, i in sorted(((lp, i) for i, lp in dense.items()), reverse=True)[:verify.k]}
            bounds.append(sum(min(math.exp(lp), math.exp(dense[i])) for lp, i in distribution(p, verify.k)
                              if i in top_dense))
        return {"positions": positions, "acceptance": values, "missing": [], "bound": bounds}

    def _prompt_rows(self, ids: list[int], start: int, k: int | None, shift: float = 0.0) -> dict[str, Any]:
        """SGLang's input logprobs of ``ids[start:]``: the first one None."""
        if start >= len(ids):
            return {"input_token_logprobs": [], "input_top_logprobs": []}
        tokens = [[None, ids[start], None]] + [[self._logprob(p, ids[p]), ids[p], None] for p in range(start + 1, len(ids))]
        tops = [None] + [[[lp, i, None] for lp, i in distribution(p, k or 0, shift)] for p in range(start + 1, len(ids))]
        return {"input_token_logprobs": tokens, "input_top_logprobs": tops}

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    async def load_lora(self, name: str, path: str) -> None:
        self.loras[name] = path
        self.lora_events.append(("load", name))

    async def unload_lora(self, name: str) -> None:
        del self.loras[name]
        self.lora_events.append(("unload", name))


__all__ = ["FakeRuntime", "distribution", "VOCAB"]
