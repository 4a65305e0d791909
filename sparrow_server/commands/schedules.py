"""``sparrow-server schedules list | show NAME [--json] | validate FILE``.

``list`` and ``show`` read the built-in schedules, plus the ones a server saved in its state dir
with ``--state-dir DIR`` (``serve --state-dir``; ``--persist-dir DIR/schedules`` is the deprecated
spelling), or every schedule a running server resolves with ``--server URL`` (``GET /schedules``).
They only read: a folder that does not exist is an error naming it, never created."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from sparrow_server.commands import SUMMARIES
from sparrow_server.models import user_path
from sparrow_server.server.state import StateDir
from sparrow_server.sparsity.registry import ScheduleRegistry, UnknownScheduleError, builtin_schedules
from sparrow_server.sparsity.schedule import Schedule, ScheduleError, dump_schedule, load_schedule, schedule_from_dict

SERVER_TIMEOUT_S = 30.0
EXIT_INVALID = 1  # an invalid schedule file
EXIT_UNREADABLE = 2  # an unknown name, a missing folder, an unreachable server


class SourceError(Exception):
    """A ``--state-dir`` / ``--persist-dir`` / ``--server`` that cannot be read; the message names it."""


@dataclass(frozen=True)
class Catalogue:
    """The schedules one source resolves, in its order; ``default`` is a server's default schedule."""

    schedules: tuple[Schedule, ...]
    default: str | None = None

    def origin(self, name: str) -> str:
        origin = "built-in" if is_builtin(name) else "registered"
        return f"{origin}, default" if name == self.default else origin


def is_builtin(name: str) -> bool:
    """A name shipped with this package (a server cannot replace those, so its own are the same)."""
    return any(s.name == name for s in builtin_schedules())


def register(subparsers) -> None:
    parser = subparsers.add_parser("schedules", help=SUMMARIES["schedules"])
    sub = parser.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")

    p_list = sub.add_parser("list", help="every schedule name the server resolves")
    p_list.add_argument("--json", action="store_true", help="print a JSON list")
    _source_args(p_list)
    p_list.set_defaults(func=_list)

    p_show = sub.add_parser("show", help="one schedule (with --json: a valid schedule file)")
    p_show.add_argument("name")
    p_show.add_argument("--json", action="store_true", help="print the schedule as a JSON schedule file")
    _source_args(p_show)
    p_show.set_defaults(func=_show)

    p_validate = sub.add_parser("validate", help="check a JSON/YAML schedule file; non-zero exit if invalid")
    p_validate.add_argument("file")
    p_validate.set_defaults(func=_validate)


def _source_args(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--state-dir", default=None, metavar="DIR",
                       help="also the schedules registered on a server with this state dir (serve --state-dir)")
    where.add_argument("--server", default=None, metavar="URL",
                       help="the schedules this running server resolves (GET /schedules), its default marked")
    where.add_argument("--persist-dir", default=None, metavar="DIR",
                       help="deprecated: the state dir's schedules folder (pass the state dir as --state-dir)")


def _schedules_folder(args) -> Path | None:
    """The folder of saved schedules that ``args`` names (None: built-ins only). Raises ``SourceError``."""
    if args.persist_dir is not None:
        print("note: --persist-dir is deprecated: pass the state dir (its parent) as --state-dir", file=sys.stderr)
        return _existing_dir("--persist-dir", args.persist_dir)
    if args.state_dir is None:
        return None
    folder = StateDir(_existing_dir("--state-dir", args.state_dir)).schedules
    if not folder.is_dir():
        raise SourceError(f"--state-dir {args.state_dir!r}: not a server state dir (no {folder.name}/ folder in it)")
    return folder


def _existing_dir(flag: str, text: str) -> Path:
    try:
        path = user_path(text)
    except ValueError as exc:
        raise SourceError(f"{flag} {text!r}: {exc}") from None
    if not path.is_dir():
        raise SourceError(f"{flag} {text!r}: no such directory")
    return path


def _registry(args) -> ScheduleRegistry:
    return ScheduleRegistry.load(persist_dir=_schedules_folder(args))  # the folder exists: load creates nothing


def _from_server(url: str, name: str | None = None) -> dict:
    """``GET /schedules`` (or ``/schedules/{name}``) on ``url``. Raises ``SourceError`` (unreachable, or
    an error answer) or ``UnknownScheduleError`` (no schedule ``name``)."""
    import httpx

    from sparrow_server.client import SparrowClient, SparrowError
    from sparrow_server.client.common import RetryPolicy

    try:
        with SparrowClient(url, timeout=SERVER_TIMEOUT_S, retry=RetryPolicy(retries=0)) as client:
            return client.schedules() if name is None else client.get_schedule(name)
    except SparrowError as exc:
        if exc.status == 404 and name is not None:
            raise UnknownScheduleError(name) from None
        raise SourceError(f"--server {url}: {exc}") from None
    except (OSError, httpx.HTTPError) as exc:
        raise SourceError(f"--server {url}: cannot reach it: {exc}") from None


def _catalogue(args) -> Catalogue:
    if args.server is None:
        return Catalogue(_registry(args).schedules())
    listing = _from_server(args.server)
    return Catalogue(tuple(schedule_from_dict(d) for d in listing["schedules"]), listing.get("default"))


def _schedule(args) -> Schedule:
    if args.server is None:
        return _registry(args).get(args.name)
    return schedule_from_dict(_from_server(args.server, args.name))


def _reading(action):
    """Run ``action(args)``; a source that cannot be read, or holds an invalid schedule, is a message and an exit status."""
    def run(args) -> int:
        try:
            return action(args)
        except SourceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
        except ScheduleError as exc:
            print(f"error: invalid schedule: {exc}", file=sys.stderr)
            return EXIT_INVALID
    return run


@_reading
def _list(args) -> int:
    catalogue = _catalogue(args)
    if args.json:
        rows = [{"name": s.name, "version": s.version, "builtin": is_builtin(s.name),
                 "threshold": s.threshold, "bins": len(s.budgets_tokens),
                 "budgets_tokens": list(s.budgets_tokens)} for s in catalogue.schedules]
        if catalogue.default is not None:
            rows = [{**row, "default": row["name"] == catalogue.default} for row in rows]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'name':<22} {'ver':>3} {'p5 target':>9} {'bins':>4}  budget tokens (first .. last)  source")
    for s in catalogue.schedules:
        target = f"{s.threshold:.2f}" if s.threshold is not None else "-"
        span = f"{s.budgets_tokens[0]} .. {s.budgets_tokens[-1]}" if s.budgets_tokens else "dense"
        print(f"{s.name:<22} {s.version:>3} {target:>9} {len(s.budgets_tokens):>4}  {span:<29} {catalogue.origin(s.name)}")
    return 0


@_reading
def _show(args) -> int:
    try:
        schedule = _schedule(args)
    except UnknownScheduleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
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
