"""Issue 25 item 1, CPU study, step 1: per-token acceptance estimators against the float32 oracle.

On SmolLM2-135M-Instruct (real weights, float32, CPU) and committed rollouts (dense-sampled token
sequences, ``benchmarks/results/fidelity/long``), for each fixed sparse budget: the sparse actor's
logits (``teacher_forced_logits``: decode's page selections at every position) and the dense ones
(plain forward), then per generated token:

- ``exact``: ``sum_v min(p_s, p_d)`` (the oracle);
- ``w``: the sampled-token ratio ``min(1, p_d(x) / p_s(x))`` with ``x ~ p_s`` drawn afresh at each
  position (what a sparse rollout would have sampled there; seeded);
- per K: two-sided top-K bounds ``lo2``/``up2`` (sparse top-K from decode, dense top-K from the verify
  pass), ``cv2`` (the sampled-token ratio on the mass outside the ids in both lists, clipped to the
  bounds), and the sparse-top-K-vs-full-dense bounds ``lof``/``upf`` and ``cvf`` (what a verify pass
  holding the dense logits on the GPU could compute).

Saves ``<work>/<rollout>__fixed-<budget>.npz`` (resumable); step 2 is ``tail_estimators_report.py``.
``--storage`` (use another ``--work``) saves ``..__storage.npz`` instead: the exact value when the
sparse logits row is kept in 16 bits, as a GPU buffer for the exact design would keep it.

    PYTHONPATH=. python benchmarks/fidelity/tail_estimators.py --work /tmp/tail-work --budgets 128,256
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: --help stays fast
    import torch

HERE = Path(__file__).resolve().parent
DEFAULT_ROLLOUTS = HERE.parent / "results" / "fidelity" / "long"
DEFAULT_KS = "20,64,256,1024"
PAGE_SIZE = 16
ROW_CHUNK = 256


def fixed_schedule(budget: int):
    from sparrow_server.sparsity.schedule import Schedule

    return Schedule(name=f"fixed-{budget}", budgets_tokens=(budget,), bin_tokens=2048, page_size=PAGE_SIZE)


def _in_list(ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Whether token x[t] is in row t of ids. [T, K], [T] -> [T] bool."""
    return (ids == x[:, None]).any(dim=1)


def stored_row_columns(sparse: torch.Tensor, log_q: torch.Tensor) -> dict:
    """Exact acceptance when the sparse logits row is kept in 16 bits (the exact-on-GPU design's buffer):
    ``fp16max``: ``(logits - max)`` as float16; ``bf16``: the logits as bfloat16. [C, V] -> {name: [C]}."""
    import torch

    shifted = sparse - sparse.amax(-1, keepdim=True)
    out = {}
    for name, row in (("fp16max", shifted.half()), ("bf16", sparse.bfloat16())):
        log_p = torch.log_softmax(row.double(), dim=-1)
        out[f"exact_{name}"] = torch.minimum(log_p, log_q).exp().sum(-1).clamp(0.0, 1.0)
    return out


def chunk_columns(sparse: torch.Tensor, dense: torch.Tensor, ks: list[int], gen: torch.Generator,
                  storage: bool = False) -> dict:
    """Every estimator's per-token value on one row chunk (computed in float64). [C, V], [C, V] -> {name: [C] float64}."""
    import torch

    from sparrow_server.stats.acceptance_bounds import (
        residual_sampled_estimate, sparse_topk_dense_full_bounds, topk_acceptance_bounds,
    )

    log_p, log_q = torch.log_softmax(sparse.double(), dim=-1), torch.log_softmax(dense.double(), dim=-1)  # float64: bounds hold to 1e-12
    cols = {"exact": torch.minimum(log_p, log_q).exp().sum(-1).clamp(0.0, 1.0)}
    if storage:
        return {**cols, **stored_row_columns(sparse, log_q)}
    x = torch.multinomial(log_p.exp(), 1, generator=gen)[:, 0]
    lp_x, lq_x = log_p.gather(1, x[:, None])[:, 0], log_q.gather(1, x[:, None])[:, 0]
    cols["w"] = torch.exp(torch.clamp(lq_x - lp_x, max=0.0))
    for k in ks:
        s_lp, s_ids = torch.topk(log_p, k, dim=-1)
        d_lp, d_ids = torch.topk(log_q, k, dim=-1)
        lo2, up2 = topk_acceptance_bounds(s_ids, s_lp, d_ids, d_lp)
        s_has = _in_list(s_ids, x)
        cv2 = residual_sampled_estimate(lo2, up2, s_has & _in_list(d_ids, x), lp_x, lq_x)
        lof, upf = sparse_topk_dense_full_bounds(s_ids, s_lp, log_q)
        cvf = residual_sampled_estimate(lof, upf, s_has, lp_x, lq_x)
        for name, col in (("lo2", lo2), ("up2", up2), ("cv2", cv2), ("lof", lof), ("upf", upf), ("cvf", cvf)):
            cols[f"{name}_k{k}"] = col
    return cols


def score_rollout(scorer, rollout: dict, budget: int, ks: list[int], max_tokens: int, seed: int,
                  storage: bool = False) -> dict:
    """All columns for one rollout under one budget: {name: [N] float32}, plus ``position`` (0-based)."""
    import torch

    completion = rollout["completion_ids"][:max_tokens]
    dense = scorer.dense_logits(rollout["prompt_ids"], completion)
    sparse = scorer.sparse_logits(rollout["prompt_ids"], completion, fixed_schedule(budget))
    gen = torch.Generator().manual_seed(seed)
    parts = [chunk_columns(sparse[s:s + ROW_CHUNK], dense[s:s + ROW_CHUNK], ks, gen, storage)
             for s in range(0, len(completion), ROW_CHUNK)]
    out = {name: torch.cat([p[name] for p in parts]).numpy() for name in parts[0]}
    out["position"] = np.arange(len(completion), dtype=np.int64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=Path, default=DEFAULT_ROLLOUTS)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--budgets", default="128,256", help="fixed sparse budgets, tokens")
    parser.add_argument("--ks", default=DEFAULT_KS, help="top-K list lengths")
    parser.add_argument("--ids", default="", help="comma-separated rollout ids (default: all)")
    parser.add_argument("--max-tokens", type=int, default=2048, help="completion tokens scored per rollout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--storage", action="store_true",
                        help="instead of the estimators: exact acceptance from 16-bit copies of the sparse logits")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from sparrow_server.models import load_model
    from sparrow_server.monitor.scoring import HFScorer

    rollouts = [json.loads(line) for line in (args.rollouts / "rollouts.jsonl").read_text().splitlines() if line]
    if args.ids:
        keep = set(args.ids.split(","))
        rollouts = [r for r in rollouts if r["id"] in keep]
    ks = [int(k) for k in args.ks.split(",")]
    scorer = HFScorer(load_model(None).model)
    args.work.mkdir(parents=True, exist_ok=True)
    log_file = open(args.work / "score.log", "a")
    for n, r in enumerate(rollouts):
        for budget in (int(b) for b in args.budgets.split(",")):
            path = args.work / f"{r['id']}__fixed-{budget}{'__storage' if args.storage else ''}.npz"
            if path.exists():
                continue
            t0 = time.time()
            cols = score_rollout(scorer, r, budget, ks, args.max_tokens, args.seed + 1000 * n + budget, args.storage)
            np.savez(path, **cols)
            msg = (f"{r['id']} fixed-{budget}: {cols['exact'].size} tokens, exact mean {cols['exact'].mean():.4f} "
                   f"p5 {np.quantile(cols['exact'], 0.05):.4f}, {time.time() - t0:.1f}s")
            print(msg, flush=True)
            log_file.write(msg + "\n")
            log_file.flush()


if __name__ == "__main__":
    main()
