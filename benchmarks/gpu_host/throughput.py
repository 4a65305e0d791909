"""Rollout throughput of one server, dense vs a sparse schedule, back to back on the same server.

One batched ``/generate`` per schedule (``--batch`` prompts, each filled to ``--total-tokens`` with
``ignore_eos``, temperature 1): generated tokens / wall seconds. The order is dense, sparse, then
both again when ``--repeats 2``, so a drift in the host's speed shows as a difference between repeats.

    python benchmarks/gpu_host/throughput.py --server URL --model DIR --schedule cal.json --batch 32 \\
        --total-tokens 8160 --out W/throughput.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cross_engine as X  # noqa: E402

from sparrow_server.sparsity import wire  # noqa: E402
from sparrow_server.sparsity.schedule import Schedule, dense_schedule, load_schedule  # noqa: E402


def run_once(client, prompts: list[list[int]], schedule: Schedule, total: int) -> dict:
    custom = {} if schedule.is_dense else {"custom_params": wire.encode_schedule(schedule)}
    payload = {"input_ids": prompts, "sampling_params": [
        {"max_new_tokens": total - len(p), "temperature": 1.0, "ignore_eos": True, **custom} for p in prompts]}
    t0 = time.time()
    out = client.generate(payload, schedule=schedule.name)
    wall = time.time() - t0
    n = sum(len(o["output_ids"]) for o in (out if isinstance(out, list) else [out]))
    return {"schedule": schedule.name, "generated_tokens": n, "wall_s": round(wall, 2), "tok_s": round(n / wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", type=Path, required=True, help="HF directory (tokenizer)")
    ap.add_argument("--schedule", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, default=X.DEFAULT_PROMPTS)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--total-tokens", type=int, default=8160)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from sparrow_server.client import SparrowClient

    sparse = load_schedule(args.schedule)
    ids = [p for _, p in X.load_prompts(args.prompts, X.tokenizer_of(args.model))]
    prompts = [ids[i % len(ids)] for i in range(args.batch)]
    runs = []
    with SparrowClient(args.server, timeout=3600) as client:
        run_once(client, prompts[:2], sparse, min(args.total_tokens, 1024))  # warm-up (graphs, allocator)
        for _ in range(args.repeats):
            for schedule in (dense_schedule(), sparse):
                runs.append(run_once(client, prompts, schedule, args.total_tokens))
                print(json.dumps(runs[-1]), flush=True)
    dense_tok_s = [r["tok_s"] for r in runs if r["schedule"] == "dense"]
    sparse_tok_s = [r["tok_s"] for r in runs if r["schedule"] != "dense"]
    out = {"batch": args.batch, "total_tokens": args.total_tokens, "schedule": sparse.to_dict(), "runs": runs,
           "speedup": round(sum(sparse_tok_s) / sum(dense_tok_s), 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"dense {dense_tok_s} tok/s, sparse {sparse_tok_s} tok/s, speedup {out['speedup']}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
