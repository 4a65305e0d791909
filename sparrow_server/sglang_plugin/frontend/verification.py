"""Dense verification on the SGLang engine, by a prefill-only request on the same server with the
``dense`` schedule and no LoRA adapter (the dense policy is the base model). Two modes:

- exact on a subsample (issue 25, the default: ``SPARROW_EXACT_STRIDE`` > 0): a request admitted with
  kept positions (``stats.exact_wire.KEEP_PARAM``) had its sparse rows stored by the scheduler there;
  the dense prefill carries ``VERIFY_PARAM`` and the scheduler returns, at those positions, the exact
  value and the top-k lower bound of the same two rows in ``meta_info[RESULT_KEY]``. Nothing is
  recorded per token while decoding and no per-position logprobs come back: on an H200, 8 x 4K-token
  rollouts took 16 s more verified than plain when they did, 1 s without
  (``benchmarks/results/fidelity/verify_cost/``: mostly the top-20 lists of every token, copied into
  tensors in Python, by CPU timings). It asks
  for one new token (``max_new_tokens`` 1, not 0): SGLang hands a request's ``customized_info`` out per
  output token, and a prefill-only request reports none. ``return_logprob`` stays on (for that token
  only): it keeps SGLang's logits processor eager in a prefill graph, where the plug-in's hook runs.
- the top-k bound on every token (exact stride 0): the sparse side is the top-k SGLang recorded while
  decoding (``record_topk`` = 20), the dense side the top-k input logprobs of every completion position.

SGLang returns prompt logprobs at temperature 1 (no temperature scaling on input positions), so only
requests whose logprobs are at temperature 1 (``temperature`` 1, or greedy) can be verified here;
others fail with a reason.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Sequence

import torch

from sparrow_server.monitor.verifier import DEFAULT_RECORD_TOPK, topk_tensors
from sparrow_server.sglang_plugin.config import PROMPT_LOGPROBS_OFF
from sparrow_server.sparsity import wire
from sparrow_server.sparsity.schedule import dense_schedule
from sparrow_server.stats import exact_wire
from sparrow_server.stats.exact_subsample import KeptAcceptance, KeptPositions

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0


def dense_prefill_kwargs(prompt_ids: Sequence[int], completion_ids: Sequence[int], k: int,
                         exact: exact_wire.ExactVerify | None = None) -> dict[str, Any]:
    """The ``GenerateReqInput`` fields of the dense scoring prefill: the top-``k`` input logprobs of every
    completion position, or (``exact``) the exact values and their bound at the kept positions alone."""
    custom = wire.encode_schedule(dense_schedule())
    fields: dict[str, Any] = {"input_ids": [*prompt_ids, *completion_ids], "return_logprob": True, "lora_path": None}
    if exact is None:
        sampling = {"max_new_tokens": 0, "temperature": 1.0, "custom_params": custom}
        return fields | {"sampling_params": sampling, "logprob_start_len": max(len(prompt_ids) - 1, 0),
                         "top_logprobs_num": k}
    custom.update(exact_wire.encode_verify(exact))
    sampling = {"max_new_tokens": 1, "temperature": 1.0, "custom_params": custom}
    return fields | {"sampling_params": sampling, "logprob_start_len": PROMPT_LOGPROBS_OFF}


def topk_from_prefill_meta(meta: dict[str, Any], completion_ids: Sequence[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, k] ids, [N, k] logprobs) of the distributions that predicted each completion token.

    SGLang's ``input_token_logprobs[i]`` is ``(logprob, token id, text)`` of an input token and
    ``input_top_logprobs[i]`` the top-k of the same distribution; the completion is the last N
    entries, which is checked by token id.
    """
    tokens = meta.get("input_token_logprobs") or []
    tops = meta.get("input_top_logprobs") or []
    n = len(completion_ids)
    if len(tokens) < n or len(tops) != len(tokens):
        raise ValueError(f"dense prefill returned {len(tokens)} token and {len(tops)} top-k entries for "
                         f"{n} completion tokens")
    got = [int(t[1]) for t in tokens[len(tokens) - n:]]
    if got != [int(t) for t in completion_ids]:
        raise ValueError("dense prefill logprobs do not line up with the completion's token ids")
    return topk_tensors([[(e[0], e[1]) for e in (entries or [])[:k]] for entries in tops[len(tops) - n:]], k)


def exact_from_meta(meta: dict[str, Any], exact: exact_wire.ExactVerify) -> KeptAcceptance:
    """The exact values the scheduler returned (checked against the kept positions); ``ValueError`` when
    the response carries none (the plug-in's hooks did not run for this request)."""
    payload = meta.get(exact_wire.RESULT_KEY)
    if not isinstance(payload, list) or len(payload) != 1:
        raise ValueError(f"meta_info[{exact_wire.RESULT_KEY!r}] = {payload!r}: expected one payload")
    return KeptAcceptance.from_dict(payload[0], exact.kept, exact.n_generated)


class SGLangDenseScorer:
    """A verifier scorer (``dense_topk``) running the dense prefill on SGLang's event loop.

    ``dense_topk`` is called on the verifier's thread; the request runs on the loop of the
    tokenizer manager (``get_loop()``) and this thread waits for it.
    """

    RECORD_TOPK = DEFAULT_RECORD_TOPK

    def __init__(self, runtime: Any, get_loop: Callable[[], asyncio.AbstractEventLoop | None],
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self._runtime = runtime
        self._get_loop = get_loop
        self.timeout_s = timeout_s
        self._last_version: str | None = None  # of the last dense prefill (one verifier thread calls this)

    def dense_topk(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], k: int,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        return topk_from_prefill_meta(self._prefill(prompt_ids, completion_ids, k, temperature), completion_ids, k)

    def _prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], k: int, temperature: float,
                 exact: exact_wire.ExactVerify | None = None) -> dict[str, Any]:
        if temperature != 1.0:
            raise ValueError(f"temperature = {temperature}: the SGLang engine verifies only requests sampled at "
                             "temperature 1 (or greedy); SGLang scores prompt tokens at temperature 1")
        loop = self._get_loop()
        if loop is None:
            raise RuntimeError("the SGLang engine has not started")
        coro = self._runtime.generate(**dense_prefill_kwargs(prompt_ids, completion_ids, k, exact))
        out = asyncio.run_coroutine_threadsafe(coro, loop).result(self.timeout_s)
        self._last_version = out["meta_info"].get("weight_version")
        return out["meta_info"]

    def dense_exact(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], k: int, temperature: float,
                    rid: str, kept: KeptPositions) -> KeptAcceptance:
        """The exact values, and their top-``k`` bound, at the positions ``kept`` of the rollout ``rid`` (its
        sparse rows stored by the scheduler); ``ValueError`` when the response has none (the plug-in's
        hooks did not run for it)."""
        exact = exact_wire.ExactVerify(rid, len(prompt_ids), len(completion_ids), kept, k)
        return exact_from_meta(self._prefill(prompt_ids, completion_ids, k, temperature, exact), exact)

    def weight_version(self) -> str | None:
        """The weight version SGLang reported for the last dense prefill (checked against the rollout's)."""
        return self._last_version

    def exact(self, *args: Any, **kwargs: Any):
        raise ValueError("the SGLang engine has no exact verification of every token: exact values come on the "
                         "kept positions (SPARROW_EXACT_STRIDE > 0), or the top-k bound from the recorded top-k")


__all__ = ["SGLangDenseScorer", "dense_prefill_kwargs", "exact_from_meta", "topk_from_prefill_meta"]
