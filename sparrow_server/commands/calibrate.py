"""``sparrow-server calibrate``: find the cheapest schedule whose p5 acceptance meets a threshold.

Sparse rollouts at each fixed ``--budgets`` value (in-process on the reference engine, or on a
running server with ``--server``), exact dense verification with ``--model`` (the same model the
server serves), p5 per (budget, length bin) with bootstrap intervals, then the cheapest
non-decreasing per-bin budgets meeting ``--threshold``. Writes the schedule (``--out``) and a
report folder; ``--register URL`` then registers the schedule with ``PUT /schedules/{name}``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparrow_server.commands import SUMMARIES
from sparrow_server.calibrate.pipeline import (
    DEFAULT_BUDGETS, DEFAULT_CALIBRATION_TEMPERATURE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_SAMPLES_PER_PROMPT, DEFAULT_SEED,
    DEFAULT_THRESHOLD, CalibrationConfig, CalibrationError,
)
from sparrow_server.sparsity.schedule import DEFAULT_BIN_TOKENS, DEFAULT_PAGE_SIZE
from sparrow_server.stats.tail import DEFAULT_BOOTSTRAP

REPORT_SUFFIX = "-report"
COST_DTYPE = "bfloat16"  # the cost model prices serving weights/KV in bf16 whatever dtype calibration ran in


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help=SUMMARIES["calibrate"],
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: the embedded SmolLM2-135M)")
    p.add_argument("--prompts", required=True, type=Path, help="JSONL: input_ids, prompt (chat) or text per line")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help=f"p5 target (default {DEFAULT_THRESHOLD})")
    p.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)),
                   help="candidate KV budgets in tokens, comma-separated")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--out", required=True, type=Path, help="schedule JSON to write")
    p.add_argument("--name", default=None, help="schedule name (default: the --out file's stem)")
    p.add_argument("--report-dir", type=Path, default=None, help=f"report folder (default: <out stem>{REPORT_SUFFIX})")
    p.add_argument("--server", default=None, help="generate the rollouts on this running server (URL)")
    p.add_argument("--register", default=None, metavar="URL", help="PUT the schedule to this server when done")
    p.add_argument("--bin-tokens", type=int, default=DEFAULT_BIN_TOKENS)
    p.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    p.add_argument("--length-basis", choices=("total", "generated"), default="total")
    p.add_argument("--samples-per-prompt", type=int, default=DEFAULT_SAMPLES_PER_PROMPT)
    p.add_argument("--temperature", type=float, default=DEFAULT_CALIBRATION_TEMPERATURE)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--ignore-eos", action="store_true", help="generate max-new-tokens every time (reach long bins)")
    p.add_argument("--use-lower-bound", action="store_true",
                   help="require the bootstrap lower bound of p5 (not p5 itself) to meet the threshold")
    p.add_argument("--n-boot", type=int, default=DEFAULT_BOOTSTRAP, help="bootstrap resamples per bin")
    p.add_argument("--no-plots", action="store_true", help="write report.json only")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=run)


def parse_budgets(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise CalibrationError("budgets", text, "must be comma-separated integers (tokens)") from exc


def build_config(args: argparse.Namespace) -> CalibrationConfig:
    return CalibrationConfig(
        name=args.name or args.out.stem, threshold=args.threshold, budgets=parse_budgets(args.budgets),
        max_new_tokens=args.max_new_tokens, bin_tokens=args.bin_tokens, page_size=args.page_size,
        length_basis=args.length_basis, temperature=args.temperature, samples_per_prompt=args.samples_per_prompt,
        seed=args.seed, ignore_eos=args.ignore_eos, use_lower_bound=args.use_lower_bound, n_boot=args.n_boot,
    )


def _model_shape(model, name: str):
    from sparrow_server.cost.model_shape import ModelShapeError, model_shape_from_config

    try:
        return model_shape_from_config({**model.config.to_dict(), "torch_dtype": COST_DTYPE, "dtype": COST_DTYPE}, name)
    except ModelShapeError as exc:
        print(f"note: no cost model for this architecture ({exc}); the report has no costs", file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
    except CalibrationError as exc:
        print(f"error: --{exc.field.replace('_', '-')}: {exc}", file=sys.stderr)
        return 2
    import torch

    from sparrow_server.calibrate.prompts import PromptError, load_prompts
    from sparrow_server.calibrate.report import write_report
    from sparrow_server.calibrate.sources import EngineRolloutSource, ServerRolloutSource
    from sparrow_server.engine.reference import ReferenceEngine
    from sparrow_server.models import ModelLoadError, load_model
    from sparrow_server.monitor.scoring import HFScorer
    from sparrow_server.sparsity.schedule import dump_schedule

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        loaded = load_model(args.model, device=args.device)
        prompts = load_prompts(args.prompts, loaded.tokenizer)
    except (ModelLoadError, PromptError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = None
    if args.server:
        from sparrow_server.client import SparrowClient

        source = ServerRolloutSource(SparrowClient(args.server))
    else:
        engine = ReferenceEngine(loaded.model, loaded.tokenizer, loaded.name, page_size=config.page_size)
        source = EngineRolloutSource(engine)
    # Rollouts and verification alternate (never concurrently), so the scorer needs no lock.
    scorer = HFScorer(lambda: engine.runner.model if engine is not None else loaded.model)
    shape = _model_shape(loaded.model, loaded.name)
    try:
        result = _calibrate(source, scorer, prompts, config, shape, args)
    finally:
        if engine is not None:
            import asyncio

            asyncio.run(engine.shutdown())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump_schedule(result.schedule))
    report_dir = args.report_dir or args.out.with_name(args.out.stem + REPORT_SUFFIX)
    try:
        write_report(result, report_dir, shape, plots=not args.no_plots)
    except RuntimeError as exc:  # matplotlib missing: the schedule and report.json are written
        print(f"warning: {exc}", file=sys.stderr)
    print_summary(result, args.out, report_dir)
    if args.register:
        from sparrow_server.client import SparrowClient

        with SparrowClient(args.register) as client:
            client.put_schedule(result.schedule.name, result.schedule.to_dict())
        print(f"registered schedule {result.schedule.name!r} on {args.register}")
    return 0


def _calibrate(source, scorer, prompts, config, shape, args):
    from sparrow_server.calibrate.pipeline import run_calibration

    return run_calibration(source, scorer, prompts, config, shape, show_progress=not args.no_progress)


def print_summary(result, out: Path, report_dir: Path) -> None:
    cfg = result.config
    budgets = [m.budget for m in result.measurements]
    print(f"p5 acceptance per {cfg.bin_tokens}-token bin (threshold {cfg.threshold}):")
    print("bin      " + "".join(f"{b:>9}" for b in budgets) + "   chosen")
    for choice in result.search.bins:
        cells = "".join(f"{_fmt(m.bins[choice.bin_index].quantile if choice.bin_index < len(m.bins) else None):>9}"
                        for m in result.measurements)
        print(f"{choice.bin_index:<9}" + cells + f"   {choice.budget_tokens} ({choice.status})")
    if result.search.infeasible_bins:
        print(f"warning: no budget reaches {cfg.threshold} in bins {list(result.search.infeasible_bins)}; "
              f"they take the largest budget: add larger --budgets", file=sys.stderr)
    if result.search.predicted_speedup is not None:
        print(f"predicted rollout speedup vs dense: {result.search.predicted_speedup:.2f}x")
    print(f"wrote {out} and {report_dir}/")


def _fmt(x) -> str:
    return "-" if x is None or x != x else f"{x:.3f}"
