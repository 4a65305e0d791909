"""One layer of sparse decode at Qwen3-1.7B shapes (8 KV heads, G=2, D=128), CUDA-graph timed.

Times each piece of the backend's per-layer work (landmark scoring with the decode landmark update,
exact top-k + index writing, FlashInfer decode over per-head page lists on SGLang's token-major pool)
against dense FlashInfer decode and a device-to-device copy (the achievable bandwidth), at each
workload context and server context length (Pcap), and reports bytes and bandwidth.
Usage (GPU host): python benchmarks/sparse_kernel_bench.py --out results.json [--batch 16 --contexts 16384,32768]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
sys.path[:0] = [_TESTS, os.path.join(_TESTS, "gpu")]  # helpers.sparse_case, _sparse_runner


def graph_us(fn, reps: int = 20, iters: int = 30) -> float:
    """Median microseconds per call of ``fn``, replaying a CUDA graph of ``reps`` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1000 / reps)
    ts.sort()
    return ts[len(ts) // 2]


def bench_case(b: int, ctx: int, budget_pages: int, max_context: int, ws, copy_tbps: float) -> dict:
    """One layer at ``ctx`` tokens x ``b`` requests on a server whose context length is ``max_context``."""
    import flashinfer

    from _sparse_runner import SparseLayer
    from helpers.sparse_case import fixed_budget_schedule, make_case, plan_for
    from sparrow_server.kernels import sparse_decode as K

    ps, h, g, d = 16, 8, 2, 128
    case = make_case([ctx] * b, num_kv_heads=h, group=g, head_dim=d, seed=0)
    pcap = math.ceil(max_context / ps)
    lm = torch.zeros(case.k_buf.shape[0] // ps, h, d, dtype=torch.bfloat16, device="cuda")
    K.update_landmarks(case.k_buf, torch.arange(case.k_buf.shape[0], device="cuda"), lm, ps, only_full=True)
    plan = plan_for(case, [fixed_budget_schedule(budget_pages)] * b, topk_cap_pages=budget_pages)
    layer = SparseLayer(case, plan, lm, pcap, ws)
    scale = 1 / math.sqrt(d)
    loc = case.req_to_token[1:, ctx - 1].long()  # a slot that completes a page: the landmark update runs
    layer(scale, loc)
    qh = case.q.view(-1, g, d)
    res = {"score_us": graph_us(lambda: layer.score(loc)), "select_and_write_us": graph_us(layer.select_write),
           "sparse_attn_us": graph_us(lambda: layer.wrapper.run(qh, layer.kv, out=layer.out)),
           "sparse_layer_total_us": graph_us(lambda: layer(scale, loc))}
    dw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    n_pages = ctx // ps
    dense_idx = (case.req_to_token[1:, ::ps][:, :n_pages] // ps).reshape(-1).contiguous()
    dw.plan(torch.arange(b + 1, dtype=torch.int32) * n_pages, dense_idx, torch.full((b,), ps, dtype=torch.int32),
            h * g, h, d, ps, data_type=torch.bfloat16, q_data_type=torch.bfloat16)
    kv_pages = (case.k_buf.view(-1, ps, h, d), case.v_buf.view(-1, ps, h, d))
    dout = torch.empty_like(case.q)
    res["dense_attn_us"] = graph_us(lambda: dw.run(case.q, kv_pages, out=dout))
    out = {k: round(v, 1) for k, v in res.items()}
    kv_sel = b * h * int(plan.count[0]) * ps * d * 2 * 2
    lm_bytes = b * (ctx // ps) * h * d * 2
    kv_dense = b * ctx * h * d * 2 * 2
    tbps = lambda nbytes, us: round(nbytes / us / 1e6, 3)
    out.update({
        "batch": b, "context": ctx, "server_context_length": max_context, "pcap": pcap,
        "budget_pages": int(plan.count[0]), "bytes_selected_kv": kv_sel, "bytes_landmarks": lm_bytes,
        "bytes_dense_kv": kv_dense, "dense_attn_TBps": tbps(kv_dense, res["dense_attn_us"]),
        "sparse_attn_TBps": tbps(kv_sel, res["sparse_attn_us"]), "score_TBps": tbps(lm_bytes, res["score_us"]),
        "selection_us": round(res["score_us"] + res["select_and_write_us"], 1),
        "sparse_layer_TBps_on_required_bytes": tbps(kv_sel + lm_bytes, res["sparse_layer_total_us"]),
        "layer_speedup_dense_over_sparse": round(res["dense_attn_us"] / res["sparse_layer_total_us"], 2),
    })
    out["selection_floor_us"] = round(lm_bytes / (copy_tbps * 1e6), 1)
    out["selection_over_floor"] = round(out["selection_us"] / out["selection_floor_us"], 2)
    out["sparse_attn_over_copy"] = round(out["sparse_attn_TBps"] / copy_tbps, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--contexts", default="16384,32768")
    ap.add_argument("--budget-pages", type=int, default=256)
    ap.add_argument("--server-contexts", default="16896,40960", help="server context lengths (set Pcap)")
    ap.add_argument("--out", default="sparse_kernel_bench.json")
    a = ap.parse_args()
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = graph_us(lambda: dst.copy_(src), reps=5, iters=10)
    copy_tbps = round(2 * src.numel() / copy_us / 1e6, 3)
    del src, dst
    result = {"gpu": torch.cuda.get_device_name(), "copy_TBps": copy_tbps, "num_kv_heads": 8, "group": 2,
              "head_dim": 128, "landmark_dtype": "bfloat16", "cases": []}
    for ctx in (int(c) for c in a.contexts.split(",")):
        for max_ctx in (int(c) for c in a.server_contexts.split(",")):
            if max_ctx < ctx:
                continue
            case = bench_case(a.batch, ctx, a.budget_pages, max_ctx, ws, copy_tbps)
            print(json.dumps(case), flush=True)
            result["cases"].append(case)
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
