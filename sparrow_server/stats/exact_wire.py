"""How the exact-acceptance subsample travels (issue 25): the contract between the SGLang plug-in's
HTTP process (which picks the kept positions and reads the result) and its scheduler processes (which
store the sparse rows and compute the values). Like ``sparsity.wire``, which carries schedules.

- sparse request: ``custom_params[KEEP_PARAM] = {"offset": o, "stride": s}``: store the sparse logits
  row of every kept generated position (``stats.exact_subsample.KeptPositions``);
- dense verify request: ``custom_params[VERIFY_PARAM] = {"rid", "prompt_len", "n_generated", "offset",
  "stride", "k"}``: compare the rows stored for request ``rid`` with the dense rows at the same positions
  (the exact value, and the top-``k`` lower bound of the same two rows), then free them;
- its response: ``meta_info[RESULT_KEY] = [payload]`` (SGLang's per-request ``customized_info``, one
  element on the request's one output token), ``payload`` = ``KeptAcceptance.to_dict()``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sparrow_server.stats.exact_subsample import KeptPositions

KEEP_PARAM = "sparrow_exact_keep"
VERIFY_PARAM = "sparrow_exact_verify"
RESULT_KEY = "sparrow_exact_acceptance"
BOUND_TOPK = 20  # the top-k lists of the reported lower bound (the paper's trainer compares top-20 lists)


@dataclass(frozen=True)
class ExactVerify:
    """What the dense verify request asks: the values at ``kept``'s positions below ``n_generated`` of
    the sparse request ``rid``, whose prompt was ``prompt_len`` tokens (the verify request's input is
    that prompt followed by the ``n_generated`` completion tokens); ``k``: the top-k lists whose lower
    bound is reported beside each exact value."""

    rid: str
    prompt_len: int
    n_generated: int
    kept: KeptPositions
    k: int = BOUND_TOPK

    def __post_init__(self) -> None:
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError(f"rid = {self.rid!r}: must be a non-empty string")
        for name in ("prompt_len", "n_generated", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r}: must be an integer >= 1")

    def row_position(self, generated: int) -> int:
        """The input position whose logits predict generated token ``generated``."""
        return self.prompt_len + generated - 1


def encode_keep(kept: KeptPositions) -> dict[str, Any]:
    return {KEEP_PARAM: kept.to_dict()}


def decode_keep(custom_params: Mapping[str, Any] | None) -> KeptPositions | None:
    """The kept positions a sparse request asks to store, or None; ``ValueError`` naming the bad field."""
    if not custom_params or custom_params.get(KEEP_PARAM) is None:
        return None
    return KeptPositions.from_dict(custom_params[KEEP_PARAM])


def encode_verify(verify: ExactVerify) -> dict[str, Any]:
    return {VERIFY_PARAM: {"rid": verify.rid, "prompt_len": verify.prompt_len, "n_generated": verify.n_generated,
                           "k": verify.k, **verify.kept.to_dict()}}


def decode_verify(custom_params: Mapping[str, Any] | None) -> ExactVerify | None:
    """What a dense verify request asks, or None; ``ValueError`` naming the bad field."""
    if not custom_params or custom_params.get(VERIFY_PARAM) is None:
        return None
    data = custom_params[VERIFY_PARAM]
    if not isinstance(data, dict):
        raise ValueError(f"{VERIFY_PARAM} = {data!r}: must be an object")
    return ExactVerify(rid=data.get("rid"), prompt_len=data.get("prompt_len"), n_generated=data.get("n_generated"),
                       kept=KeptPositions.from_dict(data), k=data.get("k", BOUND_TOPK))


__all__ = ["KEEP_PARAM", "VERIFY_PARAM", "RESULT_KEY", "BOUND_TOPK", "ExactVerify", "encode_keep", "decode_keep", "encode_verify",
           "decode_verify"]
