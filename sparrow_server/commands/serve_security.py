"""``serve``'s authentication, bind and limit flags (kept apart from ``serve.py``'s engine flags).

- ``--api-key`` (or ``SPARROW_API_KEY``, preferred: a flag shows in ``ps``): the admin token.
- ``--require-auth-for-rollouts``: generation routes need the token too.
- Without a key the server binds to loopback only; a non-loopback ``--host`` is refused unless
  ``--insecure-allow-remote``, which serves rollouts to anyone and refuses every state change.
- ``--adapter-root`` / ``--schedule-root`` (repeatable): where client-given paths may point.
- One flag per ``Limits`` field (``--max-body-bytes`` ...), default = the field's default.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import fields, replace
from pathlib import Path

from sparrow_server.server.limits import Limits, flag
from sparrow_server.server.security import API_KEY_ENV, SecurityConfig, is_loopback_host

LIMIT_HELP = {
    "max_body_bytes": "largest request body in bytes (413 above)",
    "max_prompt_tokens": "longest prompt in tokens (default: the model's context)",
    "max_new_tokens_limit": "largest max_new_tokens a request may ask (default: the model's context)",
    "max_n": "most samples per request",
    "max_generate_batch": "most prompts in one batched /generate body",
    "max_top_logprobs": "most top logprobs per token",
    "max_streams_per_client": "generation requests in flight per client address, queued ones included (429 above)",
    "max_concurrent_streams": "generation requests in flight in total; more wait in the queue",
    "max_queue": "requests waiting for a slot (429 above)",
    "retry_after_s": "Retry-After seconds on 429 and 503",
    "request_timeout_s": "end a request (queue wait included) after this many seconds; 0 = never",
    "drain_timeout_s": "on SIGTERM, seconds streams get to finish before they are aborted",
}


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("authentication and bind")
    g.add_argument("--api-key", default=None,
                   help=f"admin bearer token for state-changing endpoints (default: ${API_KEY_ENV}; prefer the variable)")
    g.add_argument("--require-auth-for-rollouts", action="store_true", help="/rollout and /generate need the token too")
    g.add_argument("--insecure-allow-remote", action="store_true",
                   help="allow a non-loopback --host without an API key (state-changing endpoints are then refused)")
    g.add_argument("--adapter-root", action="append", default=[], metavar="DIR",
                   help="directory client-given adapter paths must resolve into (repeatable)")
    g.add_argument("--schedule-root", action="append", default=[], metavar="DIR",
                   help="directory client-given schedule files must resolve into (repeatable)")
    g = p.add_argument_group("limits")
    for f in fields(Limits):
        kind = float if f.name.endswith("_s") and f.name != "retry_after_s" else int
        suffix = "" if f.default is None else f" (default: {f.default})"
        g.add_argument(flag(f.name), type=kind, default=None, help=LIMIT_HELP[f.name] + suffix)


def limits_from_args(args: argparse.Namespace) -> Limits:
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Limits)}
    no_timeout = overrides["request_timeout_s"] == 0
    limits = Limits.from_overrides(**{**overrides, "request_timeout_s": None if no_timeout else overrides["request_timeout_s"]})
    return replace(limits, request_timeout_s=None) if no_timeout else limits


def security_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> tuple[SecurityConfig, str]:
    """The security config and the start-up line that says what is protected. Raises ``ValueError``
    for a non-loopback host without a key (unless ``--insecure-allow-remote``)."""
    environ = os.environ if environ is None else environ
    key = args.api_key if args.api_key is not None else environ.get(API_KEY_ENV) or None
    loopback = is_loopback_host(args.host)
    if key is None and not loopback and not args.insecure_allow_remote:
        raise ValueError(f"refusing to listen on {args.host} without an API key: set {API_KEY_ENV} (or --api-key), "
                         "bind to 127.0.0.1, or pass --insecure-allow-remote")
    config = SecurityConfig(
        api_key=key, require_auth_for_rollouts=args.require_auth_for_rollouts,
        open_admin_without_key=loopback,
        adapter_roots=tuple(Path(r).resolve() for r in args.adapter_root),
        schedule_roots=tuple(Path(r).resolve() for r in args.schedule_root),
    )
    return config, _describe(config, args.host, loopback)


def _describe(config: SecurityConfig, host: str, loopback: bool) -> str:
    if config.api_key is not None:
        who = "rollouts and state changes" if config.require_auth_for_rollouts else "state-changing endpoints"
        return f"API key set: {who} require 'Authorization: Bearer <key>'"
    if loopback:
        return (f"no API key: listening on loopback ({host}) only, state-changing endpoints open to local clients; "
                f"set {API_KEY_ENV} to serve other hosts")
    return (f"WARNING: no API key and listening on {host} (--insecure-allow-remote): anyone who can reach it may "
            "generate; state-changing endpoints are refused")


__all__ = ["add_security_arguments", "limits_from_args", "security_from_args"]
