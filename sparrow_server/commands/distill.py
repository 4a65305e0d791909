"""``sparrow-server distill``: DistillSparse, a LoRA that makes the sparse actor under a schedule
match the dense base model (k3 loss on sampled tokens, or forward KL over the dense top-k).

Rollouts come from ``--rollouts FILE`` (JSONL), from ``--prompts FILE`` sampled as sparse rollouts
by the in-process reference engine, or from ``--prompts FILE --server URL`` sampled on a running
server. Writes a PEFT adapter directory plus ``sparrow_adapter.json`` (base fingerprint, schedule,
loss curve, held-out acceptance before/after) to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparrow_server.commands import SUMMARIES
from sparrow_server.distill import config as dc


def register(subparsers) -> None:
    p = subparsers.add_parser("distill", help=SUMMARIES["distill"],
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF directory or .gguf (default: the embedded SmolLM2-135M)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rollouts", type=Path, help="JSONL of {input_ids, prompt_len} or {prompt_ids, output_ids}")
    src.add_argument("--prompts", type=Path, help="JSONL prompts (input_ids / prompt / text) to sample sparse rollouts from")
    p.add_argument("--server", default=None, help="with --prompts: sample the rollouts on this server (URL)")
    p.add_argument("--schedule", required=True, help="schedule name (built-in) or JSON/YAML file")
    p.add_argument("--out", required=True, type=Path, help="adapter directory to create")
    p.add_argument("--heldout", type=Path, default=None, help="held-out rollouts JSONL (default: split off by prompt)")
    p.add_argument("--compare-schedule", action="append", default=[], metavar="NAME|FILE",
                   help="also report held-out acceptance of this schedule without the adapter (repeatable)")
    p.add_argument("--save-rollouts", type=Path, default=None, help="write the rollouts used (JSONL)")
    p.add_argument("--samples-per-prompt", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--rank", type=int, default=dc.DEFAULT_RANK)
    p.add_argument("--alpha", type=float, default=dc.DEFAULT_ALPHA)
    p.add_argument("--target-modules", default=",".join(dc.DEFAULT_TARGET_MODULES),
                   help="comma-separated module names, or all-linear (attention + MLP projections)")
    p.add_argument("--lr", type=float, default=dc.DEFAULT_LR)
    p.add_argument("--weight-decay", type=float, default=dc.DEFAULT_WEIGHT_DECAY)
    p.add_argument("--steps", type=int, default=dc.DEFAULT_STEPS)
    p.add_argument("--batch", type=int, default=dc.DEFAULT_BATCH)
    p.add_argument("--loss", choices=dc.LOSSES, default=dc.DEFAULT_LOSS)
    p.add_argument("--clamp", type=float, default=dc.DEFAULT_CLAMP)
    p.add_argument("--topk", type=int, default=dc.DEFAULT_TOPK, help="top-k of topk_forward_kl")
    p.add_argument("--temperature", type=float, default=dc.DEFAULT_TEMPERATURE, help="rollout/logprob temperature")
    p.add_argument("--heldout-fraction", type=float, default=dc.DEFAULT_HELDOUT_FRACTION)
    p.add_argument("--seed", type=int, default=dc.DEFAULT_SEED)
    p.add_argument("--publish", default=None, metavar="URL,URL",
                   help="then load the adapter on these servers, move --alias to it, unload the previous version")
    p.add_argument("--alias", default=None, help="alias to move when publishing (default: distill-latest)")
    p.add_argument("--adapter-name", default=None, help="version name when publishing (default: the --out folder name)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> dc.DistillConfig:
    return dc.DistillConfig(
        rank=args.rank, alpha=args.alpha, target_modules=tuple(t.strip() for t in args.target_modules.split(",") if t.strip()),
        lr=args.lr, weight_decay=args.weight_decay, steps=args.steps, batch=args.batch, loss=args.loss,
        clamp=args.clamp, topk=args.topk, temperature=args.temperature, heldout_fraction=args.heldout_fraction,
        seed=args.seed,
    )


def resolve_schedule(text: str):
    """A schedule file (``.json``/``.yaml``/``.yml``) or a built-in schedule name."""
    from sparrow_server.sparsity.registry import ScheduleRegistry
    from sparrow_server.sparsity.schedule import load_schedule

    if Path(text).suffix.lower() in (".json", ".yaml", ".yml") or Path(text).is_file():
        return load_schedule(text)
    return ScheduleRegistry().get(text)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from sparrow_server.distill import RolloutError, load_rollouts
    from sparrow_server.sparsity.registry import UnknownScheduleError
    from sparrow_server.sparsity.schedule import ScheduleError

    try:
        config = build_config(args)
        schedule = resolve_schedule(args.schedule)
        compare = [resolve_schedule(s) for s in args.compare_schedule]
    except dc.DistillConfigError as exc:
        return _fail(f"--{exc.field.replace('_', '-')}: {exc}")
    except (ScheduleError, UnknownScheduleError, OSError) as exc:
        return _fail(f"--schedule: {exc}")
    if args.server and not args.prompts:
        return _fail("--server needs --prompts (the prompts to sample rollouts from)")
    if (args.out / "adapter_config.json").exists():
        return _fail(f"--out {str(args.out)!r}: already holds an adapter; adapters are immutable, pick a new directory")
    import torch

    from sparrow_server.models import ModelLoadError, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        loaded = load_model(args.model, device=args.device)
        rollouts = load_rollouts(args.rollouts) if args.rollouts else _sample(args, loaded, schedule)
        heldout = load_rollouts(args.heldout) if args.heldout else None
    except (ModelLoadError, RolloutError, ValueError) as exc:
        return _fail(str(exc))
    if args.save_rollouts:
        from sparrow_server.distill import dump_rollouts

        dump_rollouts(rollouts, args.save_rollouts)
    return _train_and_save(args, loaded.model, rollouts, heldout, schedule, compare, config)


def _sample(args, loaded, schedule):
    from sparrow_server.calibrate.prompts import load_prompts
    from sparrow_server.distill.sources import engine_rollouts
    from sparrow_server.engine.base import SamplingParams

    prompts = load_prompts(args.prompts, loaded.tokenizer)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              seed=args.seed, ignore_eos=args.ignore_eos)
    if args.server:
        return _server_rollouts(args.server, prompts, schedule, sampling, args.samples_per_prompt)
    return engine_rollouts(loaded.model, prompts, schedule, sampling, args.samples_per_prompt)


def _server_rollouts(url, prompts, schedule, sampling, samples_per_prompt):
    """Sparse rollouts from a running server (the schedule is registered there first)."""
    from sparrow_server.calibrate.sources import ServerRolloutSource
    from sparrow_server.client import SparrowClient
    from sparrow_server.distill.sources import generate_rollouts

    with SparrowClient(url) as client:
        return generate_rollouts(ServerRolloutSource(client), prompts, schedule, sampling, samples_per_prompt)


def _train_and_save(args, model, rollouts, heldout, schedule, compare, config) -> int:
    from sparrow_server.distill import save_adapter, train_lora
    from sparrow_server.distill.artifact import report_to_dict

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    log(f"distill: {len(rollouts)} rollouts, schedule {schedule.id}, loss {config.loss}, rank {config.rank}")
    peft_model, report = train_lora(model, rollouts, schedule, config, heldout=heldout, log=log,
                                    compare_schedules=compare)
    out = save_adapter(peft_model, report, args.out)
    summary = {k: v for k, v in report_to_dict(report).items() if k not in ("config", "loss_curve")}
    print(json.dumps({"adapter": str(out), **summary}, indent=2))
    return _publish(args, out) if args.publish else 0


def _publish(args, out: Path) -> int:
    from sparrow_server.distill.publish import DEFAULT_ALIAS, PublishError, publish

    servers = [u.strip() for u in args.publish.split(",") if u.strip()]
    name, alias = args.adapter_name or out.name, args.alias or DEFAULT_ALIAS
    try:
        for p in publish(servers, name, str(out.resolve()), alias):
            print(f"published {p.name} on {p.server} as {p.alias!r}"
                  + (f" (unloaded {p.previous})" if p.previous else ""), file=sys.stderr)
    except PublishError as exc:
        return _fail(f"--publish: {exc}")
    return 0
