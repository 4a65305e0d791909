"""Dense (stock FlashInfer) vs sparse (``sparrow`` backend) SGLang throughput, same GPU, same workload.

One command runs, per model size, the stock server then the sparrow server on dummy weights and
writes ``<out-dir>/sglang_throughput.json`` (schema of issue 9) plus the servers' raw logs:

- ``decode_ctx``: ``batch`` requests of ``context`` prompt tokens, ``gen_len`` new tokens
  (ignore_eos); tokens/s is the median decode throughput the server logs for steps with all
  ``batch`` requests running (client-side decode timing includes the prefill and is recorded
  for reference);
- ``rollout``: ``rollout_requests`` requests of ``rollout_prompt`` tokens generating
  ``rollout_gen`` tokens each (temperature 1, ignore_eos); output tokens / wall seconds.
Each run also records the memory-roofline ratio (dense bytes / sparse bytes per step, weights +
KV + landmarks, from ``sparrow_server.cost.roofline``) for the same workload.

Example (GPU host, kit installed): python benchmarks/sglang_throughput.py --sizes qwen3-1.7b --out-dir $OUT
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sglang_server as S  # noqa: E402

from sparrow_server.cost.model_shape import model_shape_from_config  # noqa: E402
from sparrow_server.cost.roofline import roofline_bytes, step_flops_and_bytes  # noqa: E402
from sparrow_server.sparsity.registry import ScheduleRegistry  # noqa: E402
from sparrow_server.sparsity.schedule import dense_schedule  # noqa: E402

DEC_RE = re.compile(r"Decode batch.*?#running-req: (\d+).*?gen throughput \(token/s\): ([\d.]+)")
MAXTOK_RE = re.compile(r"max_total_num_tokens=(\d+)")
SERVER_ARGS = ["--load-format", "dummy", "--page-size", "16", "--mem-fraction-static", "0.85",
               "--cuda-graph-max-bs", "32", "--max-running-requests", "32", "--disable-radix-cache",
               "--cuda-graph-backend-prefill", "disabled", "--chunked-prefill-size", "16384"]
# Pcap (pages per request the static top-k spans) follows the context length: keep it near the workload.
CONTEXT_MARGIN = 512


def server_decode_tok_s(log: Path, offset: int, batch: int) -> tuple[float | None, int]:
    text = log.read_bytes()[offset:].decode(errors="replace")
    vals = [float(m.group(2)) for m in DEC_RE.finditer(text) if int(m.group(1)) == batch]
    return (statistics.median(vals) if vals else None), len(vals)


def random_ids(rng, n, length, vocab=151936):
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def run_backend(size, backend, work_dir, out_dir, args, schedule, share_s=None, only=None):
    """Start one server, run the workloads; returns {(workload, context): measurements}.

    ``share_s`` (dense run): seconds for both runs of this size; once the server is up, the dense
    workloads get half of what is left after two server starts (the sparse server's is assumed
    to take as long), so a slow start no longer eats the measurements. ``None``: no deadline."""
    rng = random.Random(0)
    cfg = S.qwen3_config(size)
    model_dir = S.write_config(work_dir / size, cfg)
    env = {"SPARROW_DEFAULT_SCHEDULE": schedule.name,
           "SPARROW_TOPK_CAP_TOKENS": str(max(schedule.budgets_tokens))}
    log = out_dir / f"server-{size}-{backend}.log"
    ctx_len = max(args.contexts + [args.rollout_prompt + args.rollout_gen]) + CONTEXT_MARGIN
    srv = S.Server(model_dir, SERVER_ARGS + ["--attention-backend", backend, "--context-length", str(ctx_len)], log,
                   port=30100, env=env)
    res = {}
    start_s = srv.start()
    deadline = float("inf") if share_s is None else time.time() + (share_s - 2 * start_s) / 2 - 15
    try:
        m = MAXTOK_RE.search(log.read_text(errors="replace"))
        res["server"] = {"start_s": round(start_s, 1), "max_total_num_tokens": int(m.group(1)) if m else None}
        print(f"[{size} {backend}] healthy after {start_s:.0f} s; {res['server']}", flush=True)
        S.generate(srv.base, random_ids(rng, 4, 512), 16, temperature=1.0)  # warm-up
        for ctx in args.contexts:
            if only is not None and ("decode_ctx", ctx) not in only:
                continue  # the dense run skipped it: keep the comparison like for like
            if only is None and time.time() > deadline:
                print(f"[{size} {backend}] skip decode_ctx {ctx}: out of time", flush=True)
                continue
            off = srv.log_offset()
            t0 = time.time()
            outs = S.generate(srv.base, random_ids(rng, args.batch, ctx), args.gen_len, temperature=1.0)
            dt = time.time() - t0
            tok_s, lines = server_decode_tok_s(log, off, args.batch)
            res[("decode_ctx", ctx)] = {"server_tok_s": tok_s, "log_lines": lines, "wall_s": round(dt, 2),
                                        "out_tokens": sum(len(o["output_ids"]) for o in outs)}
            print(f"[{size} {backend}] decode_ctx {ctx}: {res[('decode_ctx', ctx)]}", flush=True)
        if args.rollout_gen and (("rollout", args.rollout_prompt) in only if only is not None else time.time() < deadline):
            t0 = time.time()
            outs = S.generate(srv.base, random_ids(rng, args.rollout_requests, args.rollout_prompt), args.rollout_gen,
                              temperature=1.0, timeout=3600)
            dt = time.time() - t0
            n = sum(len(o["output_ids"]) for o in outs)
            res[("rollout", args.rollout_prompt)] = {"tok_s": n / dt, "wall_s": round(dt, 2), "out_tokens": n}
            print(f"[{size} {backend}] rollout: {res[('rollout', args.rollout_prompt)]}", flush=True)
    finally:
        srv.stop()
    return res, cfg


def roofline_ratio(cfg, size, schedule, workload, context, batch, gen_len, prompt):
    shape = model_shape_from_config(cfg, name=size)
    if workload == "decode_ctx":
        return roofline_bytes(shape, schedule, context, batch=batch).ratio
    lengths = prompt + np.arange(1, gen_len + 1)
    _, d = step_flops_and_bytes(shape, dense_schedule(), lengths, batch, prompt)
    _, s = step_flops_and_bytes(shape, schedule, lengths, batch, prompt)
    return float(np.sum(d.total) / np.sum(s.total))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="qwen3-1.7b")
    ap.add_argument("--contexts", default="8192,16384,32768")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--rollout-requests", type=int, default=32)
    ap.add_argument("--rollout-prompt", type=int, default=1024)
    ap.add_argument("--rollout-gen", type=int, default=16384)
    ap.add_argument("--schedule-suffix", default="0.86", help="preset = <size>-<suffix>")
    ap.add_argument("--time-budget-s", type=float, default=560)
    ap.add_argument("--note", default="")
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    t_start = time.time()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="sparrow-bench-"))
    import torch

    import sglang

    result = {"device": torch.cuda.get_device_name(), "sglang_version": sglang.__version__,
              "command": " ".join(sys.argv), "note": args.note, "runs": []}
    registry = ScheduleRegistry()
    sizes = args.sizes.split(",")
    for i, size in enumerate(sizes):
        schedule = registry.get(f"{size}-{args.schedule_suffix}")
        per = {}
        # The dense run gets half of this size's share of the time budget net of the two server starts;
        # the sparse run then does exactly the workloads the dense run finished.
        share = (args.time_budget_s - (time.time() - t_start)) / (len(sizes) - i)
        per["flashinfer"], cfg = run_backend(size, "flashinfer", work_dir, out_dir, args, schedule, share_s=share)
        done = {k for k in per["flashinfer"] if isinstance(k, tuple)}
        per["sparrow"], _ = run_backend(size, "sparrow", work_dir, out_dir, args, schedule, only=done)
        keys = [k for k in per["flashinfer"] if isinstance(k, tuple) and k in per["sparrow"]]
        for workload, ctx in keys:
            d, s = per["flashinfer"][(workload, ctx)], per["sparrow"][(workload, ctx)]
            rollout = workload == "rollout"
            run = {"model": size, "workload": workload, "context": None if rollout else ctx,
                   "prompt_len": ctx if rollout else ctx,
                   "gen_len": args.rollout_gen if rollout else args.gen_len,
                   "batch": args.rollout_requests if rollout else args.batch, "schedule": schedule.name,
                   "dense_tok_s": round(d["tok_s" if rollout else "server_tok_s"] or 0, 1),
                   "sparse_tok_s": round(s["tok_s" if rollout else "server_tok_s"] or 0, 1)}
            run["speedup"] = round(run["sparse_tok_s"] / run["dense_tok_s"], 3) if run["dense_tok_s"] else None
            run["roofline_ratio"] = round(roofline_ratio(cfg, size, schedule, workload, ctx, run["batch"],
                                                         run["gen_len"], ctx if rollout else 0), 3)
            run["dense_detail"], run["sparse_detail"] = d, s
            result["runs"].append(run)
            print(f"== {size} {workload} ctx={ctx}: dense {run['dense_tok_s']} tok/s, sparse {run['sparse_tok_s']} "
                  f"tok/s, speedup {run['speedup']}x, memory roofline {run['roofline_ratio']}x", flush=True)
        result["servers"] = result.get("servers", {}) | {f"{size}/{b}": per[b].get("server") for b in per}
        (out_dir / "sglang_throughput.json").write_text(json.dumps(result, indent=1))
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
