"""One layer of sparse decode at Qwen3-1.7B shapes (8 KV heads, G=2, D=128), CUDA-graph timed.

Times each piece of the backend's per-layer work (landmark scoring, top-k, index writing,
FlashInfer decode over per-head page lists on SGLang's token-major pool) against dense FlashInfer
decode and a device-to-device copy (the achievable bandwidth), and reports bytes and bandwidth.
Usage (GPU host): python benchmarks/sparse_kernel_bench.py --out results.json [--batch 16 --context 32768]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))


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


def main() -> int:
    import flashinfer

    from _sparse_runner import SparseLayer
    from _sparse_setup import fixed_budget_schedule, make_case, plan_for
    from sparrow_server.kernels import sparse_decode as K

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--budget-pages", type=int, default=256)
    ap.add_argument("--max-context", type=int, default=33280, help="server context length (sets Pcap)")
    ap.add_argument("--out", default="sparse_kernel_bench.json")
    a = ap.parse_args()
    b, ctx, ps, h, g, d = a.batch, a.context, 16, 8, 2, 128
    case = make_case([ctx] * b, num_kv_heads=h, group=g, head_dim=d, seed=0)
    pcap = math.ceil(a.max_context / ps)
    lm = torch.zeros(case.k_buf.shape[0] // ps, h, d, dtype=torch.bfloat16, device="cuda")
    K.update_landmarks(case.k_buf, torch.arange(case.k_buf.shape[0], device="cuda"), lm, ps, only_full=True)
    s = fixed_budget_schedule(a.budget_pages)
    plan = plan_for(case, [s] * b, topk_cap_pages=a.budget_pages - 3)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    layer = SparseLayer(case, plan, lm, a.budget_pages - 3, pcap, ws)
    layer_unsorted = SparseLayer(case, plan, lm, a.budget_pages - 3, pcap, ws, sorted_topk=False)
    scale = 1 / math.sqrt(d)
    layer(scale)
    top = layer.select()
    qh = case.q.view(-1, g, d)
    res = {}
    res["score_us"] = graph_us(layer.score)
    res["topk_sorted_us"] = graph_us(lambda: torch.topk(layer.scores, layer.topk, dim=1, sorted=True))
    res["top_pages_us"] = graph_us(layer.select)
    res["topk_unsorted_us"] = graph_us(layer_unsorted.select)
    res["write_indices_us"] = graph_us(lambda: layer.write(top))
    res["select_and_write_us"] = graph_us(layer.select_write)
    res["sparse_attn_us"] = graph_us(lambda: layer.wrapper.run(qh, layer.kv, out=layer.out))
    res["sparse_layer_total_us"] = graph_us(lambda: layer(scale))
    res["landmark_update_decode_us"] = graph_us(
        lambda: K.update_landmarks(case.k_buf, case.req_to_token[1:, ctx - 1].long(), lm, ps, only_full=False))
    # dense FlashInfer decode, stock layout (all heads per row, page 16 view of the same pool)
    dw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    n_pages = ctx // ps
    dense_idx = (case.req_to_token[1:, ::ps][:, :n_pages] // ps).reshape(-1).contiguous()
    dw.plan(torch.arange(b + 1, dtype=torch.int32) * n_pages, dense_idx, torch.full((b,), ps, dtype=torch.int32),
            h * g, h, d, ps, data_type=torch.bfloat16, q_data_type=torch.bfloat16)
    kv_pages = (case.k_buf.view(-1, ps, h, d), case.v_buf.view(-1, ps, h, d))
    dout = torch.empty_like(case.q)
    res["dense_attn_us"] = graph_us(lambda: dw.run(case.q, kv_pages, out=dout))
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = graph_us(lambda: dst.copy_(src), reps=5, iters=10)
    out = {k: round(v, 1) for k, v in res.items()}
    kv_sel = b * h * a.budget_pages * ps * d * 2 * 2
    lm_bytes = b * (ctx // ps) * h * d * 2
    kv_dense = b * ctx * h * d * 2 * 2
    tbps = lambda nbytes, us: round(nbytes / us / 1e6, 3)
    out.update({
        "gpu": torch.cuda.get_device_name(), "batch": b, "context": ctx, "budget_pages": a.budget_pages,
        "num_kv_heads": h, "group": g, "head_dim": d, "landmark_dtype": "bfloat16",
        "bytes_selected_kv": kv_sel, "bytes_landmarks": lm_bytes, "bytes_dense_kv": kv_dense,
        "copy_TBps": tbps(2 * src.numel(), copy_us),
        "dense_attn_TBps": tbps(kv_dense, res["dense_attn_us"]),
        "sparse_attn_TBps": tbps(kv_sel, res["sparse_attn_us"]),
        "score_TBps": tbps(lm_bytes, res["score_us"]),
        "selection_us": round(res["score_us"] + res["select_and_write_us"], 1),
        "selection_topk_path_us": round(res["score_us"] + res["topk_sorted_us"] + res["write_indices_us"], 1),
        "sparse_layer_TBps_on_required_bytes": tbps(kv_sel + lm_bytes, res["sparse_layer_total_us"]),
        "layer_speedup_dense_over_sparse": round(res["dense_attn_us"] / res["sparse_layer_total_us"], 2),
    })
    out["selection_floor_us"] = round(lm_bytes / (out["copy_TBps"] * 1e6), 1)
    out["selection_over_floor"] = round(out["selection_us"] / out["selection_floor_us"], 2)
    print(json.dumps(out, indent=1))
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
