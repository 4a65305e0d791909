"""``sparrow-server cost``: predicted rollout speedup of a schedule for a model and a GPU."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from sparrow_server.commands import SUMMARIES
from sparrow_server.cost.hardware import DEFAULT_HARDWARE, HARDWARE_PRESETS, SPEC_HARDWARE, resolve_hardware
from sparrow_server.cost.model_shape import MODEL_PRESETS, ModelShapeError, resolve_model
from sparrow_server.cost.paper import paper_cost
from sparrow_server.cost.roofline import DEFAULT_DECODE_BATCH, DEFAULT_SAMPLES, rollout_estimate
from sparrow_server.cost.step_fit import STEP_COST_TERMS
from sparrow_server.kernels import DEFAULT_LANDMARK_DTYPE, LANDMARK_STORAGE_DTYPES
from sparrow_server.sparsity.registry import ScheduleRegistry, UnknownScheduleError
from sparrow_server.sparsity.schedule import Schedule, ScheduleError, kv_budget_tokens, load_schedule


def register(subparsers) -> None:
    p = subparsers.add_parser("cost", help=SUMMARIES["cost"])
    p.add_argument("--model", required=True,
                   help=f"a preset ({', '.join(MODEL_PRESETS)}) or a path to an HF config.json / model folder")
    p.add_argument("--schedule", required=True, help="a schedule name, or a path to a schedule file")
    p.add_argument("--prompt-len", type=int, required=True, help="prompt tokens")
    p.add_argument("--gen-len", type=int, required=True, help="generated tokens per sample")
    p.add_argument("--hardware", default=DEFAULT_HARDWARE, choices=[*HARDWARE_PRESETS, *SPEC_HARDWARE],
                   help=f"GPU ceilings (default {DEFAULT_HARDWARE}; h100/h200 are measured, *-spec are datasheet)")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="generations per prompt (shared prefill)")
    p.add_argument("--batch", type=int, default=DEFAULT_DECODE_BATCH,
                   help="requests decoded together (SGLang's --max-running-requests when the rollout sends at least "
                        "that many)")
    p.add_argument("--kv-pool-tokens", type=int, default=None,
                   help="the server's KV pool in tokens (SGLang logs it as max_total_num_tokens): the batch decodes in "
                        "waves of as many requests as the pool holds at prompt + generation tokens each (default: no "
                        "limit)")
    p.add_argument("--landmark-dtype", choices=LANDMARK_STORAGE_DTYPES, default=DEFAULT_LANDMARK_DTYPE,
                   help=f"the sparse server's SPARROW_LANDMARK_DTYPE: the bytes its scoring reads per landmark element "
                        f"(default {DEFAULT_LANDMARK_DTYPE}; float8_e4m3fn: one byte and a float32 scale per page and "
                        f"KV head)")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the bf16 matmul ceiling (TFLOP/s)")
    p.add_argument("--hbm-tbps", type=float, default=None, help="override the memory bandwidth (TB/s)")
    p.add_argument("--step-overhead-ms", type=float, default=None,
                   help="fixed time added to every decode step (default: the hardware preset's fitted value; "
                        "see docs/cost-model.md)")
    p.add_argument("--persist-dir", default=None, help="folder of registered schedules to resolve names from")
    p.add_argument("--json", action="store_true", help="print JSON (has predicted_speedup)")
    p.set_defaults(func=run)


def _schedule(spec: str, persist_dir: str | None) -> Schedule:
    if spec.endswith((".json", ".yaml", ".yml")) and Path(spec).exists():
        return load_schedule(spec)
    return ScheduleRegistry.load(persist_dir=persist_dir).get(spec)


def _mean_budget(schedule: Schedule, prompt_len: int, gen_len: int) -> float:
    """Mean over the generation's steps of the KV tokens a sparse layer attends (``kv_budget_tokens``:
    the tokens whose bytes it reads, the quantity the roofline's attended term and the paper's B count)."""
    lengths = prompt_len + np.arange(1, gen_len + 1)
    return float(np.mean([kv_budget_tokens(schedule, int(L), prompt_len) for L in lengths]))


def run(args) -> int:
    try:
        model = resolve_model(args.model)
        schedule = _schedule(args.schedule, args.persist_dir)
        hardware = resolve_hardware(args.hardware).with_overrides(
            peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
            mem_bytes_per_s=args.hbm_tbps * 1e12 if args.hbm_tbps else None,
            step_overhead_s=args.step_overhead_ms / 1e3 if args.step_overhead_ms is not None else None,
        )
        est = rollout_estimate(model, schedule, args.prompt_len, args.gen_len, args.samples, hardware, args.batch,
                               args.kv_pool_tokens, args.landmark_dtype)
        roof = rollout_estimate(model, schedule, args.prompt_len, args.gen_len, args.samples, hardware.roofline(),
                                args.batch, args.kv_pool_tokens, args.landmark_dtype)
    except (ModelShapeError, ScheduleError, UnknownScheduleError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mean_budget = _mean_budget(schedule, args.prompt_len, args.gen_len)
    paper = paper_cost(model, hardware, round(mean_budget), args.prompt_len, args.gen_len, args.samples, schedule.page_size)
    result = {
        "predicted_speedup": est.speedup,
        "roofline_speedup": roof.speedup,
        "model": {"name": model.name, "params": model.params, "layers": model.num_layers,
                  "kv_heads": model.num_kv_heads, "gqa_ratio": model.gqa_ratio,
                  "kv_bytes_per_token": model.kv_bytes_per_token},
        "hardware": {"name": hardware.name, "peak_flops": hardware.peak_flops,
                     "mem_bytes_per_s": hardware.mem_bytes_per_s,
                     **{term: getattr(hardware, term) for term in STEP_COST_TERMS}, "source": hardware.source},
        "schedule": schedule.id,
        "landmark_dtype": args.landmark_dtype,
        "prompt_len": args.prompt_len, "gen_len": args.gen_len, "samples": args.samples, "batch": args.batch,
        "kv_pool_tokens": args.kv_pool_tokens, "decode_waves": list(est.decode_waves),
        "prefill_s": est.prefill_s,
        "dense_decode_s_per_sample": est.dense_decode_s,
        "sparse_decode_s_per_sample": est.sparse_decode_s,
        "dense_tokens_per_s": est.dense_tokens_per_s,
        "sparse_tokens_per_s": est.sparse_tokens_per_s,
        "mean_budget_tokens": mean_budget,
        "paper_equivalent_flops_speedup": paper.speedup,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{model.name} on {hardware.name}, schedule {schedule.id}"
          + (f" ({args.landmark_dtype} landmarks)" if args.landmark_dtype != DEFAULT_LANDMARK_DTYPE else "")
          + f": prompt {args.prompt_len}, "
          f"generate {args.gen_len} x {args.samples} samples, decode batch {args.batch}"
          + (f" in waves of {', '.join(map(str, est.decode_waves))} (KV pool {args.kv_pool_tokens} tokens)"
             if len(est.decode_waves) > 1 else ""))
    print(f"  predicted rollout speedup   {est.speedup:.2f}x   (fitted per-step costs; pure byte roofline "
          f"{roof.speedup:.2f}x; paper's equivalent-FLOP formula at the mean budget {mean_budget:.0f}: "
          f"{paper.speedup:.2f}x)")
    print(f"  dense   {est.dense_tokens_per_s:10.0f} tok/s per GPU   decode {est.dense_decode_s:.2f} s/sample")
    print(f"  sparse  {est.sparse_tokens_per_s:10.0f} tok/s per GPU   decode {est.sparse_decode_s:.2f} s/sample")
    print(f"  prefill {est.prefill_s:.3f} s per prompt (dense, shared by the samples)")
    return 0
