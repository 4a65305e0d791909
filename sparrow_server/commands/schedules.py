"""``sparrow-server schedules list | show NAME [--json] | validate FILE``."""
from __future__ import annotations

import argparse
import json
import sys

from sparrow_server.commands import SUMMARIES
from sparrow_server.sparsity.registry import ScheduleRegistry, UnknownScheduleError
from sparrow_server.sparsity.schedule import Schedule, ScheduleError, dump_schedule, load_schedule


def register(subparsers) -> None:
    parser = subparsers.add_parser("schedules", help=SUMMARIES["schedules"])
    sub = parser.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")

    p_list = sub.add_parser("list", help="every schedule name the server resolves")
    p_list.add_argument("--json", action="store_true", help="print a JSON list")
    _persist_arg(p_list)
    p_list.set_defaults(func=_list)

    p_show = sub.add_parser("show", help="one schedule (with --json: a valid schedule file)")
    p_show.add_argument("name")
    p_show.add_argument("--json", action="store_true", help="print the schedule as a JSON schedule file")
    _persist_arg(p_show)
    p_show.set_defaults(func=_show)

    p_validate = sub.add_parser("validate", help="check a JSON/YAML schedule file; non-zero exit if invalid")
    p_validate.add_argument("file")
    p_validate.set_defaults(func=_validate)


def _persist_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--persist-dir", default=None,
                        help="also list schedules registered on a server that saves them in this folder")


def _registry(args) -> ScheduleRegistry:
    return ScheduleRegistry.load(persist_dir=args.persist_dir)


def _list(args) -> int:
    registry = _registry(args)
    schedules = registry.schedules()
    if args.json:
        rows = [{"name": s.name, "version": s.version, "builtin": registry.is_builtin(s.name),
                 "threshold": s.threshold, "bins": len(s.budgets_tokens),
                 "budgets_tokens": list(s.budgets_tokens)} for s in schedules]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<22} {'ver':>3} {'p5 target':>9} {'bins':>4}  budget tokens (first .. last)  source")
    for s in schedules:
        target = f"{s.threshold:.2f}" if s.threshold is not None else "-"
        span = f"{s.budgets_tokens[0]} .. {s.budgets_tokens[-1]}" if s.budgets_tokens else "dense"
        origin = "built-in" if registry.is_builtin(s.name) else "registered"
        print(f"{s.name:<22} {s.version:>3} {target:>9} {len(s.budgets_tokens):>4}  {span:<29} {origin}")
    return 0


def _show(args) -> int:
    try:
        schedule = _registry(args).get(args.name)
    except UnknownScheduleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(dump_schedule(schedule))
        return 0
    print(_describe(schedule))
    return 0


def _describe(s: Schedule) -> str:
    lines = [
        f"{s.id}: {s.description}" if s.description else s.id,
        f"  page_size {s.page_size}, bin_tokens {s.bin_tokens}, length_basis {s.length_basis}, "
        f"sink_pages {s.sink_pages}, recent_pages {s.recent_pages}, dense_layers {list(s.dense_layers)}, "
        f"threshold {s.threshold}",
    ]
    if s.is_dense:
        lines.append("  dense at every length")
        return "\n".join(lines)
    lines.append(f"  {'bin':>3}  {'lengths':<16} {'budget tokens':>13} {'pages':>5}")
    for i, b in enumerate(s.budgets_tokens):
        lo = i * s.bin_tokens
        hi = f"{(i + 1) * s.bin_tokens}" if i < len(s.budgets_tokens) - 1 else "inf"
        span = f"[{lo}, {hi})"
        lines.append(f"  {i:>3}  {span:<16} {b:>13} {b // s.page_size:>5}")
    return "\n".join(lines)


def _validate(args) -> int:
    try:
        schedule = load_schedule(args.file)
    except ScheduleError as exc:
        print(f"invalid schedule {args.file}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"ok: {schedule.id} ({'dense' if schedule.is_dense else f'{len(schedule.budgets_tokens)} bins'})")
    return 0
