"""The paper's closed-form rollout cost in "equivalent FLOPs" (Sparrow §3.3, Appendix F), for reference.

Symbols: P parameters, N samples per prompt, L_in / L_out prompt and output lengths, D KV
dimension (``ModelShape.kv_dim``), r GQA ratio, I the weight that converts memory traffic to
FLOP-equivalents, B the KV budget in tokens, ps the page size. The formulas are transcribed as
published; note that their attention term counts ``r * D`` FLOPs per (query, key) pair, half of
the ``4 * Hq * hd * layers`` that roofline.py counts for QK plus AV.
"""
from __future__ import annotations

from dataclasses import dataclass

from sparrow_server.cost.hardware import Hardware
from sparrow_server.cost.model_shape import ModelShape


@dataclass(frozen=True)
class PaperCost:
    dense: float
    sparse: float

    @property
    def speedup(self) -> float:
        return self.dense / self.sparse


def dense_cost(P: float, N: int, L_in: int, L_out: int, D: float, r: float, I: float) -> float:
    """C_dense = C_comp + I * C_mem, with
    C_comp = 2 P N L_out + r (2 L_in + L_out) L_out N D and C_mem = 2 L_in L_out D + N L_out^2 D."""
    c_comp = 2 * P * N * L_out + r * (2 * L_in + L_out) * L_out * N * D
    c_mem = 2 * L_in * L_out * D + N * L_out**2 * D
    return c_comp + I * c_mem


def sparse_cost(P: float, N: int, L_in: int, L_out: int, D: float, r: float, I: float, B: float, ps: int) -> float:
    """C_sparse = C_no-score + C_score, with
    C_no-score = 2 N P L_out + 2 r N D B L_out + 2 I N D B L_out and
    C_score = 2 N L_in D L_out + r N D L_out^2 / (2 ps) + 2 I L_in D L_out + I N D L_out^2 / (2 ps)."""
    no_score = 2 * N * P * L_out + 2 * r * N * D * B * L_out + 2 * I * N * D * B * L_out
    score = (2 * N * L_in * D * L_out + r * N * D * L_out**2 / (2 * ps)
             + 2 * I * L_in * D * L_out + I * N * D * L_out**2 / (2 * ps))
    return no_score + score


def appendix_f_attention_term(L_in: int, L_out: int, K: int) -> float:
    """H = (2 L_in + L_dense) L_dense + 2 K (L_out - L_dense), L_dense = min(L_out, K - L_in) clamped at 0:
    the attention term of a sequence decoded densely until its length reaches K, then at budget K."""
    l_dense = max(0, min(L_out, K - L_in))
    return (2 * L_in + l_dense) * l_dense + 2 * K * (L_out - l_dense)


def memory_weight(model: ModelShape, hardware: Hardware) -> float:
    """I: FLOP-equivalents per KV element moved = (peak FLOP/s / bytes/s) * bytes per KV element.
    The paper leaves I's value out; this is our reading of "1 / memory bandwidth"."""
    return hardware.ridge_flops_per_byte * model.kv_bytes


def paper_cost(
    model: ModelShape, hardware: Hardware, budget_tokens: int, prompt_len: int, gen_len: int,
    samples: int, page_size: int = 16,
) -> PaperCost:
    """Both closed forms for a model at a constant budget (a schedule's budget varies with length;
    pass e.g. its generation-averaged budget)."""
    P, D, r, I = model.params, model.kv_dim, model.gqa_ratio, memory_weight(model, hardware)
    return PaperCost(
        dense=dense_cost(P, samples, prompt_len, gen_len, D, r, I),
        sparse=sparse_cost(P, samples, prompt_len, gen_len, D, r, I, budget_tokens, page_size),
    )


__all__ = ["PaperCost", "dense_cost", "sparse_cost", "appendix_f_attention_term", "memory_weight", "paper_cost"]
