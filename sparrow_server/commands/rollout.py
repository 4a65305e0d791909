"""``sparrow-server rollout``: one streamed rollout against a running server; prints the tokens
as they arrive, then a summary."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time

from sparrow_server.commands import SUMMARIES
from sparrow_server.client.common import DEFAULT_URL


def register(subparsers) -> None:
    p = subparsers.add_parser("rollout", help=SUMMARIES["rollout"])
    add_rollout_arguments(p)
    p.add_argument("--url", default=DEFAULT_URL, help=f"server URL (default {DEFAULT_URL})")
    p.set_defaults(func=run)


def add_rollout_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="prompt text (tokenised by the server)")
    src.add_argument("--input-ids", default=None, help="prompt token ids, comma-separated")
    p.add_argument("--chat", action="store_true", help="wrap --text in the model's chat template")
    p.add_argument("--schedule", default=None, help="schedule name (default: the server's default)")
    p.add_argument("--adapter", default=None, help="LoRA adapter name")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--top-logprobs", type=int, default=0)
    p.add_argument("--ndjson", action="store_true", help="ask for NDJSON instead of SSE")
    p.add_argument("--json", action="store_true", help="print each event as JSON instead of text")


def request_kwargs(args: argparse.Namespace) -> dict:
    sampling = {"max_new_tokens": args.max_new_tokens}
    for key in ("temperature", "top_p", "top_k", "seed"):
        if getattr(args, key) is not None:
            sampling[key] = getattr(args, key)
    kwargs = dict(sampling_params=sampling, schedule=args.schedule, adapter=args.adapter, top_logprobs=args.top_logprobs)
    if args.input_ids is not None:
        kwargs["input_ids"] = [int(t) for t in args.input_ids.split(",") if t.strip()]
    else:
        kwargs["text"] = args.text if args.text is not None else "Write a haiku about sparse attention."
        kwargs["apply_chat_template"] = args.chat or args.text is None
    return kwargs


LOGPROBS_HEADING = "sparse (behaviour) logprobs, one per token:"
LOGPROBS_LINE_CHARS = 100  # width of the printed per-token logprobs


def format_logprobs(logprobs: list[float]) -> str:
    """Per-token logprobs, two decimals each, wrapped into lines of ``LOGPROBS_LINE_CHARS``."""
    return textwrap.fill(" ".join(f"{lp:.2f}" for lp in logprobs), width=LOGPROBS_LINE_CHARS)


def stream_and_print(client, kwargs: dict, as_json: bool = False, ndjson: bool = False, out=None,
                     logprobs: bool = False) -> int:
    """Stream one rollout, print it (with ``logprobs``, then its per-token sparse logprobs), then a
    summary; 0 when it finished normally."""
    out = out or sys.stdout  # looked up per call: tests and callers may swap sys.stdout
    from sparrow_server.client import RolloutResult

    started = time.monotonic()
    events = []
    for event in client.stream(ndjson=ndjson, **kwargs):
        events.append(event)
        if as_json:
            print(json.dumps(event.__dict__, default=lambda o: o.__dict__), file=out, flush=True)
        else:
            print(event.text if event.text is not None else " ".join(map(str, event.token_ids)) + " ", end="", file=out, flush=True)
    result = RolloutResult.from_events(events)
    elapsed = time.monotonic() - started
    meta = result.meta
    mean_lp = sum(result.logprobs) / len(result.logprobs) if result.logprobs else float("nan")
    if logprobs and not as_json:  # the JSON events carry them already
        print(f"\n{LOGPROBS_HEADING}\n{format_logprobs(result.logprobs)}", end="", file=out)
    budget = "n/a" if meta.kv_budget_tokens_mean is None else f"{meta.kv_budget_tokens_mean:.1f}"
    print(f"\n--- {meta.completion_tokens} tokens in {elapsed:.2f} s ({meta.completion_tokens / elapsed:.1f} tok/s); "
          f"finish {meta.finish_reason}; schedule {meta.schedule}; adapter {meta.adapter}; prompt {meta.prompt_tokens} tokens; "
          f"mean KV budget {budget} tokens; mean logprob {mean_lp:.3f}; weights {meta.weight_version}", file=out)
    return 0 if meta.finish_reason and meta.finish_reason.get("type") in ("stop", "length") else 1


def run(args: argparse.Namespace) -> int:
    import httpx

    from sparrow_server.client import SparrowClient, SparrowError

    try:
        with SparrowClient(args.url) as client:
            return stream_and_print(client, request_kwargs(args), args.json, args.ndjson)
    except SparrowError as exc:
        print(f"sparrow-server rollout: {exc}", file=sys.stderr)
        return 1
    except (OSError, httpx.HTTPError) as exc:
        print(f"sparrow-server rollout: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
