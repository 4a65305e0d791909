"""What exact live verification costs on the production engine, per verified token (issue 25 item 1).

One ``sparrow-server serve --engine sglang`` on dummy weights of a Qwen3 size (``--load-format dummy``: the
cost does not depend on the values), ``--verify-fraction 0`` (only requests that ask are verified), the exact
subsample at ``SPARROW_EXACT_STRIDE`` (default 16). Three batches of ``--requests`` ``/rollout`` requests sent at
once (random prompts of ``--prompt`` tokens, ``--gen`` generated, temperature 1, ``ignore_eos``, seeded, the
size's 0.86 preset), back to back on the same server:

1. plain (``verify: false``);
2. verified (``verify: true``: a sparse row kept at every kept position during decode, then each rollout's dense
   verify prefill; the response waits for it);
3. plain again (the host's drift shows as the difference between 1 and 3).

The cost per verified token is (verified wall - mean plain wall) / generated tokens of the verified batch, and
per kept token the same over the kept positions; the verify's share is that difference over the verified wall.
The kept rows' memory (two bytes per vocabulary entry per kept row) is counted, not measured.
Writes ``OUT/verify_cost.json`` and ``OUT/server.log``.

    python benchmarks/verify_cost.py OUT [--size qwen3-1.7b] [--requests 32] [--prompt 1024] [--gen 8192]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks (sglang_server, sglang_throughput)


def cost_summary(plain_walls: list[float], verified_wall: float, generated_tokens: int, kept_tokens: int,
                 vocab: int) -> dict:
    """The verification's cost from the batches' walls (seconds) and what the verified batch generated and kept."""
    if not plain_walls or generated_tokens <= 0 or kept_tokens <= 0:
        raise ValueError(f"plain_walls={plain_walls!r}, generated_tokens={generated_tokens}, kept_tokens={kept_tokens}: "
                         "need at least one plain batch and a verified batch that kept tokens")
    plain = statistics.fmean(plain_walls)
    extra = verified_wall - plain
    return {"plain_wall_s": [round(w, 3) for w in plain_walls], "plain_wall_mean_s": round(plain, 3),
            "plain_drift": round((max(plain_walls) - min(plain_walls)) / plain, 4),
            "verified_wall_s": round(verified_wall, 3), "extra_s": round(extra, 3),
            "verify_share_of_verified_wall": round(extra / verified_wall, 4),
            "extra_us_per_generated_token": round(1e6 * extra / generated_tokens, 3),
            "extra_us_per_kept_token": round(1e6 * extra / kept_tokens, 3),
            "generated_tokens": generated_tokens, "kept_tokens": kept_tokens,
            "kept_row_bytes": 2 * vocab, "kept_rows_bytes_all": 2 * vocab * kept_tokens}


def rows_mib(requests: int, gen: int, stride: int, vocab: int) -> int:
    """``SPARROW_EXACT_MAX_MIB`` that holds every kept row of a batch at once (float16, one per ``stride``
    tokens, +25 %): the default bound would refuse rows at Qwen3's vocabulary and report them missing."""
    return int(1.25 * requests * -(-gen // stride) * 2 * vocab / (1 << 20)) + 1


def rollout_requests(n: int, prompt: int, gen: int, vocab: int, schedule: str, verify: bool, seed: int = 0) -> list[dict]:
    from sglang_throughput import random_ids  # the throughput benchmark's prompts (ids clear of the vocabulary's ends)

    prompts = random_ids(random.Random(seed), n, prompt, vocab)  # the same prompts and seeds in every batch
    return [{"input_ids": ids, "schedule": schedule, "verify": verify,
             "sampling_params": {"max_new_tokens": gen, "temperature": 1.0, "ignore_eos": True, "seed": seed + i}}
            for i, ids in enumerate(prompts)]


def run_batch(client, requests: list[dict]) -> tuple[float, list]:
    t0 = time.time()
    results = client.rollout_batch(requests, concurrency=len(requests))
    return time.time() - t0, results


def kept_count(results: list) -> int:
    """Kept positions the verified batch reported (``meta.exact_subsample.positions``)."""
    return sum(len((r.meta.raw.get("exact_subsample") or {}).get("positions") or ()) for r in results)


def prefill_probe_payloads(prompt_ids: list[int], completion_ids: list[int]) -> dict[str, dict]:
    """The bound mode's dense verify prefill (``top_k``: the top-k of every completion position, what a server at
    ``SPARROW_EXACT_STRIDE=0`` sends), then without the top-k (``token_logprobs``) and without logprobs
    (``no_logprobs``): what SGLang's side of each part costs (the exact mode sends none of them per position)."""
    from sparrow_server.monitor.verifier import DEFAULT_RECORD_TOPK
    from sparrow_server.sglang_plugin.frontend.verification import dense_prefill_kwargs

    top_k = dense_prefill_kwargs(prompt_ids, completion_ids, DEFAULT_RECORD_TOPK)
    token_logprobs = {k: v for k, v in top_k.items() if k != "top_logprobs_num"}
    no_logprobs = {k: v for k, v in token_logprobs.items() if k != "logprob_start_len"} | {"return_logprob": False}
    return {"top_k": top_k, "token_logprobs": token_logprobs, "no_logprobs": no_logprobs}


def probe_prefills(client, pairs: list[tuple[list[int], list[int]]]) -> dict[str, dict]:
    """Each variant's seconds per prefill, sent one at a time, variants interleaved (drift hits all alike)."""
    seconds: dict[str, list[float]] = {}
    for prompt_ids, completion_ids in pairs:
        for name, payload in prefill_probe_payloads(prompt_ids, completion_ids).items():
            t0 = time.time()
            client.generate(payload)
            seconds.setdefault(name, []).append(round(time.time() - t0, 4))
    return {name: {"seconds": s, "median_s": round(statistics.median(s), 4)} for name, s in seconds.items()}


def server_args(requests: int, state_dir: Path, extra: str = "") -> list[str]:
    """``sparrow-server serve --engine sglang`` flags after --model/--host/--port (it owns --page-size)."""
    # the kept rows live on the GPU beside the KV pool: leave them room (6 GB at 32 x 8K tokens, stride 16)
    return ["--load-format", "dummy", "--context-length", "40960", "--verify-fraction", "0",
            "--mem-fraction-static", "0.75", "--disable-radix-cache", "--max-batch-size", str(requests),
            "--cuda-graph-max-bs", str(requests), "--cuda-graph-backend-prefill", "disabled",
            "--state-dir", str(state_dir), *extra.split()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="qwen3-1.7b")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=8192)
    ap.add_argument("--stride", type=int, default=16, help="SPARROW_EXACT_STRIDE: one kept position per this many tokens")
    ap.add_argument("--port", type=int, default=31800)
    ap.add_argument("--server-args", default="", help="extra SGLang flags")
    ap.add_argument("--probe", type=int, default=4,
                    help="after the batches, time this many verify prefills alone, with and without top-k and logprobs")
    a = ap.parse_args(argv)
    import sglang_server as S  # noqa: E402  (GPU side: imported where used, --help stays fast)
    from sparrow_server.client import SparrowClient

    a.out.mkdir(parents=True, exist_ok=True)
    cfg = S.qwen3_config(a.size)
    schedule, vocab = f"{a.size}-0.86", int(cfg["vocab_size"])
    args = server_args(a.requests, a.out / "state", a.server_args)
    env = {"SPARROW_EXACT_STRIDE": str(a.stride), "SPARROW_EXACT_MAX_MIB": str(rows_mib(a.requests, a.gen, a.stride, vocab))}
    server = S.Server(S.write_config(a.out / "dummy", cfg), args, a.out / "server.log", port=a.port, env=env, sparrow=True)
    report = {"size": a.size, "schedule": schedule, "requests": a.requests, "prompt": a.prompt, "gen": a.gen,
              "server_args": args, "server_env": env}
    try:
        report["startup_s"] = round(server.start(timeout_s=400), 1)
        with SparrowClient(server.base, timeout=3600) as client:
            run_batch(client, rollout_requests(2, 256, 64, vocab, schedule, True))  # warm-up: graphs, verify path
            walls = {}
            for name, verify in (("plain", False), ("verified", True), ("plain_again", False)):
                requests = rollout_requests(a.requests, a.prompt, a.gen, vocab, schedule, verify)
                walls[name], results = run_batch(client, requests)
                if verify:
                    pairs = [(q["input_ids"], r.token_ids) for q, r in zip(requests, results)][:a.probe]
                    generated, kept = sum(len(r.token_ids) for r in results), kept_count(results)
                    report["acceptance_kinds"] = sorted({r.meta.raw.get("acceptance_kind") for r in results}, key=str)
                    report["exact_missing_tokens"] = sum(r.meta.raw.get("exact_missing_tokens") or 0 for r in results)
                print(f"[verify_cost] {name}: {walls[name]:.1f} s", flush=True)
            if a.probe:
                report["prefill_probe"] = probe_prefills(client, pairs)
                print(f"[verify_cost] prefill probe: {report['prefill_probe']}", flush=True)
        report["cost"] = cost_summary([walls["plain"], walls["plain_again"]], walls["verified"], generated, kept, vocab)
    finally:
        server.stop()
        (a.out / "verify_cost.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report.get("cost"), indent=1))
    return 0 if report.get("acceptance_kinds") == ["exact"] and not report.get("exact_missing_tokens") else 1


if __name__ == "__main__":
    sys.exit(main())
