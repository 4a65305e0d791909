"""Fidelity study, step 2: exact per-token acceptance of the rollouts under sparse configurations.

For every rollout of ``generate.py`` and every configuration (a fixed budget, or a schedule), the
sparse actor's logits come from ``teacher_forced_logits`` (decode's page selections at every
position) and the dense ones from the plain forward; acceptance ``sum_v min(p_s, p_d)`` at T = 1
is saved per (rollout, configuration) as ``<work>/acc/<id>__<config>.npy`` (resumable; shards run
in parallel with ``--shard i/n``).

    python benchmarks/fidelity/score.py grid --rollouts /tmp/fidelity-long --work /tmp/fid-work \\
        --budgets 64,128,192,256 --bin-tokens 128 --shard 0/2
    python benchmarks/fidelity/score.py schedule --rollouts ... --work ... --split heldout --schedule A.json B.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from sparrow_server.kernels import LANDMARK_STORAGE_DTYPES
from sparrow_server.sparsity.schedule import Schedule, load_schedule

PAGE_SIZE = 16


def load_rollouts(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def fixed_schedule(budget: int, bin_tokens: int) -> Schedule:
    return Schedule(name=f"fixed-{budget}", budgets_tokens=(budget,), bin_tokens=bin_tokens, page_size=PAGE_SIZE)


def acc_path(work: Path, rollout_id: str, config: str) -> Path:
    return work / "acc" / f"{rollout_id}__{config}.npy"


def config_name(schedule: Schedule, landmark_dtype: str) -> str:
    """A configuration's name: its schedule's, with the landmarks' dtype where it is not float32."""
    return schedule.name if landmark_dtype == "float32" else f"{schedule.name}-lm-{landmark_dtype}"


def score_configs(scorer, rollouts: list[dict], configs: list[Schedule], work: Path, log,
                  landmark_dtype: str = "float32") -> None:
    """Acceptance of each rollout under each configuration (one dense forward per rollout)."""
    from sparrow_server.monitor.scoring import chunked_exact_acceptance

    (work / "acc").mkdir(parents=True, exist_ok=True)
    for r in rollouts:
        todo = [c for c in configs if not acc_path(work, r["id"], config_name(c, landmark_dtype)).exists()]
        if not todo:
            continue
        start = time.time()
        dense = scorer.dense_logits(r["prompt_ids"], r["completion_ids"])
        t_dense = time.time() - start
        for c in todo:
            t0 = time.time()
            sparse = scorer.sparse_logits(r["prompt_ids"], r["completion_ids"], c,
                                          landmark_dtype=getattr(torch, landmark_dtype))
            acc = chunked_exact_acceptance(sparse, dense, 1.0)
            name = config_name(c, landmark_dtype)
            np.save(acc_path(work, r["id"], name), acc.astype(np.float32))
            log(f"{r['id']} {name}: {len(acc)} tokens, mean {acc.mean():.4f}, p5 {np.quantile(acc, 0.05):.4f}, "
                f"{time.time() - t0:.1f}s (dense {t_dense:.1f}s)")
            del sparse
        del dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("grid", "schedule"))
    parser.add_argument("--rollouts", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--budgets", default="64,128,192,256")
    parser.add_argument("--bin-tokens", type=int, default=128)
    parser.add_argument("--schedule", type=Path, nargs="+", default=(), help="stage schedule: schedule JSON files")
    parser.add_argument("--split", default=None, help="only rollouts of this split")
    parser.add_argument("--shard", default="0/1", help="i/n: every n-th rollout from the i-th")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--landmark-dtype", choices=LANDMARK_STORAGE_DTYPES, default="float32",
                        help="the landmarks' storage dtype (a server's SPARROW_LANDMARK_DTYPE; float8_e4m3fn: with a "
                             "scale per page and KV head); float32: the oracle's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sparrow_server.models import load_model
    from sparrow_server.monitor.scoring import HFScorer

    rollouts = load_rollouts(args.rollouts)
    if args.split:
        rollouts = [r for r in rollouts if r["split"] == args.split]
    i, n = (int(x) for x in args.shard.split("/"))
    rollouts = rollouts[i::n]
    if args.stage == "grid":
        configs = [fixed_schedule(int(b), args.bin_tokens) for b in args.budgets.split(",")]
    else:
        configs = [load_schedule(path) for path in args.schedule]
    scorer = HFScorer(load_model(None).model)
    args.work.mkdir(parents=True, exist_ok=True)
    with open(args.work / f"score-{args.stage}-{i}of{n}.log", "a") as f:
        def log(msg: str) -> None:
            print(msg, flush=True)
            f.write(msg + "\n")
            f.flush()

        score_configs(scorer, rollouts, configs, args.work, log, args.landmark_dtype)


if __name__ == "__main__":
    main()
