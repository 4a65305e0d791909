"""``sparrow-server`` command line. Each subcommand lives in ``sparrow_server.commands.<name>``
and exposes ``register(subparsers)``, which adds its parser and sets ``func(args) -> int``. Only the
module of the command being run is imported (``--help`` imports none), so a command pays only for
the libraries it uses: ``schedules`` and ``--help`` start without torch or transformers."""
from __future__ import annotations

import argparse
import importlib
import sys

from sparrow_server.commands import SUMMARIES


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; with ``command``, only that one's module is imported and the
    others are listed by name and summary (enough for ``--help`` and argparse's invalid-choice error)."""
    parser = argparse.ArgumentParser(prog="sparrow-server", description="Sparse-rollout server for RL of LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in SUMMARIES.items():
        if command is None or name == command:
            importlib.import_module(f"sparrow_server.commands.{name}").register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def command_of(argv: list[str]) -> str:
    """The subcommand ``argv`` names (its first non-option word), or "" when it names none."""
    return next((word for word in argv if not word.startswith("-")), "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
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
