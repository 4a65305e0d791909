"""Held-out p5 gain of a DistillSparse adapter, with a paired bootstrap interval: is the gain above its noise?

``sparrow-server distill`` reports held-out p5 before and after training, one number each. A p5 over a few
thousand tokens moves by chance, so before a live run this script re-measures the same held-out rollouts
(the distill command's seeded split by prompt of ``--save-rollouts``'s file) per token, without and with the
adapter, and resamples held-out *rollouts* (tokens of a rollout are correlated) to get an interval for the
gain ``p5(after) - p5(before)``, pooled over the tokens where the schedule is sparse (length > budget) and
per length bin. Both sides are scored on the same tokens, so the interval is paired.

With ``--lower-budgets`` (e.g. one page less in the sparse bins) it also scores the held-out tokens under
those budgets, without and with the adapter, and gives the interval of ``p5(lower budgets, adapter) -
p5(schedule, no adapter)`` over the tokens past the first bin: the offline form of the live question, does
the adapter hold the tail at smaller budgets.

    PYTHONPATH=. python benchmarks/autopilot/heldout_gain.py --rollouts R.jsonl --schedule S.json \
        --adapter DIR --heldout-fraction 0.25 --seed 0 --out gain.json
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
Q = 0.05


def per_rollout(args) -> list[dict]:
    """Per held-out rollout: acceptance per token without and with the adapter, and the step lengths."""
    sys.path.insert(0, str(REPO))
    import torch
    from peft import PeftModel

    from sparrow_server.distill import load_rollouts
    from sparrow_server.distill.rollouts import split_heldout
    from sparrow_server.models import load_model
    from sparrow_server.monitor.scoring import HFScorer, chunked_exact_acceptance, completion_basis_lengths
    from sparrow_server.sparsity.schedule import is_sparse_at, load_schedule

    torch.set_num_threads(args.threads)
    schedule = load_schedule(args.schedule)
    variants = {"before": (schedule, None), "after": (schedule, "distill")}
    if args.lower_budgets:
        lower = replace(schedule, budgets_tokens=args.lower_budgets)
        variants |= {"lower_before": (lower, None), "lower_after": (lower, "distill")}
    _, heldout = split_heldout(load_rollouts(Path(args.rollouts)), args.heldout_fraction, args.seed)
    model = PeftModel.from_pretrained(load_model(None, device="cpu").model, args.adapter, adapter_name="distill")
    model.eval()
    scorer = HFScorer(model)
    rows = []
    with torch.no_grad():
        for r in heldout:
            prompt, completion = r.input_ids[: r.prompt_len], r.input_ids[r.prompt_len:]
            dense = scorer.dense_logits(prompt, completion)
            row = {key: chunked_exact_acceptance(scorer.sparse_logits(prompt, completion, s, a), dense, args.temperature)
                   for key, (s, a) in variants.items()}
            row["lengths"] = completion_basis_lengths(schedule, r.prompt_len, r.n_generated)
            row["sparse"] = np.array([is_sparse_at(schedule, int(n)) for n in row["lengths"]])
            rows.append(row)
    return rows


def gain(rows: list[dict], keep, n_boot: int, confidence: float, seed: int,
         before_key: str = "before", after_key: str = "after") -> dict:
    """p5 before/after over the tokens ``keep(lengths, sparse)`` selects, and the paired bootstrap interval of
    the gain, resampling rollouts."""
    sel = [(np.asarray(r[before_key])[m], np.asarray(r[after_key])[m])
           for r in rows for m in [keep(r["lengths"], r["sparse"])]]
    before = np.concatenate([b for b, _ in sel])
    after = np.concatenate([a for _, a in sel])
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(sel), len(sel))
        b = np.concatenate([sel[i][0] for i in pick])
        a = np.concatenate([sel[i][1] for i in pick])
        boots.append(np.quantile(a, Q) - np.quantile(b, Q))
    low, high = np.quantile(boots, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"n_tokens": int(before.size), "p5_before": float(np.quantile(before, Q)),
            "p5_after": float(np.quantile(after, Q)), "gain": float(np.quantile(after, Q) - np.quantile(before, Q)),
            "gain_interval": [float(low), float(high)], "mean_before": float(before.mean()),
            "mean_after": float(after.mean())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", required=True, help="the distill command's --save-rollouts file")
    p.add_argument("--schedule", required=True, help="the schedule the adapter was trained for")
    p.add_argument("--adapter", required=True)
    p.add_argument("--heldout-fraction", type=float, required=True, help="as given to the distill command")
    p.add_argument("--seed", type=int, required=True, help="as given to the distill command")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--boot", type=int, default=2000)
    p.add_argument("--confidence", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lower-budgets", default=None, type=lambda v: tuple(int(b) for b in v.split(",")),
                   help="also score under these budgets (comma-separated)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = per_rollout(args)
    bin_tokens = json.loads(Path(args.schedule).read_text())["bin_tokens"]
    n_bins = len(json.loads(Path(args.schedule).read_text())["budgets_tokens"])
    result = {"heldout_rollouts": len(rows), "confidence": args.confidence, "boot": args.boot,
              "sparse_tokens": gain(rows, lambda _, sparse: sparse, args.boot, args.confidence, 0),
              "bins": {str(b): gain(rows, lambda n, _, b=b: np.minimum(n // bin_tokens, n_bins - 1) == b,
                                    args.boot, args.confidence, 0) for b in range(n_bins)}}
    if args.lower_budgets:
        past_bin0 = lambda n, _: n >= bin_tokens  # noqa: E731
        result["lower_budgets"] = {
            "budgets_tokens": list(args.lower_budgets),
            "no_adapter": gain(rows, past_bin0, args.boot, args.confidence, 0, "before", "lower_before"),
            "adapter": gain(rows, past_bin0, args.boot, args.confidence, 0, "before", "lower_after"),
            "adapter_at_schedule": gain(rows, past_bin0, args.boot, args.confidence, 0, "before", "after")}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
