"""Where a fused selection launch's time goes, phase by phase, inside each row program (GPU host).

The fused row kernel (``sparse_decode._row_kernel`` with SELECT, one program per (request, KV head) row, one row
per SM at batch 16) is mirrored here from the product's own building blocks (``score_row``, ``write_reserved``,
``radix``'s histogram rounds and index write, as ``topk._topk_in_registers`` composes them with the early exit and
the packed steps), with each program reading the SM's cycle counter (``%clock64``) and the global timer
(``%globaltimer``) after a block barrier at each phase's end: prologue (landmark update, plan loads), scoring, the
reserved pages, each round's histogram and its scan (digit and keys above), the index write. The mirror must write
the product kernel's index buffer (checked each case); the product launch is timed beside it (CUDA graph), so the
barriers' cost shows too.
Usage (GPU host): python benchmarks/selection_phase_profile.py --out phases.json
  [--batch 16 --contexts 32768,33024 --variants fused_packed_narrow,fused_rolled_narrow]
"""
from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl

from sparrow_server.kernels import radix
from sparrow_server.kernels import sparse_decode as K
from sparrow_server.kernels import topk
from sparrow_server.kernels.topk import write_reserved

PHASES = ("prologue", "scoring", "reserved", *(f"{step} {i}" for i in range(1, 5) for step in ("histogram", "scan")),
          "write")
STAMPS = len(PHASES) + 1


@triton.jit
def _stamp(stamps, i, x, STAMP: tl.constexpr):
    """Phase ``i``'s end: every warp here (a barrier), then this SM's cycle counter and the global timer (ns)."""
    if STAMP:
        tl.debug_barrier()
        c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)
        g = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False,
                                      pack=1)
        tl.store(stamps + 2 * i, c)
        tl.store(stamps + 2 * i + 1, g)


@triton.jit
def _stamped_row_kernel(q_ptr, lm_ptr, kbuf_ptr, loc_ptr, scores_ptr, pcap, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr,
                        sink_ptr, k_ptr, lo_ptr, hi_ptr, indptr_ptr, out_ptr, bins_ptr, r2t_stride, stamps_ptr,
                        H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, BLOCK_P: tl.constexpr,
                        STAGES: tl.constexpr, SMALL: tl.constexpr, ROW: tl.constexpr, TAIL: tl.constexpr,
                        ROLLED: tl.constexpr, ATOMIC: tl.constexpr, JOINT: tl.constexpr, HOIST: tl.constexpr,
                        NSTAMP: tl.constexpr, STAMP: tl.constexpr):
    """``_row_kernel`` (UPDATE, SELECT) for rows of at most ROW + TAIL candidates, each k > 0, stamped: NSTAMP
    stamps a program, the start, then each of PHASES' ends (the first round's histogram includes the keys' load
    and, with ATOMIC, the zeroing of the row's bins). JOINT: ``TopKVariant.write_code``. HOIST
    (``TopKVariant.hoisted``): the reserved pages gathered in the prologue and stored before the scoring's end (the
    "reserved" phase then empty)."""
    r = tl.program_id(0)
    b = r // H
    h = r % H
    stamps = stamps_ptr + r.to(tl.int64) * (2 * NSTAMP)
    _stamp(stamps, 0, r, STAMP)
    if HOIST:
        lo = tl.load(lo_ptr + b)
        hi = tl.load(hi_ptr + b)
        row = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
        k = tl.load(k_ptr + b)
        n = tl.load(n_ptr + b)
        cnt = tl.load(cnt_ptr + b)
        s = tl.load(sink_ptr + b)
        reserved_out = out_ptr + tl.load(indptr_ptr + r)
        K.row_update(kbuf_ptr, lm_ptr, lm_ptr, loc_ptr, b, h, H, D, PS, False)
        t, slot, m = topk.reserved_ids(row, n, cnt, s, k, 0, PS, SMALL)
    else:
        K.row_update(kbuf_ptr, lm_ptr, lm_ptr, loc_ptr, b, h, H, D, PS, False)
        k = tl.load(k_ptr + b)
        lo = tl.load(lo_ptr + b)
        hi = tl.load(hi_ptr + b)
        row = r2t_ptr + tl.load(rpi_ptr + b).to(tl.int64) * r2t_stride
    scores = scores_ptr + r.to(tl.int64) * pcap
    _stamp(stamps, 1, r, STAMP)
    K.score_row(K.group_query_sum(q_ptr, b, h, H, G, D), lm_ptr, lm_ptr, row, scores, h, lo, hi, H, G, D, PS,
                 BLOCK_P, STAGES, False)
    if HOIST:
        tl.store(reserved_out + t, slot * H + h, mask=m)
        topk.write_reserved_from(row, reserved_out, n, cnt, s, k, h, SMALL, H, PS, SMALL)
    tl.debug_barrier()
    _stamp(stamps, 2, r, STAMP)
    if not HOIST:
        write_reserved(r, r2t_ptr, rpi_ptr, n_ptr, cnt_ptr, sink_ptr, indptr_ptr, out_ptr, r2t_stride, k, H, PS, SMALL)
    _stamp(stamps, 3, r, STAMP)
    out = out_ptr + tl.load(indptr_ptr + r) + tl.load(sink_ptr + b)
    bins = bins_ptr + r.to(tl.int64) * radix.BINS_PER_ROW
    if ATOMIC:
        radix.zero_bins(bins)
    j = lo + tl.arange(0, ROW)
    key = radix.ukey(scores, j, j < hi)
    if TAIL > 0:
        j2 = lo + ROW + tl.arange(0, TAIL)
        key2 = radix.ukey(scores, j2, j2 < hi)
    else:
        j2, key2 = j, key
    prefix = tl.zeros([], tl.int64)
    n_gt = tl.zeros([], tl.int32)
    exact = tl.zeros([], tl.int32)
    if ROLLED:  # topk.TopKVariant.rolled: the rounds a loop; the stamps of the rounds it skips all at its end
        rnd = tl.zeros([], tl.int32)
        if ATOMIC == 1:  # the first round by Triton's histogram, the rest by atomics
            hist = topk._round_histogram(key, key2, prefix, 24, bins, TAIL, False)
            _stamp(stamps, 4, r, STAMP)
            prefix, n_gt, exact = radix.histogram_round_packed(hist, k, n_gt, prefix, 24)
            _stamp(stamps, 5, r, STAMP)
            rnd += 1
        elif ATOMIC == 2:  # the first round against the top digits; its "scan 1": the histogram where they miss
            prefix, n_gt, exact, found = radix.top_digits_round(key, key2, k, TAIL)
            _stamp(stamps, 4, r, STAMP)
            if found == 0:
                hist = topk._round_histogram(key, key2, tl.zeros([], tl.int64), 24, bins, TAIL, False)
                prefix, n_gt, exact = radix.histogram_round_packed(hist, k, tl.zeros([], tl.int32),
                                                                   tl.zeros([], tl.int64), 24)
            _stamp(stamps, 5, r, STAMP)
            rnd += 1
        while (exact == 0) & (rnd < 4):
            hist = topk._round_histogram(key, key2, prefix, 24 - 8 * rnd, bins, TAIL, ATOMIC)
            _stamp(stamps, 4 + 2 * rnd, r, STAMP)
            prefix, n_gt, exact = radix.histogram_round_packed(hist, k, n_gt, prefix, 24 - 8 * rnd)
            _stamp(stamps, 5 + 2 * rnd, r, STAMP)
            rnd += 1
        while rnd < 4:
            _stamp(stamps, 4 + 2 * rnd, r, STAMP)
            _stamp(stamps, 5 + 2 * rnd, r, STAMP)
            rnd += 1
    else:
        for rnd in tl.static_range(4):
            if exact == 0:
                hist = radix.bucket_histogram(key, prefix, 24 - 8 * rnd)
                if TAIL > 0:
                    hist += radix.bucket_histogram(key2, prefix, 24 - 8 * rnd)
                _stamp(stamps, 4 + 2 * rnd, r, STAMP)
                prefix, n_gt, exact = radix.histogram_round_packed(hist, k, n_gt, prefix, 24 - 8 * rnd)
            else:
                _stamp(stamps, 4 + 2 * rnd, r, STAMP)
            _stamp(stamps, 5 + 2 * rnd, r, STAMP)
    radix.write_row_packed(key, j, key2, j2, prefix, k - n_gt, row, out, h, H, PS, TAIL, JOINT)  # JOINT: .write_code
    _stamp(stamps, NSTAMP - 1, r, STAMP)


def tier(candidates: int, variant: str) -> tuple[int, int]:
    """(ROW, TAIL) lanes of the register tier ``variant``'s fused launch gives rows of ``candidates``."""
    v = topk.TOPK_VARIANTS[variant]
    medium, large = topk.SELECT_ROWS[1], topk.SELECT_ROWS[2]
    assert topk.SELECT_FINE[0] + topk.SELECT_FINE[1] < candidates <= large, "profiled tiers: 1,537 to 4,096"
    if candidates <= medium:
        return medium, 0
    tails = [t for t in topk.SELECT_TAILS if candidates <= medium + t] if v.tails else []
    return (medium, tails[0]) if tails else (large, 0)


def stamped_launch(layer, loc, stamps, variant: str, lanes: tuple[int, int], stamp: bool = True) -> None:
    """The mirror over ``layer``'s rows (a ``SparseLayer``, every row in the register tier of ``lanes``, ``tier``'s
    (ROW, TAIL): computed outside, so that a CUDA graph can capture the launch)."""
    c, f = layer.case, layer.fields
    b, hq, d = c.q.shape
    row, tail = lanes
    v = topk.TOPK_VARIANTS[variant]
    _stamped_row_kernel[(b * layer.h,)](
        c.q, layer.lm, c.k_buf, loc, layer.scores, layer.scores.shape[1], c.req_to_token, c.rpi, f["n_pages"],
        f["count"], f["sink"], f["k"], f["cand_lo"], f["cand_hi"], layer.row_indptr, layer.indices,
        topk.radix_bins(variant, b * layer.h, layer.indices), c.req_to_token.stride(0), stamps, H=layer.h,
        G=hq // layer.h, D=d, PS=c.page_size, BLOCK_P=K.ROW_BLOCK_P, STAGES=K.ROW_STAGES, SMALL=topk.SELECT_ROWS[0],
        ROW=row, TAIL=tail, ROLLED=v.rolled, ATOMIC=v.atomic_code, JOINT=v.write_code, HOIST=v.hoisted,
        NSTAMP=STAMPS, STAMP=stamp, **topk.tier_launch(variant)[1])


def phase_table(stamps) -> dict:
    """Per phase, microseconds over the programs (mean, median, 90th percentile) from the cycle counter at the
    SM clock each program's global timer gives; the launch's span (first start to last end) from the timer."""
    import torch

    cyc, ns = stamps[:, :, 0].double(), stamps[:, :, 1].double()
    ghz = (cyc[:, -1] - cyc[:, 0]) / (ns[:, -1] - ns[:, 0])
    us = (cyc[:, 1:] - cyc[:, :-1]) / ghz[:, None] / 1e3
    q = lambda t, p: round(float(torch.quantile(t, p)), 2)  # noqa: E731
    phases = {name: {"mean": round(float(us[:, i].mean()), 2), "median": q(us[:, i], 0.5), "p90": q(us[:, i], 0.9)}
              for i, name in enumerate(PHASES)}
    return {"phases_us": phases, "program_us_median": q(us.sum(1), 0.5), "sm_clock_ghz_median": q(ghz, 0.5),
            "span_us": round(float(ns[:, -1].max() - ns[:, 0].min()) / 1e3, 2),
            "start_spread_us": round(float(ns[:, 0].max() - ns[:, 0].min()) / 1e3, 2)}


def profile_case(pool, ctx: int, schedule, max_context: int, ws, variant: str) -> dict:
    import torch

    import sparse_kernel_bench as B

    case, plan, layer = B._build_layer(pool, ctx, schedule, max_context, ws)
    loc = case.req_to_token[1:, ctx - 1].long()
    layer.variant = variant
    layer.select(loc)
    want = layer.indices.clone()
    stamps = torch.zeros(layer.scores.shape[0], STAMPS, 2, dtype=torch.int64, device="cuda")
    cand = int((layer.fields["cand_hi"] - layer.fields["cand_lo"]).max())
    lanes = tier(cand, variant)
    layer.indices.zero_()
    stamped_launch(layer, loc, stamps, variant, lanes)
    torch.cuda.synchronize()
    same = bool(torch.equal(layer.indices, want))
    timed = {"product_selection_us": round(B.graph_us(lambda: layer.select(loc)), 1),
             "stamped_selection_us": round(B.graph_us(lambda: stamped_launch(layer, loc, stamps, variant, lanes)), 1),
             "unstamped_mirror_us": round(B.graph_us(lambda: stamped_launch(layer, loc, stamps, variant, lanes, False)),
                                          1)}
    stamped_launch(layer, loc, stamps, variant, lanes)  # one launch's stamps, outside the graph's back-to-back replays
    torch.cuda.synchronize()
    return {"context": ctx, "candidates": cand, "budget_pages": int(layer.fields["k"].max()), "variant": variant,
            "tier": list(lanes), "same_indices": same, **timed, **phase_table(stamps.cpu())}


def main() -> None:
    import torch

    import sparse_kernel_bench as B

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--contexts", default="32768,33024")
    ap.add_argument("--server-context", type=int, default=40960)
    ap.add_argument("--schedule", default="qwen3-1.7b-0.86")
    ap.add_argument("--variants", default=K.DEFAULT_SELECT_VARIANT)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",")]
    pool = B.build_pool(a.batch, max(contexts), 2)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    schedule = B._schedule(a.schedule, 0)
    cases = [profile_case(pool, ctx, schedule, a.server_context, ws, v)
             for ctx in contexts for v in a.variants.split(",")]
    result = {"gpu": torch.cuda.get_device_name(), "batch": a.batch, "server_context_length": a.server_context,
              "phases": list(PHASES), "cases": cases}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    for c in cases:
        row = " ".join(f"{c['phases_us'][p]['median']:6.2f}" for p in PHASES)
        print(f"{c['context']:>6} {c['candidates']:>5} {c['variant']:>24} same={c['same_indices']} "
              f"product {c['product_selection_us']} stamped {c['stamped_selection_us']} mirror "
              f"{c['unstamped_mirror_us']} span {c['span_us']} | {row}", flush=True)
    print("phases (median us):", ", ".join(PHASES))
    assert all(c["same_indices"] for c in cases), "the mirror wrote other pages than the product kernel"


if __name__ == "__main__":
    main()
