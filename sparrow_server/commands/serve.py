"""``sparrow-server serve``: start the HTTP service."""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparrow_server.commands import SUMMARIES
from sparrow_server.commands.serve_security import add_security_arguments, limits_from_args, security_from_args
from sparrow_server.engine.adapter_versions import DEFAULT_MAX_LORA_RANK
from sparrow_server.sparsity.schedule import DENSE_SCHEDULE_NAME

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000  # SGLang's default port, so SGLang clients work unchanged


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help=SUMMARIES["serve"], allow_abbrev=False,
                              description="Serve /rollout, SGLang's /generate, schedules, health and metrics. "
                                          "With --engine sglang, arguments this command does not know go to "
                                          "SGLang's server (e.g. --mem-fraction-static 0.8 --enable-lora).")
    p.add_argument("--engine", choices=None, default=None,
                   help="reference | sglang (default: sglang on a CUDA machine with SGLang, else reference)")
    p.add_argument("--model", default=None, help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--default-schedule", default=DENSE_SCHEDULE_NAME, help="schedule of requests that name none")
    p.add_argument("--state-dir", default=None, help="where registered schedules persist (default: user cache dir)")
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH", help="load a PEFT LoRA adapter (repeatable)")
    p.add_argument("--max-lora-rank", type=int, default=DEFAULT_MAX_LORA_RANK, help="largest LoRA rank POST /adapters accepts")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
    p.add_argument("--kv-pool-tokens", type=int, default=None, help="KV cache capacity of the reference engine, in tokens")
    p.add_argument("--max-batch-size", type=int, default=None, help="requests decoded together (reference engine)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (reference engine)")
    p.add_argument("--weight-group-timeout-s", type=float, default=None,
                   help="reference engine: deadline of joining a trainer's weight-update group and of each "
                        "/update_weights_from_distributed broadcast (default 300)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--verify-fraction", type=float, default=None,
                   help="share of rollouts re-scored densely for the acceptance metrics (default 5%%; "
                        "requests with verify: true always are)")
    add_security_arguments(p)
    p.set_defaults(func=run, accepts_extra_args=True)


def parse_adapters(values: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--adapter {value!r}: expected NAME=PATH")
        out.append((name, path))
    return tuple(out)


@dataclass(frozen=True)
class ServiceParts:
    """What the sparrow app needs besides its engine, built from ``serve``'s flags."""

    security: Any
    security_summary: str
    limits: Any
    verify: dict  # create_app's verify_fraction, when the flag was given
    state: Any
    schedules: Any


def _service_parts(args: argparse.Namespace) -> ServiceParts:
    """Schedules, state, security, limits and verification settings (bad flags raise ValueError)."""
    from sparrow_server.server.state import StateDir, default_state_dir
    from sparrow_server.sparsity.registry import ScheduleRegistry

    security, security_summary = security_from_args(args)
    if args.verify_fraction is not None and not 0.0 <= args.verify_fraction <= 1.0:
        raise ValueError(f"--verify-fraction {args.verify_fraction!r}: must be in [0, 1]")
    state = StateDir(Path(args.state_dir) if args.state_dir else default_state_dir()).create()
    schedules = ScheduleRegistry.load(persist_dir=state.schedules)
    schedules.get(args.default_schedule)
    return ServiceParts(security, security_summary, limits_from_args(args),
                        {} if args.verify_fraction is None else {"verify_fraction": args.verify_fraction},
                        state, schedules)


def sparrow_app(args: argparse.Namespace, parts: ServiceParts, engine, tokenizer):
    """The sparrow FastAPI app around ``engine``."""
    from sparrow_server.engine.adapter_versions import default_adapter_manager
    from sparrow_server.server.app import create_app

    adapters = default_adapter_manager(engine, persist_dir=parts.state.adapters, max_rank=args.max_lora_rank)
    return create_app(engine, parts.schedules, args.default_schedule, tokenizer, security=parts.security,
                      limits=parts.limits, adapters=adapters, autopilot_dir=parts.state.autopilot, **parts.verify)


def build_app(args: argparse.Namespace):
    """The app ``serve`` runs on an in-process engine (separate so tests and ``demo`` can build it)."""
    import torch

    from sparrow_server.engine.factory import EngineOptions, build_engine, default_engine_name

    parts = _service_parts(args)
    if args.weight_group_timeout_s is not None and not args.weight_group_timeout_s > 0:
        raise ValueError(f"--weight-group-timeout-s {args.weight_group_timeout_s!r}: must be a positive number of seconds")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    options = EngineOptions(model=args.model, device=device, adapters=parse_adapters(args.adapter),
                            kv_pool_tokens=args.kv_pool_tokens, max_batch_size=args.max_batch_size, threads=args.threads,
                            weight_group_timeout_s=args.weight_group_timeout_s)
    engine_name = args.engine or default_engine_name()
    built = build_engine(engine_name, options)
    app = sparrow_app(args, parts, built.engine, built.tokenizer)
    summary = (f"engine {engine_name}, model {built.model_name} on {device}, default schedule {args.default_schedule}, "
               f"state dir {parts.state.root}; {parts.security_summary}")
    return app, summary


def _load_tokenizer(model: str):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model)
    except Exception:  # token-id-only serving (e.g. dummy weights without a tokenizer)
        return None


def sglang_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], ServiceParts]:
    """(SGLang argv, plug-in environment, service parts) of ``serve --engine sglang``."""
    from sparrow_server.sglang_plugin.frontend.host import plugin_environment, sglang_argv

    if not args.model:
        raise ValueError("--engine sglang needs --model PATH (a Hugging Face model directory)")
    parts = _service_parts(args)
    extra = list(args.extra_args)
    if "--enable-lora" in extra and "--max-lora-rank" not in extra:
        extra += ["--max-lora-rank", str(args.max_lora_rank)]  # one limit for SGLang's pool and POST /adapters
    argv = sglang_argv(args.model, args.host, args.port, parse_adapters(args.adapter), args.max_batch_size,
                       tuple(extra) + ("--log-level", args.log_level))
    env = plugin_environment(args.default_schedule, str(parts.state.schedules))
    return argv, env, parts


def run_sglang(args: argparse.Namespace) -> int:
    from sparrow_server.sglang_plugin.frontend.host import run_sglang_server

    argv, env, parts = sglang_command(args)
    tokenizer = _load_tokenizer(args.model)
    print(f"sparrow-server: SGLang server with the sparrow backend on http://{args.host}:{args.port} "
          f"(SGLang args: {' '.join(argv)}; {parts.security_summary})", flush=True)
    run_sglang_server(argv, lambda engine: sparrow_app(args, parts, engine, tokenizer), env,
                      admin_api_key=parts.security.api_key)
    return 0


def run(args: argparse.Namespace) -> int:
    from sparrow_server.server.shutdown import make_server
    from sparrow_server.models import ModelLoadError
    from sparrow_server.sparsity.registry import UnknownScheduleError
    from sparrow_server.sparsity.schedule import ScheduleError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sparrow_server.engine.factory import default_engine_name

    engine_name = args.engine or default_engine_name()
    extra = getattr(args, "extra_args", [])
    if extra and engine_name != "sglang":
        print(f"sparrow-server serve: unrecognized arguments: {' '.join(extra)} (SGLang arguments need --engine sglang)",
              file=sys.stderr)
        return 2
    try:
        security_from_args(args)  # refuse a bad bind before loading the model
        if engine_name == "sglang":
            return run_sglang(args)
        app, summary = build_app(args)
    except (ValueError, UnknownScheduleError, ScheduleError, ModelLoadError, OSError) as exc:
        print(f"sparrow-server serve: {exc}", file=sys.stderr)
        return 2
    print(f"sparrow-server: serving on http://{args.host}:{args.port} ({summary})", flush=True)
    make_server(app, args.host, args.port, args.log_level.lower(), app.state.limits.drain_timeout_s).run()
    return 0
