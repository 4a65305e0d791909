"""``sparrow-server`` command line. Each subcommand lives in ``sparrow_server.commands.<name>``
and exposes ``register(subparsers)``, which adds its parser and sets ``func(args) -> int``."""
from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "demo",
    "serve",
    "rollout",
    "schedules",
    "cost",
    "calibrate",
    "distill",
    "weights",
    "autopilot",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparrow-server", description="Sparse-rollout server for RL of LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"sparrow_server.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"sparrow_server.commands.{name}":
                raise
            continue  # subcommand not built yet
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if "--" in extra:  # `serve ... -- SGLANG ARGS`: the separator is ours, not SGLang's
        extra.remove("--")
    args.extra_args = extra  # e.g. SGLang's own flags for `serve --engine sglang`
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # Output piped into e.g. `head`, which closed early: not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
