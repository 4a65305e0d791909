"""``sparrow-server weights``: update, pause or resume a fleet of running servers (fan-out over
every ``--url``); prints each server's reply as JSON, exits 1 naming the servers that failed."""
from __future__ import annotations

import argparse
import json
import os
import sys

from sparrow_server.commands import SUMMARIES
from sparrow_server.client.common import DEFAULT_TIMEOUT_S, DEFAULT_URL


def register(subparsers) -> None:
    p = subparsers.add_parser("weights", help=SUMMARIES["weights"],
                              description="Weight updates between RL steps, sent to every --url at once.")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    update = sub.add_parser("update", help="POST /update_weights_from_disk on every server")
    update.add_argument("model_path", help="checkpoint directory as the servers see it")
    update.add_argument("--weight-version", default=None, help="version to report (pass the trainer step)")
    update.add_argument("--load-format", default=None)
    update.add_argument("--abort-all-requests", action="store_true", help="abort in-flight requests instead of waiting")
    update.add_argument("--keep-pause", action="store_true", help="stay paused after the update")
    pause = sub.add_parser("pause", help="POST /pause_generation on every server")
    pause.add_argument("--mode", choices=("abort", "retract", "in_place"), default="abort")
    sub.add_parser("resume", help="POST /continue_generation on every server")
    for action in sub.choices.values():
        action.add_argument("--url", action="append", default=None, help=f"server URL, repeatable (default {DEFAULT_URL})")
        action.add_argument("--api-key", default=None, help="admin token (default: $SPARROW_API_KEY, as serve reads it)")
        action.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per server")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparrow_server.client.weights import FleetError, pause, resume, update_weights
    from sparrow_server.server.security import API_KEY_ENV

    urls = args.url or [DEFAULT_URL]
    auth = dict(api_key=args.api_key or os.environ.get(API_KEY_ENV), timeout=args.timeout)
    try:
        if args.action == "update":
            replies = update_weights(urls, args.model_path, weight_version=args.weight_version,
                                     load_format=args.load_format, abort_all_requests=args.abort_all_requests,
                                     keep_pause=args.keep_pause, **auth)
        elif args.action == "pause":
            replies = pause(urls, args.mode, **auth)
        else:
            replies = resume(urls, **auth)
    except FleetError as exc:
        print(json.dumps({url: str(err) for url, err in exc.failures.items()}, indent=2), file=sys.stderr)
        print(json.dumps(exc.results, indent=2))
        print(f"sparrow-server weights {args.action}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(replies, indent=2))
    return 0
