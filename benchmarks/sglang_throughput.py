"""Dense (stock FlashInfer) vs sparse (``sparrow`` backend) SGLang throughput, same GPU, same workload.

One command runs, per model size, the stock server then the sparrow server on dummy weights and
writes ``<out-dir>/sglang_throughput.json`` (schema of issue 9) plus the servers' raw logs:

- ``decode_ctx``: for each ``CONTEXTxBATCH`` of ``--decode``, ``batch`` requests of ``context``
  prompt tokens, ``gen_len`` new tokens (ignore_eos); tokens/s is the median decode throughput the
  server logs for steps with all ``batch`` requests running (client-side decode timing includes
  the prefill and is recorded for reference);
- ``rollout``: ``rollout_requests`` requests of ``rollout_prompt`` tokens generating
  ``rollout_gen`` tokens each (temperature 1, ignore_eos); output tokens / wall seconds.
Each run also records the memory-roofline ratio (dense bytes / sparse bytes per step, weights +
KV + landmarks, from ``sparrow_server.cost.roofline``) for the same workload.

Example (GPU host, kit installed): python benchmarks/sglang_throughput.py --sizes qwen3-1.7b --out-dir $OUT
``--tp-size N`` serves both backends with N-way tensor parallelism (NVLink multicast off:
``NCCL_NVLS_ENABLE=0``); the roofline ratio is the whole model's, which TP splits evenly.
``--schedule-file PATH`` serves a schedule that is not a preset (e.g. ``benchmarks/schedules/``'s
decode ceiling with no dense layer) as the sparse server's default, through ``SPARROW_SCHEDULE_DIR``.
"""
from __future__ import annotations

import argparse
import json
import os
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
from sparrow_server.cost.roofline import landmark_element_bytes, roofline_bytes, step_flops_and_bytes  # noqa: E402
from sparrow_server.sparsity.registry import ScheduleRegistry  # noqa: E402
from sparrow_server.sparsity.schedule import Schedule, dense_schedule, dump_schedule, load_schedule  # noqa: E402

DEC_RE = re.compile(r"Decode batch.*?#running-req: (\d+).*?gen throughput \(token/s\): ([\d.]+)")
MAXTOK_RE = re.compile(r"max_total_num_tokens=(\d+)")
# the sparrow backend's start-up line: the kernel its sparse plans decode on under CUDA graphs
GRAPH_SPLIT_RE = re.compile(r"sparrow backend: .* / graph DecodeSplit\(use_tensor_cores=(True|False), "
                            r"fixed_split_size=(\w+), disable_split_kv=(True|False)\)")
SELECTION_RE = re.compile(r"sparrow backend: .*, selection (\w+), KV split")
SUB_ROWS_RE = re.compile(r"graph sub-rows (\d+)")  # absent from the start-up line before call 37: none
SERVER_ARGS = ["--load-format", "dummy", "--page-size", "16", "--mem-fraction-static", "0.85",
               "--disable-radix-cache", "--cuda-graph-backend-prefill", "disabled", "--chunked-prefill-size", "16384"]


def server_decode_tok_s(log: Path, offset: int, batch: int) -> tuple[float | None, int]:
    text = log.read_bytes()[offset:].decode(errors="replace")
    vals = [float(m.group(2)) for m in DEC_RE.finditer(text) if int(m.group(1)) == batch]
    return (statistics.median(vals) if vals else None), len(vals)


def sparse_decode_kernel(log_text: str) -> dict:
    """``{"sparse_decode_kernel": "tensor-core" | "cuda-core", "graph_kv_split": "flashinfer" | "none" | "<N>
    pages", "graph_sub_rows": N, "select_variant": ...}`` from a sparrow server's start-up line ({} for another
    server); ``graph_sub_rows`` > 1: the graph plan attends each row as N sub-rows, unsplit on tensor cores."""
    m, sel = GRAPH_SPLIT_RE.search(log_text), SELECTION_RE.search(log_text)
    if not m:
        return {}
    cores, fixed, unsplit = m.groups()
    split = "none" if unsplit == "True" else ("flashinfer" if fixed == "None" else f"{fixed} pages")
    sub = SUB_ROWS_RE.search(log_text)
    return {"sparse_decode_kernel": "tensor-core" if cores == "True" else "cuda-core", "graph_kv_split": split,
            "graph_sub_rows": int(sub.group(1)) if sub else 1, "select_variant": sel.group(1)}


def pool_shortfall(max_total_tokens: int | None, context: int, gen_len: int, batch: int,
                   workload: str = "decode_ctx") -> str | None:
    """Why ``batch`` requests of ``context + gen_len`` tokens cannot all run at once in this KV pool, or None.

    A decode's tok/s is read from the server's log lines at ``#running-req == batch``: a pool that holds fewer
    than ``batch x (context + gen_len)`` tokens runs it in smaller waves, and there is nothing to read. A rollout
    still runs, in waves whose tail decodes a few requests (call 27: rollout A at the default pool, 1.95x against
    2.31x at ``--mem-fraction-static 0.89``), so its result carries this as ``pool_note``."""
    need = batch * (context + gen_len)
    if max_total_tokens is not None and need > max_total_tokens:
        return (f"{workload} {context}x{batch}: the KV pool holds {max_total_tokens} tokens, fewer than "
                f"{batch} x ({context} + {gen_len}) = {need}")
    return None


def random_ids(rng, n, length, vocab=151936):
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def run_backend(size, backend, work_dir, out_dir, args, schedule, share_s=None, only=None, card=None, port=30100):
    """Start one server, run the workloads; returns {(workload, context): measurements}.

    ``share_s`` (dense run): seconds for both runs of this size; once the server is up, the dense
    workloads get half of what is left after two server starts (the sparse server's is assumed
    to take as long), so a slow start no longer eats the measurements. ``None``: no deadline.
    ``card``: the GPU this server runs on (``--parallel-cards``), with its own ``port``."""
    rng = random.Random(0)
    cfg = S.qwen3_config(size)
    model_dir = S.write_config(work_dir / f"{size}-{backend}", cfg)  # per backend: two may start at once
    env = schedule_env(schedule, work_dir / f"schedules-{backend}")
    if card is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(card)
    if args.tp_size > 1:
        env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off on the lent multi-GPU hosts
    log = out_dir / f"server-{size}-{backend}.log"
    srv = S.Server(model_dir, server_flags(args) + ["--attention-backend", backend], log, port=port, env=env)
    res = {}
    start_s = srv.start()
    deadline = float("inf") if share_s is None else time.time() + (share_s - 2 * start_s) / 2 - 15
    try:
        text = log.read_text(errors="replace")
        m = MAXTOK_RE.search(text)
        res["server"] = {"start_s": round(start_s, 1), "max_total_num_tokens": int(m.group(1)) if m else None,
                         **sparse_decode_kernel(text)}
        print(f"[{size} {backend}] healthy after {start_s:.0f} s; {res['server']}", flush=True)
        S.generate(srv.base, random_ids(rng, 4, 512), 16, temperature=1.0)  # warm-up
        for ctx, batch in args.decode:
            if only is not None and ("decode_ctx", ctx, batch) not in only:
                continue  # the dense run skipped it: keep the comparison like for like
            if only is None and time.time() > deadline:
                print(f"[{size} {backend}] skip decode_ctx {ctx}x{batch}: out of time", flush=True)
                continue
            short = pool_shortfall(res["server"]["max_total_num_tokens"], ctx, args.gen_len, batch)
            if short:
                res[("decode_ctx", ctx, batch)] = {"error": short}
                print(f"[{size} {backend}] ERROR {short}", flush=True)
                continue
            off = srv.log_offset()
            t0 = time.time()
            outs = S.generate(srv.base, random_ids(rng, batch, ctx), args.gen_len, temperature=1.0)
            dt = time.time() - t0
            tok_s, lines = server_decode_tok_s(log, off, batch)
            res[("decode_ctx", ctx, batch)] = {"server_tok_s": tok_s, "log_lines": lines, "wall_s": round(dt, 2),
                                               "out_tokens": sum(len(o["output_ids"]) for o in outs)}
            if tok_s is None:
                res[("decode_ctx", ctx, batch)]["error"] = f"no decode log line at #running-req {batch}"
            print(f"[{size} {backend}] decode_ctx {ctx}x{batch}: {res[('decode_ctx', ctx, batch)]}", flush=True)
        key = ("rollout", args.rollout_prompt, args.rollout_requests)
        if args.rollout_gen and (key in only if only is not None else time.time() < deadline):
            t0 = time.time()
            outs = S.generate(srv.base, random_ids(rng, args.rollout_requests, args.rollout_prompt), args.rollout_gen,
                              temperature=1.0, timeout=3600)
            dt = time.time() - t0
            n = sum(len(o["output_ids"]) for o in outs)
            res[key] = {"tok_s": n / dt, "wall_s": round(dt, 2), "out_tokens": n}
            short = pool_shortfall(res["server"]["max_total_num_tokens"], args.rollout_prompt, args.rollout_gen,
                                   args.rollout_requests, workload="rollout")
            if short:
                res[key]["pool_note"] = f"{short}: it ran in waves"
                print(f"[{size} {backend}] WARNING {res[key]['pool_note']}", flush=True)
            print(f"[{size} {backend}] rollout: {res[key]}", flush=True)
    finally:
        srv.stop()
    return res, cfg


def measured(res: dict) -> set:
    """The workloads a backend measured (not those it could not)."""
    return {k for k, m in res.items() if isinstance(k, tuple) and "error" not in m}


def measure(size, backends, work_dir, out_dir, args, schedule, share):
    """({backend: results}, the model config, the workloads every backend measured). Back to back, the
    second backend runs exactly what the first measured; with ``--parallel-cards`` both run at once."""
    if args.parallel_cards:
        per, cfg = run_parallel(size, backends, work_dir, out_dir, args, schedule)
    else:
        per, done = {}, None
        for j, backend in enumerate(backends):
            per[backend], cfg = run_backend(size, backend, work_dir, out_dir, args, schedule,
                                            share_s=share if j == 0 and len(backends) > 1 else None, only=done,
                                            port=args.port)
            done = measured(per[backend])
    return per, cfg, set.intersection(*(measured(per[b]) for b in backends))


def run_parallel(size, backends, work_dir, out_dir, args, schedule):
    """Each backend on its own card (GPU i, port ``--port`` + i) at the same time, the same workloads and
    prompts; no deadline (the caller's device call bounds it). Each backend's measurements are saved as
    it finishes (``partial-SIZE-BACKEND.json``): the sparse half ends first, and a call cut during the dense
    half still returns it."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    S.stop_servers_on_sigterm()  # the servers start in the pool's threads
    with ThreadPoolExecutor(len(backends)) as pool:
        futs = {pool.submit(run_backend, size, b, work_dir, out_dir, args, schedule, card=i, port=args.port + i): b
                for i, b in enumerate(backends)}
        done = {}
        for fut in as_completed(futs):
            backend = futs[fut]
            done[backend] = fut.result()
            save_partial(out_dir / f"partial-{size}-{backend}.json", done[backend][0])
    return {b: done[b][0] for b in backends}, done[backends[0]][1]


def save_partial(path: Path, res: dict) -> None:
    """One backend's raw measurements ({(workload, ...): ...} keyed by their repr)."""
    path.write_text(json.dumps({repr(k) if isinstance(k, tuple) else k: v for k, v in res.items()}, indent=1,
                               default=str))


def schedule_env(schedule, schedule_dir: Path) -> dict[str, str]:
    """The servers' schedule settings: ``schedule`` is their default; one that is not built in is saved
    to ``schedule_dir``, which the schedulers load at start."""
    env = {"SPARROW_DEFAULT_SCHEDULE": schedule.name, "SPARROW_TOPK_CAP_TOKENS": str(max(schedule.budgets_tokens))}
    if not ScheduleRegistry().is_builtin(schedule.name):
        schedule_dir.mkdir(parents=True, exist_ok=True)
        (schedule_dir / f"{schedule.name}.json").write_text(dump_schedule(schedule))
        env["SPARROW_SCHEDULE_DIR"] = str(schedule_dir)
    return env


def schedule_for(size: str, args) -> Schedule:
    """``--schedule-file`` if given (the same for every size), else the preset ``<size>-<suffix>``."""
    if args.schedule_file:
        return load_schedule(args.schedule_file)
    return ScheduleRegistry().get(f"{size}-{args.schedule_suffix}")


def landmark_dtype() -> str:
    """The sparse server's landmark dtype: its environment's SPARROW_LANDMARK_DTYPE (inherited from this one)."""
    from sparrow_server.sglang_plugin.config import DEFAULT_LANDMARK_DTYPE, ENV_LANDMARK_DTYPE

    return os.environ.get(ENV_LANDMARK_DTYPE, DEFAULT_LANDMARK_DTYPE)


def roofline_ratio(cfg, size, schedule, workload, context, batch, gen_len, prompt, lm_dtype=None):
    shape = model_shape_from_config(cfg, name=size)
    lm_bytes = landmark_element_bytes(lm_dtype or landmark_dtype(), shape.head_dim)
    if workload == "decode_ctx":
        return roofline_bytes(shape, schedule, context, batch=batch, landmark_bytes=lm_bytes).ratio
    lengths = prompt + np.arange(1, gen_len + 1)
    _, d = step_flops_and_bytes(shape, dense_schedule(), lengths, batch, prompt)
    _, s = step_flops_and_bytes(shape, schedule, lengths, batch, prompt, lm_bytes)
    return float(np.sum(d.total) / np.sum(s.total))


def server_flags(args) -> list[str]:
    """SGLang flags of every server in this run (dense and sparse alike)."""
    tp = ["--tp-size", str(args.tp_size)] if args.tp_size > 1 else []
    return SERVER_ARGS + ["--context-length", str(args.context_length), "--max-running-requests",
                          str(args.max_running_requests), "--cuda-graph-max-bs", str(args.cuda_graph_max_bs),
                          *tp, *args.server_args]


def make_run(key, per, cfg, size, schedule, args) -> dict:
    """One JSON run; a backend missing from this command (a split run) leaves its tok/s at None."""
    workload, ctx, batch = key
    rollout = workload == "rollout"
    field = "tok_s" if rollout else "server_tok_s"
    tok = {b: (round(per[b][key][field], 1) if b in per and per[b].get(key, {}).get(field) else None)
           for b in ("flashinfer", "sparrow")}
    run = {"model": size, "workload": workload, "context": None if rollout else ctx, "prompt_len": ctx,
           "gen_len": args.rollout_gen if rollout else args.gen_len, "batch": batch, "schedule": schedule.name,
           "context_length": args.context_length, "landmark_dtype": landmark_dtype(), "dense_tok_s": tok["flashinfer"],
           "sparse_tok_s": tok["sparrow"]}
    run["speedup"] = round(run["sparse_tok_s"] / run["dense_tok_s"], 3) if None not in tok.values() else None
    run["roofline_ratio"] = round(roofline_ratio(cfg, size, schedule, workload, ctx, batch, run["gen_len"],
                                                 ctx if rollout else 0), 3)
    run["dense_detail"], run["sparse_detail"] = per.get("flashinfer", {}).get(key), per.get("sparrow", {}).get(key)
    notes = {d["pool_note"] for d in (run["dense_detail"], run["sparse_detail"]) if d and "pool_note" in d}
    if notes:  # the run is not the workload it names at once: say so beside its speedup
        run["pool_note"] = "; ".join(sorted(notes))
    return run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="qwen3-1.7b")
    ap.add_argument("--decode", default="16384x16,32768x16", help="CONTEXTxBATCH,... decode workloads")
    ap.add_argument("--context-length", type=int, default=40960, help="--context-length of both servers")
    ap.add_argument("--max-running-requests", type=int, default=64)
    ap.add_argument("--cuda-graph-max-bs", type=int, default=64)
    ap.add_argument("--tp-size", type=int, default=1, help="--tp-size of both servers")
    ap.add_argument("--server-args", default="", help="extra SGLang flags, the same for both servers")
    ap.add_argument("--backends", default="flashinfer,sparrow",
                    help="flashinfer,sparrow (one run, like for like) or one of them (a split run)")
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--rollout-requests", type=int, default=32)
    ap.add_argument("--rollout-prompt", type=int, default=1024)
    ap.add_argument("--rollout-gen", type=int, default=16384)
    ap.add_argument("--schedule-suffix", default="0.86", help="preset = <size>-<suffix>")
    ap.add_argument("--schedule-file", default=None,
                    help="a schedule JSON file served instead of the preset (every size), e.g. "
                         "benchmarks/schedules/qwen3-1.7b-0.86-no-dense-layers.json")
    ap.add_argument("--parallel-cards", action="store_true",
                    help="dense on GPU 0 and sparse on GPU 1 at once (a 2-GPU host), each the same workloads; "
                         "the JSON says so")
    ap.add_argument("--port", type=int, default=30100,
                    help="the server's port (--parallel-cards: GPU i's is this + i); two split runs at once on "
                         "one host each need their own")
    ap.add_argument("--time-budget-s", type=float, default=560)
    ap.add_argument("--note", default="")
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()
    args.decode = [tuple(int(x) for x in w.split("x")) for w in args.decode.split(",") if w]
    args.server_args = args.server_args.split()
    if args.tp_size < 1:
        ap.error(f"--tp-size={args.tp_size}: must be >= 1")
    if args.parallel_cards and (len(args.backends.split(",")) != 2 or args.tp_size > 1):
        ap.error(f"--parallel-cards: needs two backends at --tp-size 1 (got --backends {args.backends}, "
                 f"--tp-size {args.tp_size})")
    t_start = time.time()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(prefix="sparrow-bench-"))
    import torch

    import sglang

    result = {"device": torch.cuda.get_device_name(), "sglang_version": sglang.__version__,
              "command": " ".join(sys.argv), "note": args.note, "context_length": args.context_length,
              "max_running_requests": args.max_running_requests, "tp_size": args.tp_size,
              "flags": server_flags(args), "runs": [],
              "parallel_on_two_cards": bool(args.parallel_cards),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    backends = args.backends.split(",")
    sizes = args.sizes.split(",")
    for i, size in enumerate(sizes):
        schedule = schedule_for(size, args)
        # The first run gets half of this size's share of the time budget net of the two server starts;
        # the second then does exactly the workloads the first finished.
        share = (args.time_budget_s - (time.time() - t_start)) / (len(sizes) - i)
        per, cfg, done = measure(size, backends, work_dir, out_dir, args, schedule, share)
        for key in sorted(done):
            result["runs"].append(make_run(key, per, cfg, size, schedule, args))
            r = result["runs"][-1]
            print(f"== {size} {key}: dense {r['dense_tok_s']} tok/s, sparse {r['sparse_tok_s']} tok/s, "
                  f"speedup {r['speedup']}x, memory roofline {r['roofline_ratio']}x"
                  + (f" ({r['pool_note']})" if "pool_note" in r else ""), flush=True)
        result["servers"] = result.get("servers", {}) | {f"{size}/{b}": per[b].get("server") for b in per}
        result.setdefault("errors", []).extend(workload_errors(per, size))
        (out_dir / "sglang_throughput.json").write_text(json.dumps(result, indent=1))
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    for err in result.get("errors", []):
        print(f"ERROR {err}", flush=True)
    return 1 if result.get("errors") else 0


def workload_errors(per: dict, size: str) -> list[str]:
    """Every workload a backend could not measure, named: the run then exits non-zero."""
    return [f"{size} {backend}: {m['error']}" for backend, res in per.items()
            for key, m in res.items() if isinstance(key, tuple) and "error" in m]


if __name__ == "__main__":
    sys.exit(main())
