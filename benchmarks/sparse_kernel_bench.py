"""One layer of sparse decode at Qwen3 shapes (8 KV heads, D=128; a GQA group of 2 as 1.7B or 4 as 4B / 8B),
CUDA-graph timed.

Times each piece of the backend's per-layer work (landmark scoring with the decode landmark update,
exact top-k + index writing, FlashInfer decode over per-head page lists on SGLang's token-major pool)
against dense FlashInfer decode and a device-to-device copy (the achievable bandwidth), at each
workload context and server context length (Pcap), for each selection variant of
``sparse_decode`` (``SELECT_VARIANTS``; the index buffers of all variants are compared: they must
be equal), and reports bytes and bandwidth. Selection (score + top-k + index write, as the backend calls it:
``score_and_select``, one launch for a fused variant) is set against
its roofline: one read of the layer's landmarks for the batch at the copy bandwidth of this run
(issue 24's target: at most 1.3x at 32K + 256 tokens, batch 16).
Usage (GPU host): python benchmarks/sparse_kernel_bench.py --out results.json
  [--batch 16 --contexts 16384,32768,33024,40960 --server-contexts 40960 --variants v1,even,hist]
  [--group 4 --kernels cuda-cores,tensor-cores]: attention on both FlashInfer decode kernels (sparse and dense
  each; the default is the one SGLang picks at that group), each kernel's sparse/dense bandwidth ratio.
  [--kernels cuda-cores,tensor-cores,tensor-cores:nosplit,tensor-cores:split=64]: the sparse decode also at the
  tensor-core kernel's other KV splits (no split: the one a CUDA graph can hold, as deterministic inference plans it;
  a fixed number of pages a chunk), each against the dense decode on the same kernel at FlashInfer's own split.
  [--kernels cuda-cores,tensor-cores:parts=4]: each row's pages as 4 sub-rows, each attended unsplit on tensor
  cores, their partial states merged by ``kernels.merge``.
  [--plan eager]: the sparse decode planned eagerly, as this bench did before call 38; by default FlashInfer plans
  it as a server's CUDA graph does (``SparseLayer(graph=True)``: on CUDA cores the partition-KV kernel even where
  the split gives one chunk a row), and reports each kernel's largest difference from the eager default's output.
  [--placement contiguous]: each request's pages in order in the pool (a fresh server's prefill) instead of
  shuffled across it (default; the same keys and queries either way); [--placement interleaved]: page by page across
  the batch (a rollout's pages, allocated as its requests decode together).
  On one card the graph plan reads as a served replay does (32 x 32K: 142.6 bench, 141.1 served, µs a layer;
  ``benchmarks/results/speed/call39/``); the sparse decode at large batches varies from card to card (141-163 µs
  there), so compare kernels on one card and the bench with the server only on the same card.
  A fixed split (``tensor-cores:split=N``) that outgrows the graph plan's work list is recorded as an error there.
  A server replays a batch at SGLang's next captured size (33-34 requests at 40, the rest one-page rows): bench
  that size to see the plan it runs.
  Each case also times read-only passes over the landmark rows the scoring reads (``landmark_reads``: gathered
  through ``req_to_token`` as the scoring finds them, and as many from one contiguous run; ``landmark_read.py``), the
  scoring's floor for where the pages lie.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

import torch

PS, H, D = 16, 8, 128  # Qwen3: page 16, 8 KV heads, head dim 128 (query heads per KV head: --group)
KERNELS = {"cuda-cores": False, "tensor-cores": True}  # FlashInfer decode kernels (use_tensor_cores)
TENSOR_CORE_GROUP = 4  # SGLang 0.5.17 decodes bf16 on tensor cores from this GQA group


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


def copy_bandwidth_tbps() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second (TB/s)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_us(lambda: dst.copy_(src), reps=5, iters=10)
    return round(2 * src.numel() / us / 1e6, 3)


def _schedule(name: str, budget_pages: int):
    """The named schedule (the server's plan at each context), or a fixed budget when given."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import fixed_budget_schedule
    from sparrow_server.sparsity.registry import ScheduleRegistry

    return fixed_budget_schedule(budget_pages) if budget_pages else ScheduleRegistry().get(name)


RUNS_PERIOD_PAGES = 64  # the wave's period: a head's top-k takes a run of pages around each crest


def shape_for_runs(case, amplitude: float, seed: int = 0) -> None:
    """Make the top-k pick runs of neighbouring pages, as the dummy-weight server's does (call 39: 87% of its picks
    beside another, 37% for uniform picks): every key gains ``amplitude`` x a slow wave along its position on dim 0,
    each (request, KV head) at its own phase, and every query's dim 0 is 4, so a page's score follows the wave (plus
    the random keys' noise, which breaks the runs up)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    b, length = len(case.lengths), int(case.lengths.max())
    phase = (torch.rand(b, 1, H, generator=g) * 2 * math.pi).to(case.k_buf.device)
    pos = torch.arange(length, device=case.k_buf.device, dtype=torch.float32)[None, :, None]
    wave = amplitude * torch.cos(2 * math.pi * pos / (PS * RUNS_PERIOD_PAGES) + phase)
    slots = case.req_to_token[1:b + 1, :length].long().reshape(-1)
    case.k_buf[slots, :, 0] += wave.reshape(-1, H).to(case.k_buf.dtype)
    case.q[:, :, 0] = 4.0


def picks_adjacency(layer) -> float:
    """The share of the selected pages (top-k, sink and recent) whose neighbour in the pool (page id +- 1) the same
    row selected too: how much of the sparse read is contiguous."""
    import numpy as np

    pages = layer.indices.cpu().numpy().astype(np.int64) // layer.h // PS
    indptr, beside, total = layer.plan.row_indptr, 0, 0
    for r in range(len(indptr) - 1):
        row = np.unique(pages[int(indptr[r]):int(indptr[r + 1])])
        beside += int(np.sum(np.isin(row - 1, row) | np.isin(row + 1, row)))
        total += len(row)
    return round(beside / max(total, 1), 3)


def build_pool(b: int, ctx: int, group: int, placement: str = "random", runs_amplitude: float = 0.0,
               landmark_dtype: str = "bfloat16"):
    """A pool of ``b`` requests at ``ctx`` tokens and its landmarks, stored in ``landmark_dtype``: (case, landmarks,
    their scales where float8 else None). Shorter contexts use a prefix of each request's pages: one pool for every
    case, built once; ``placement``: ``make_case``'s; a ``runs_amplitude``: keys and queries ``shape_for_runs``, else
    random."""
    from sparrow_server.kernels import sparse_decode as K
    from sparrow_server.kernels.reference import zero_landmarks
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import make_case

    case = make_case([ctx] * b, num_kv_heads=H, group=group, head_dim=D, seed=0, placement=placement)
    if runs_amplitude:
        shape_for_runs(case, runs_amplitude)
    lm, scales = zero_landmarks(case.k_buf.shape[0] // PS, H, D, getattr(torch, landmark_dtype), "cuda")
    K.update_landmarks(case.k_buf, torch.arange(case.k_buf.shape[0], device="cuda"), lm, PS, only_full=True,
                       landmark_scales=scales)
    return case, lm, scales


def kernel_split(name: str):
    """The sparse decode's FlashInfer kernel and KV split named ``name``: a KERNELS key at FlashInfer's own split,
    or ``tensor-cores:nosplit`` / ``tensor-cores:split=N`` (N pages a chunk; FlashInfer fixes a split on tensor
    cores only), or ``tensor-cores:parts=N`` (each row as N sub-rows, unsplit, merged: ``kernel_parts``)."""
    from sparrow_server.sglang_plugin.scheduler.determinism import NO_SPLIT, DecodeSplit, decode_split

    kernel, _, split = name.partition(":")
    if kernel not in KERNELS or (split and kernel != "tensor-cores"):
        raise ValueError(f"kernel {name!r}: one of {sorted(KERNELS)}, or tensor-cores:nosplit / tensor-cores:split=N "
                         f"/ tensor-cores:parts=N")
    if not split:  # the server's plan on that kernel outside deterministic inference
        return decode_split(False, True, None, PS, tensor_cores=KERNELS[kernel])
    if split == "nosplit" or split.startswith("parts="):
        kernel_parts(name)
        return NO_SPLIT  # deterministic inference's plan under CUDA graphs; sub-rows each unsplit
    pages = split.removeprefix("split=")
    if pages == split or not pages.isdigit() or int(pages) < 1:
        raise ValueError(f"kernel {name!r}: split=N with N >= 1 pages a chunk, or nosplit")
    return DecodeSplit(use_tensor_cores=True, fixed_split_size=int(pages), disable_split_kv=False)


def kernel_parts(name: str) -> int:
    """Sub-rows a row of the kernel named ``name``: 1 but for ``tensor-cores:parts=N`` (N >= 2)."""
    _, _, split = name.partition(":")
    if not split.startswith("parts="):
        return 1
    parts = split.removeprefix("parts=")
    if not parts.isdigit() or int(parts) < 2:
        raise ValueError(f"kernel {name!r}: tensor-cores:parts=N with N >= 2 sub-rows a row")
    return int(parts)


def _build_layer(pool, ctx: int, schedule, max_context: int, ws, split=None, parts: int = 1, graph: bool = False):
    """The pool's requests at ``ctx`` tokens: the case, this step's plan and the layer (``split``: a
    ``kernel_split``; the server's own plan outside deterministic inference at a group under 4 unless given;
    ``parts``: a ``kernel_parts``; ``graph``: FlashInfer's plan as under a CUDA graph, ``SparseLayer``'s)."""
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import SparseLayer, plan_for

    full, lm, scales = pool
    case = dataclasses.replace(full, lengths=torch.full_like(full.lengths, ctx))
    plan = plan_for(case, [schedule] * len(case.lengths), topk_cap_pages=max(schedule.budgets_tokens) // PS)
    split = kernel_split("cuda-cores") if split is None else split
    return case, plan, SparseLayer(case, plan, lm, math.ceil(max_context / PS), ws, split=split, parts=parts,
                                   graph=graph, landmark_scales=scales)


def time_variant(layer, variant: str, scale: float, loc) -> tuple[dict, torch.Tensor]:
    """Selection timings of one variant, and the index buffer it writes."""
    layer.variant = variant
    layer.indices.zero_()
    layer(scale, loc)
    indices = layer.indices.clone()
    # selection_us: the backend's one call (score_and_select: both launches, or a fused variant's one); score_us
    # and select_and_write_us each half alone (a fused variant's scoring without its top-k, and its top-k alone)
    res = {"score_us": graph_us(lambda: layer.score(loc)), "select_and_write_us": graph_us(layer.select_write),
           "selection_us": graph_us(lambda: layer.select(loc)), "select_without_topk_us": without_topk_us(layer),
           "sparse_layer_total_us": graph_us(lambda: layer(scale, loc))}
    return {k: round(v, 1) for k, v in res.items()}, indices


def without_topk_us(layer) -> float:
    """``select_and_write`` with every row's k zeroed: its launches and the index write of as many pages (each
    row's budget written as reserved pages), no radix select; the rest of ``select_and_write_us`` is the select."""
    k = layer.fields["k"]
    saved = k.clone()
    k.zero_()
    try:
        return graph_us(layer.select_write)
    finally:
        k.copy_(saved)


def dense_attn_us(case, b: int, ctx: int, ws, tensor_cores: bool) -> float:
    import flashinfer

    dw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2", use_tensor_cores=tensor_cores)
    n_pages = ctx // PS
    dense_idx = (case.req_to_token[1:, ::PS][:, :n_pages] // PS).reshape(-1).contiguous()
    dw.plan(torch.arange(b + 1, dtype=torch.int32) * n_pages, dense_idx, torch.full((b,), PS, dtype=torch.int32),
            case.q.shape[1], H, D, PS, data_type=torch.bfloat16, q_data_type=torch.bfloat16)
    kv_pages = (case.k_buf.view(-1, PS, H, D), case.v_buf.view(-1, PS, H, D))
    dout = torch.empty_like(case.q)
    return graph_us(lambda: dw.run(case.q, kv_pages, out=dout))


def attention_us(pool, ctx: int, schedule, max_context: int, ws, name: str,
                 graph: bool = False) -> tuple[float, float, float | None]:
    """(sparse us, dense us, sub-rows or a graph plan: largest |difference| from the default kernel's eager output)
    of FlashInfer decode of one layer on the kernel ``name``: the sparse one over the pages the default selection
    variant picks (planned as under a CUDA graph with ``graph``), the dense one on the same kernel at FlashInfer's
    own split."""
    # before the kernel's first call (a fresh host builds FlashInfer's module for a plan here): a cut run says which
    # (call 49: four tensor-core plans printed nothing in 326 s)
    print(f"[bench] context {ctx}, server {max_context}: attention on {name}", file=sys.stderr, flush=True)
    split, parts = kernel_split(name), kernel_parts(name)
    case, _, layer = _build_layer(pool, ctx, schedule, max_context, ws, split, parts, graph)
    layer(1 / math.sqrt(D), case.req_to_token[1:, ctx - 1].long())
    diff = None
    if parts > 1 or graph:
        want = _build_layer(pool, ctx, schedule, max_context, ws)[2]
        want.indices.copy_(layer.indices)
        diff = float((layer.attend().float() - want.attend().float()).abs().max())
    dense_us = dense_attn_us(case, len(case.lengths), ctx, ws, split.use_tensor_cores)
    return graph_us(lambda: layer.attend(out=layer.out)), dense_us, diff


def bench_case(pool, ctx: int, schedule, max_context: int, ws, copy_tbps: float, variants, kernels,
               graph: bool = True) -> dict:
    """One layer at ``ctx`` tokens x the pool's requests on a server whose context length is ``max_context``."""
    case, plan, layer = _build_layer(pool, ctx, schedule, max_context, ws)
    b = len(case.lengths)
    scale = 1 / math.sqrt(D)
    loc = case.req_to_token[1:, ctx - 1].long()  # a slot that completes a page: the landmark update runs
    tbps = lambda nbytes, us: round(nbytes / us / 1e6, 3)
    lm_bytes = b * (ctx // PS) * H * (D * pool[1].element_size() + (0 if pool[2] is None else 4))  # scales too
    landmark_read_us = lm_bytes / (copy_tbps * 1e6)
    out = {"batch": b, "context": ctx, "server_context_length": max_context, "pcap": layer.scores.shape[1],
           "budget_pages": int(plan.count[0]), "candidates": int(plan.cand_hi[0] - plan.cand_lo[0]),
           "bytes_landmarks": lm_bytes, "landmark_read_us_at_copy_bw": round(landmark_read_us, 1), "variants": {}}
    first = None
    for v in variants:
        try:
            res, indices = time_variant(layer, v, scale, loc)
        except Exception as exc:  # e.g. a Triton without some op: record it, time the other variants
            out["variants"][v] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            continue
        if first is None:
            first, out["indices_compared_with"] = indices, v
            out["selected_pages_adjacency"] = picks_adjacency(layer)
        res.update({"same_indices": bool(torch.equal(indices, first)), "score_TBps": tbps(lm_bytes, res["score_us"]),
                    "selection_over_landmark_read": round(res["selection_us"] / landmark_read_us, 2)})
        out["variants"][v] = res
    try:  # the scoring's floor: read-only passes over the same landmark rows (landmark_read.py)
        from landmark_read import timed_reads

        out["landmark_reads"] = timed_reads(layer, graph_us)
    except Exception as exc:
        out["landmark_reads"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    kv_sel = b * H * int(plan.count[0]) * PS * D * 2 * 2
    kv_dense = b * ctx * H * D * 2 * 2
    out.update({"bytes_selected_kv": kv_sel, "bytes_dense_kv": kv_dense, "attention": {}})
    for name in kernels:
        extra = {}
        try:  # a JIT build the host cannot make: recorded, the other kernels still timed
            sparse_us, dense_us, diff = attention_us(pool, ctx, schedule, max_context, ws, name, graph)
        except Exception as exc:
            out["attention"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            continue
        if diff is not None:
            extra = {"max_abs_diff_from_default_kernel": round(diff, 5)}
        out["attention"][name] = {**extra,
            "sparse_attn_us": round(sparse_us, 1), "dense_attn_us": round(dense_us, 1),
            "sparse_attn_TBps": tbps(kv_sel, sparse_us), "dense_attn_TBps": tbps(kv_dense, dense_us),
            "sparse_attn_over_copy": round(tbps(kv_sel, sparse_us) / copy_tbps, 2),
            "sparse_over_dense_bandwidth": round(dense_us * kv_sel / (sparse_us * kv_dense), 3)}
    return out


def attention_summary(cases: list) -> str:
    """One line per (context, server context, kernel): sparse and dense FlashInfer decode bandwidth."""
    lines = [f"{'context':>8} {'server':>7} {'kernel':>24} {'sparse':>7} {'TB/s':>6} {'dense':>7} {'TB/s':>6} "
             f"{'ratio':>6}  (us; ratio = sparse / dense bandwidth)"]
    for c in cases:
        for k, r in c["attention"].items():
            if "error" in r:
                lines.append(f"{c['context']:>8} {c['server_context_length']:>7} {k:>24} ERROR {r['error'][:200]}")
                continue
            lines.append(f"{c['context']:>8} {c['server_context_length']:>7} {k:>24} {r['sparse_attn_us']:>7} "
                         f"{r['sparse_attn_TBps']:>6} {r['dense_attn_us']:>7} {r['dense_attn_TBps']:>6} "
                         f"{r['sparse_over_dense_bandwidth']:>6}")
    return "\n".join(lines)


def summary(cases: list, target: float) -> str:
    """One line per (context, server context, variant): selection against the landmark-read roofline."""
    lines = [(f"{'context':>8} {'server':>7} {'cands':>6} {'variant':>8} {'score':>7} {'top-k':>7} {'no sel':>7} "
              f"{'select':>7} {'lm read':>7} {'ratio':>6}  (us; top-k = select + write, 'no sel' that with k = 0; "
              f"ratio = select / lm read, target <= {target})")]
    for c in cases:
        for v, r in c["variants"].items():
            if "error" in r:
                lines.append(f"{c['context']:>8} {c['server_context_length']:>7} {c['candidates']:>6} {v:>8} "
                             f"ERROR {r['error'][:200]}")
                continue
            flag = "" if r["selection_over_landmark_read"] <= target else "  over target"
            lines.append(f"{c['context']:>8} {c['server_context_length']:>7} {c['candidates']:>6} {v:>8} "
                         f"{r['score_us']:>7} {r['select_and_write_us']:>7} {r['select_without_topk_us']:>7} "
                         f"{r['selection_us']:>7} "
                         f"{c['landmark_read_us_at_copy_bw']:>7} {r['selection_over_landmark_read']:>6}{flag}")
    return "\n".join(lines)


def main() -> int:
    from sparrow_server.kernels import LANDMARK_STORAGE_DTYPES
    from sparrow_server.kernels import sparse_decode as K
    from sparrow_server.sglang_plugin.config import DEFAULT_LANDMARK_DTYPE
    from sparrow_server.sglang_plugin.scheduler.standalone_layer import PLACEMENTS

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--contexts", default="16384,32768,33024,40960")
    ap.add_argument("--schedule", default="qwen3-1.7b-0.86", help="budgets at each context (the server's plan)")
    ap.add_argument("--budget-pages", type=int, default=0, help="a fixed budget instead of --schedule's")
    ap.add_argument("--server-contexts", default="40960", help="server context lengths (set Pcap)")
    ap.add_argument("--variants", default=",".join(K.SELECT_VARIANTS), help="sparse_decode.SELECT_VARIANTS to time")
    ap.add_argument("--group", type=int, default=2, help="query heads per KV head (Qwen3-1.7B 2; 4B, 8B 4)")
    ap.add_argument("--kernels", default=None,
                    help=f"FlashInfer decode kernels to time attention on, of {sorted(KERNELS)} (default: the one "
                         f"SGLang picks at --group: tensor cores from {TENSOR_CORE_GROUP}), or tensor-cores:nosplit, "
                         f"tensor-cores:split=N (N pages a KV chunk), tensor-cores:parts=N (N sub-rows a row, merged)")
    ap.add_argument("--target", type=float, default=1.3, help="selection / landmark read at copy bandwidth")
    ap.add_argument("--placement", choices=PLACEMENTS, default=PLACEMENTS[0],
                    help="the requests' pages in the pool: shuffled (a server after churn), each request's in "
                         "order (a fresh server's prefill) or page by page across the batch (a rollout's decode)")
    ap.add_argument("--runs-amplitude", type=float, default=0.0,
                    help="keys and queries whose top-k picks runs of neighbouring pages (shape_for_runs; 2.5 picks "
                         "as many neighbours at 16K as the dummy-weight server, call 39), instead of random ones")
    ap.add_argument("--plan", choices=("graph", "eager"), default="graph",
                    help="FlashInfer's sparse decode plan: as a server's CUDA graph plans it (default), or eager "
                         "(the plan before call 38: the CUDA-core kernel unsplit where the split gives a chunk a row)")
    ap.add_argument("--landmark-dtype", choices=LANDMARK_STORAGE_DTYPES, default=DEFAULT_LANDMARK_DTYPE,
                    help="the landmarks' storage dtype (a server's SPARROW_LANDMARK_DTYPE; float8_e4m3fn: with a "
                         "scale per page and KV head)")
    ap.add_argument("--out", default="sparse_kernel_bench.json")
    a = ap.parse_args()
    variants = a.variants.split(",")
    bad = sorted(set(variants) - set(K.SELECT_VARIANTS))
    if bad:
        ap.error(f"--variants {bad}: not in {K.SELECT_VARIANTS}")
    kernels = (a.kernels or ("tensor-cores" if a.group >= TENSOR_CORE_GROUP else "cuda-cores")).split(",")
    if a.group < 1:
        ap.error(f"--group {a.group}: a group >= 1")
    for name in kernels:
        try:
            kernel_split(name)
        except ValueError as exc:
            ap.error(f"--kernels: {exc}")
    schedule = _schedule(a.schedule, a.budget_pages)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    copy_tbps = copy_bandwidth_tbps()
    result = {"gpu": torch.cuda.get_device_name(), "copy_TBps": copy_tbps, "num_kv_heads": H, "group": a.group,
              "head_dim": D, "landmark_dtype": a.landmark_dtype, "schedule": schedule.name,
              "default_variant": K.DEFAULT_SELECT_VARIANT, "attention_plan": a.plan,
              "page_placement": a.placement, "runs_amplitude": a.runs_amplitude, "cases": []}
    contexts = [int(c) for c in a.contexts.split(",")]
    pool = build_pool(a.batch, max(contexts), a.group, a.placement, a.runs_amplitude, a.landmark_dtype)
    for ctx in contexts:
        for max_ctx in (int(c) for c in a.server_contexts.split(",")):
            if max_ctx < ctx:
                continue
            case = bench_case(pool, ctx, schedule, max_ctx, ws, copy_tbps, variants, kernels, a.plan == "graph")
            print(json.dumps(case), flush=True)
            result["cases"].append(case)
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['gpu']}: copy {copy_tbps} TB/s\n{summary(result['cases'], a.target)}\n"
          f"{attention_summary(result['cases'])}", flush=True)
    runs = [r for c in result["cases"] for r in c["variants"].values()]
    if any("error" in r for c in result["cases"] for r in c["attention"].values()):
        print("ERROR: a kernel failed (its 'error' in the JSON)", flush=True)
        return 1
    if any("error" in r for r in runs):
        print("ERROR: a variant failed (its 'error' in the JSON)", flush=True)
    if not all(r.get("same_indices", True) for r in runs):
        print("ERROR: the variants wrote different index buffers", flush=True)
    return 0 if all("error" not in r and r["same_indices"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
