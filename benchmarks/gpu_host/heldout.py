"""Held-out check of a calibrated schedule on a running server, against a fixed budget of the same cost.

The same-cost fixed budget: the calibrated schedule's mean attended tokens per generated token over
the held-out decode steps (``kv_budget_tokens``, the tokens a sparse layer attends, as the engines
report them), rounded to a page. Both run on the held-out prompts (``cross_engine.generate``: the
server's rollouts, its top-20 lower bound), the oracle re-scores them exactly (``cross_engine.score``), and p5 per length bin with
95% bootstrap intervals is compared with the target +- 0.02. A few ``/rollout`` requests with
``"verify": true`` then go through the server's live verification, whose per-bin series
``/metrics`` exports (kept in the output).

    python benchmarks/gpu_host/heldout.py --server URL --model DIR --schedule cal.json --prompts heldout.jsonl \\
        --target 0.9 --total-tokens 8160 --per-schedule 4 --bin-tokens 512 --device cuda --out W/heldout.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cross_engine as X  # noqa: E402

from sparrow_server.sparsity.schedule import Schedule, kv_budget_tokens, load_schedule  # noqa: E402

BAND = 0.02
METRIC_PREFIX = "sparrow_acceptance"
VERIFY_WAIT_S = 60


def same_cost_budget(schedule: Schedule, prompt_lens: list[int], total: int) -> tuple[int, float]:
    """(fixed budget in tokens, the schedule's mean attended tokens per generated token)."""
    attended = [kv_budget_tokens(schedule, n, p) for p in prompt_lens for n in range(p + 1, total + 1)]
    mean = float(np.mean(attended))
    page = schedule.page_size
    return max(page * (schedule.reserved_pages + 1), int(round(mean / page)) * page), mean


def binned_p5(tokens: dict[str, np.ndarray], name: str, bin_tokens: int, target: float) -> list[dict]:
    from sparrow_server.stats.tail import binned_quantiles

    bins = binned_quantiles(tokens[f"{name}/exact"], tokens[f"{name}/length"], bin_tokens, q=0.05)
    return [{"bin": b.bin_index, "from": b.bin_index * bin_tokens, "tokens": b.n_tokens, "p5": b.quantile,
             "ci": [b.ci_low, b.ci_high], "mean": b.mean, "within_band": abs(b.quantile - target) <= BAND,
             "at_or_above_target_minus_band": b.quantile >= target - BAND} for b in bins if b.n_tokens]


def live_verification(client, schedule: str, prompts: list[list[int]], new_tokens: int) -> dict:
    """Rollouts with ``verify: true`` (the server's dense re-scoring) and the /metrics lines they move."""
    results = client.rollout_batch([{"input_ids": p, "schedule": schedule, "verify": True,
                                     "sampling_params": {"max_new_tokens": new_tokens, "temperature": 1.0,
                                                         "ignore_eos": True}} for p in prompts], concurrency=len(prompts))
    deadline, mark = time.time() + VERIFY_WAIT_S, f'schedule="{schedule}"'
    while True:  # verification runs on the server's verifier thread, after the rollout returned
        lines = [line for line in client.metrics().splitlines() if line.startswith(METRIC_PREFIX) and mark in line]
        if any("_count" in line for line in lines) or time.time() > deadline:
            break
        time.sleep(2)
    return {"rollouts": len(results), "tokens": sum(len(r.token_ids) for r in results), "metrics": lines}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", type=Path, required=True, help="HF directory: tokenizer and the float32 oracle")
    ap.add_argument("--schedule", type=Path, required=True, help="the calibrated schedule (JSON)")
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--total-tokens", type=int, default=8160)
    ap.add_argument("--per-schedule", type=int, default=4)
    ap.add_argument("--bin-tokens", type=int, default=512)
    ap.add_argument("--verify-rollouts", type=int, default=4, help="live-verified /rollout requests (0: none)")
    ap.add_argument("--verify-new-tokens", type=int, default=4096, help="generated tokens of each live-verified rollout")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from sparrow_server.client import SparrowClient
    from sparrow_server.models import load_model

    calibrated = load_schedule(args.schedule)
    prompts = X.load_prompts(args.prompts, X.tokenizer_of(args.model))[:args.per_schedule]
    budget, mean_cost = same_cost_budget(calibrated, [len(p) for _, p in prompts], args.total_tokens)
    held = dataclasses.replace(calibrated, name=f"xe-heldout-{calibrated.name}")
    matched = X.fixed_schedule(budget)
    t0 = time.time()
    with SparrowClient(args.server, timeout=1800) as client:
        rows = X.generate(client, X.assign(prompts, [held, matched], args.per_schedule, False), args.total_tokens)
        live = (live_verification(client, calibrated.name, [p for _, p in prompts[:args.verify_rollouts]],
                                  args.verify_new_tokens) if args.verify_rollouts else None)
    gen_s = time.time() - t0
    model = load_model(args.model, device=args.device).model
    tokens_path = args.out.with_suffix(".tokens.npz")
    scored = X.score(model, rows, args.bin_tokens, tokens_path)
    with np.load(tokens_path) as z:
        tokens = dict(z)
    out = {"target": args.target, "band": BAND, "schedule": calibrated.to_dict(), "schedule_mean_cost_tokens": mean_cost,
           "matched_fixed_budget": budget, "total_tokens": args.total_tokens, "prompts": [pid for pid, _ in prompts],
           "p5_by_bin": {name: binned_p5(tokens, name, args.bin_tokens, args.target) for name in (held.name, matched.name)},
           "summary": scored, "live_verification": live, "generate_and_verify_s": round(gen_s, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    for name, bins in out["p5_by_bin"].items():
        print(name, " ".join(f"{b['from']}:{b['p5']:.3f}" for b in bins))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
