"""torch.profiler trace of decode graph replays, dense (``flashinfer``) vs sparse (``sparrow``), per layer.

For each backend: start the server (dummy Qwen3 weights), send ``batch`` requests of ``context``
prompt tokens, wait until every request decodes, let SGLang's own ``/start_profile`` record a few
steps (GPU + CPU activities), then read the trace: the kernels of one CUDA-graph replay (those that
share the correlation id of the ``cudaGraphLaunch`` with the most kernels) split into segments at
each attention kernel: segment ``i`` runs from after layer ``i-1``'s attention through layer ``i``'s
attention (so it holds layer ``i-1``'s o_proj/MLP and layer ``i``'s norm/QKV/RoPE/KV write/selection);
``tail`` is the LM head and sampling. Each segment: kernels, µs by class, attention bytes, TB/s.

Usage (GPU host, kit installed): python benchmarks/decode_profile.py --out-dir $OUT [--context 32768]
Writes ``decode_profile.json`` and ``decode_profile.md`` (the per-layer tables).
``--from-kernels DIR`` (any machine) rebuilds both from the ``replay-kernels-BACKEND.json`` a run saved in DIR,
with the same ``--size/--context/--batch`` as that run.
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sglang_server as S  # noqa: E402
import sglang_throughput as T  # noqa: E402

from sparrow_server.sparsity.registry import ScheduleRegistry  # noqa: E402
from sparrow_server.sparsity.schedule import kv_budget_tokens  # noqa: E402

# FlashInfer's decode kernels: CUDA-core (BatchDecode...), tensor-core (its prefill kernel, which SGLang runs for
# decode from a GQA group of 4, and which sparrow runs then too), and the merge of split-KV partial states.
ATTN_RE = re.compile(r"BatchDecode|BatchPrefillWithPagedKVCache|MergeStates", re.I)
SELECT_RE = re.compile(r"_score_kernel|_select_kernel|_landmark_kernel|_row_kernel")  # _row_kernel: fused variants


def kernel_class(name: str) -> str:
    if ATTN_RE.search(name):
        return "attention"
    if SELECT_RE.search(name):
        return "selection"
    return "other"


def replay_kernels(trace: dict) -> list[dict]:
    """Kernels (ts order) of the graph replay with the most kernels."""
    events = trace.get("traceEvents", [])
    launches = {e["args"].get("correlation") for e in events
                if e.get("name") == "cudaGraphLaunch" and "args" in e}
    by_corr: dict = {}
    for e in events:
        if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launches:
            by_corr.setdefault(e["args"]["correlation"], []).append(e)
    if not by_corr:
        return []
    best = max(by_corr.values(), key=len)
    return sorted(best, key=lambda e: e["ts"])


def segments(kernels: list[dict]) -> list[list[dict]]:
    """Split at attention: a segment ends with its attention kernels (decode + merge)."""
    segs, cur = [], []
    for i, k in enumerate(kernels):
        cur.append(k)
        is_attn = kernel_class(k["name"]) == "attention"
        nxt_attn = i + 1 < len(kernels) and kernel_class(kernels[i + 1]["name"]) == "attention"
        if is_attn and not nxt_attn:
            segs.append(cur)
            cur = []
    segs.append(cur)  # tail
    return segs


def layer_bytes(schedule, layer: int, batch: int, length: int, backend: str, cfg: dict) -> tuple[int, int]:
    """(KV bytes attention reads, landmark bytes selection reads) for one layer at ``length`` tokens."""
    h, d = cfg["num_key_value_heads"], cfg["head_dim"]
    per_tok = h * d * 2 * 2  # K and V, bf16
    if backend == "flashinfer" or layer in schedule.dense_layers:
        return batch * length * per_tok, 0
    toks = kv_budget_tokens(schedule, length, length - 1, 10**9)  # what the backend plans, no top-k cap
    return batch * toks * per_tok, batch * (length // 16) * h * d * 2


def summarize(kernels, backend, schedule, batch, length, cfg) -> dict:
    segs = segments(kernels)
    rows = []
    for i, seg in enumerate(segs):
        us = Counter()
        for k in seg:
            us[kernel_class(k["name"])] += k["dur"]
        is_layer = i < len(segs) - 1
        kv, lm = layer_bytes(schedule, i, batch, length, backend, cfg) if is_layer else (0, 0)
        rows.append({"segment": i if is_layer else "tail", "kernels": len(seg),
                     "n_attention": sum(kernel_class(k["name"]) == "attention" for k in seg),
                     "n_selection": sum(kernel_class(k["name"]) == "selection" for k in seg),
                     "us_total": round(sum(us.values()), 1), "us_attention": round(us["attention"], 1),
                     "us_selection": round(us["selection"], 1), "us_other": round(us["other"], 1),
                     "attn_bytes": kv, "attn_TBps": round(kv / us["attention"] / 1e6, 3) if us["attention"] else None,
                     "landmark_bytes": lm,
                     "select_TBps": round(lm / us["selection"] / 1e6, 3) if us["selection"] else None})
    span = (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) if kernels else 0
    names = Counter(k["name"][:90] for k in kernels)
    busy = sum(k["dur"] for k in kernels)
    return {"backend": backend, "kernels": len(kernels), "replay_span_us": round(span, 1),
            "kernel_busy_us": round(busy, 1), "gaps_us": round(span - busy, 1), "segments": rows,
            "kernel_names": [{"name": n, "count": c} for n, c in names.most_common()]}


def markdown(res: dict) -> str:
    out = []
    for b in res["backends"]:
        out.append(f"## {b['backend']}: {b['kernels']} kernels, replay span {b['replay_span_us']} µs, "
                   f"kernels busy {b['kernel_busy_us']} µs, gaps {b['gaps_us']} µs\n")
        out.append("| segment | kernels | µs | attention µs | selection µs | other µs | KV MB | attn TB/s | "
                   "landmark MB | select TB/s |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in b["segments"]:
            out.append(f"| {r['segment']} | {r['kernels']} | {r['us_total']} | {r['us_attention']} | "
                       f"{r['us_selection']} | {r['us_other']} | {r['attn_bytes'] / 1e6:.1f} | {r['attn_TBps']} | "
                       f"{r['landmark_bytes'] / 1e6:.1f} | {r['select_TBps']} |")
        out.append("")
    return "\n".join(out)


def profile_backend(backend, size, args, schedule, work_dir, out_dir, env_extra: dict | None = None) -> dict:
    """The profile of one server; ``env_extra`` goes to the server's environment (``replay_timing.py``'s hook)."""
    cfg = S.qwen3_config(size)
    model_dir = S.write_config(work_dir / size, cfg)
    log = out_dir / f"server-profile-{backend}.log"
    env = {"SPARROW_DEFAULT_SCHEDULE": schedule.name, "SPARROW_TOPK_CAP_TOKENS": str(max(schedule.budgets_tokens)),
           "SGLANG_TORCH_PROFILER_DIR": str(work_dir / f"prof-{backend}"), **(env_extra or {})}
    srv = S.Server(model_dir, T.SERVER_ARGS + args.server_args + ["--attention-backend", backend,
                                                                  "--context-length", str(args.context_length)],
                   log, port=args.port or S.free_port(), env=env)
    srv.start()
    try:
        rng = random.Random(0)
        S.generate(srv.base, T.random_ids(rng, 2, 512), 8)
        th = threading.Thread(target=S.generate, args=(srv.base, T.random_ids(rng, args.batch, args.context),
                                                       args.gen_len), daemon=True)
        off = srv.log_offset()
        th.start()
        t0 = time.time()
        while time.time() - t0 < 300:
            text = log.read_bytes()[off:].decode(errors="replace")
            if any(int(m.group(1)) == args.batch for m in T.DEC_RE.finditer(text)):
                break
            time.sleep(0.5)
        prof_dir = work_dir / f"prof-{backend}"
        body = json.dumps({"output_dir": str(prof_dir), "num_steps": args.steps, "activities": ["CPU", "GPU"]})
        urllib.request.urlopen(urllib.request.Request(srv.base + "/start_profile", data=body.encode(),
                                                      headers={"Content-Type": "application/json"}), timeout=120)
        t0 = time.time()
        traces = []
        while time.time() - t0 < 120 and not traces:
            time.sleep(2)
            traces = sorted(prof_dir.rglob("*.json*")) if prof_dir.exists() else []
        time.sleep(3)  # let the writer finish
        th.join(timeout=600)
    finally:
        srv.stop()
    if not traces:
        raise RuntimeError(f"{backend}: no trace written under {prof_dir}")
    path = traces[-1]
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    kernels = replay_kernels(json.loads(raw))
    (out_dir / f"replay-kernels-{backend}.json").write_text(json.dumps(
        [{"name": k["name"], "ts": k["ts"], "dur": k["dur"]} for k in kernels]))
    return summarize(kernels, backend, schedule, args.batch, args.context + 64, cfg)  # ~ the profiled steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="qwen3-1.7b")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--context-length", type=int, default=40960)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=400)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--schedule-suffix", default="0.86")
    ap.add_argument("--backends", default="flashinfer,sparrow")
    ap.add_argument("--server-args", default="", help="extra SGLang flags, same for both backends")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--port", type=int, default=0, help="the server's port (0: one the OS finds free, so that runs "
                                                       "on the cards of one host do not share one)")
    ap.add_argument("--from-kernels", default=None, help="rebuild the tables from a run's saved replay kernels")
    args = ap.parse_args()
    args.server_args = args.server_args.split()
    out_dir = Path(args.from_kernels or args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    schedule = ScheduleRegistry().get(f"{args.size}-{args.schedule_suffix}")
    res = {"command": " ".join(sys.argv), "size": args.size, "context": args.context, "batch": args.batch,
           "context_length": args.context_length, "schedule": schedule.name, "backends": []}
    if args.from_kernels:
        res["backends"] = [summarize(json.loads((out_dir / f"replay-kernels-{b}.json").read_text()), b, schedule,
                                     args.batch, args.context + 64, S.qwen3_config(args.size))
                           for b in args.backends.split(",")]
    else:
        work_dir = Path(tempfile.mkdtemp(prefix="sparrow-prof-"))
        for backend in args.backends.split(","):
            try:
                res["backends"].append(profile_backend(backend, args.size, args, schedule, work_dir, out_dir))
            except Exception as e:  # keep the other backend's table
                print(f"[{backend}] profile failed: {e!r}", flush=True)
            (out_dir / "decode_profile.json").write_text(json.dumps(res, indent=1))  # kept if the next one hangs
    (out_dir / "decode_profile.json").write_text(json.dumps(res, indent=1))
    (out_dir / "decode_profile.md").write_text(markdown(res))
    print(markdown(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
