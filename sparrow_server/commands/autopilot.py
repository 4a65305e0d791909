"""``sparrow-server autopilot --servers URL,... --schedule NAME --target P5``: one autopilot for a fleet.

Pools the servers' verified tokens (``GET /autopilot/evidence``) and publishes each new version of
the schedule to every server; prints one JSON line per published version (its changes and their
evidence). For a single server, ``PUT /schedules/{name}/autopilot`` runs the same controller inside it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from sparrow_server.commands import SUMMARIES
from sparrow_server.autopilot.controller import (
    ACCEPTANCE_KINDS,
    DEFAULT_ACCEPTANCE,
    DEFAULT_CONFIDENCE,
    DEFAULT_LOWER_PAGES,
    DEFAULT_MARGIN,
    DEFAULT_MIN_TOKENS,
    DEFAULT_RAISE_FACTOR,
    DEFAULT_RETRY_WINDOWS,
    AutopilotConfig,
    AutopilotConfigError,
)
from sparrow_server.autopilot.fleet import DEFAULT_INTERVAL_S
from sparrow_server.server.security import API_KEY_ENV


def register(subparsers) -> None:
    p = subparsers.add_parser("autopilot", help=SUMMARIES["autopilot"])
    p.add_argument("--servers", required=True, help="comma-separated server URLs")
    p.add_argument("--schedule", required=True, help="the (registered, sparse) schedule to steer")
    p.add_argument("--target", type=float, required=True, help="p5 acceptance to hold in every length bin")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN, help="lower a bin once p5 clears target + margin")
    p.add_argument("--floor-tokens", type=int, default=None)
    p.add_argument("--ceiling-tokens", type=int, default=None)
    p.add_argument("--min-tokens", type=int, default=DEFAULT_MIN_TOKENS, help="verified tokens per bin per decision")
    p.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    p.add_argument("--raise-factor", type=float, default=DEFAULT_RAISE_FACTOR)
    p.add_argument("--lower-pages", type=int, default=DEFAULT_LOWER_PAGES)
    p.add_argument("--retry-windows", type=int, default=DEFAULT_RETRY_WINDOWS,
                   help="retry a failed budget after this many min-tokens windows above the band (0: never)")
    p.add_argument("--acceptance", choices=ACCEPTANCE_KINDS, default=DEFAULT_ACCEPTANCE,
                   help="the acceptance the target is stated on: exact (reference servers) or topk_lower_bound (SGLang "
                        "servers; reads lower, docs/autopilot.md); the other kind's evidence is refused")
    p.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S, help="seconds between polls")
    p.add_argument("--iterations", type=int, default=None, help="stop after this many polls (default: run until killed)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow_server.autopilot.fleet import FleetAutopilot

    servers = [u.strip().rstrip("/") for u in args.servers.split(",") if u.strip()]
    try:
        config = AutopilotConfig(args.target, args.margin, args.floor_tokens, args.ceiling_tokens, args.min_tokens,
                                 args.confidence, args.raise_factor, args.lower_pages,
                                 retry_windows=args.retry_windows, acceptance=args.acceptance)
    except AutopilotConfigError as exc:
        print(f"sparrow-server autopilot: --{exc.field.replace('_', '-')} {exc.value}: {exc.reason}", file=sys.stderr)
        return 2
    pilot = FleetAutopilot(servers, args.schedule, config, api_key=os.environ.get(API_KEY_ENV))

    def report(schedule, changes) -> None:
        print(json.dumps({"schedule": args.schedule, "version": schedule["version"],
                          "budgets_tokens": schedule["budgets_tokens"], "changes": [c.to_dict() for c in changes]}),
              flush=True)

    try:
        pilot.run(args.interval_s, args.iterations, report)
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"sparrow-server autopilot: {exc}", file=sys.stderr)
        return 1
    finally:
        pilot.close()
    return 0
