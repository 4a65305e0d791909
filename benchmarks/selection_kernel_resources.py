"""Registers, stack and shared memory of the selection kernels of each variant, compiled offline
for a GPU target (no GPU needed: Triton's bundled ptxas and cuobjdump). Occupancy follows from
them: a score program has 8 warps, a select program 16 (65536 registers per SM: at 128 registers one select
program fills an SM; ``fine_hist64`` / ``fine_hist40`` cap them for 2 or 3); a fused variant's row program
(scoring and top-k in one launch) has the select program's warps and cap.
With ``--tiers``, instead: each register tier of the histogram top-k compiled alone (a 16-warp program under 64
registers, as the fused row kernel runs it), its SASS instructions, block barriers and shared-memory atomics.
Usage: python benchmarks/selection_kernel_resources.py [--arch 90] [--pcap 2560] [--tiers]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sparrow_server.kernels import sparse_decode as K
from sparrow_server.kernels import topk

SCORE_TYPES = dict(q_ptr="*bf16", lm_ptr="*bf16", lms_ptr="*bf16", k_ptr="*bf16", loc_ptr="*i64", r2t_ptr="*i32",
                   rpi_ptr="*i64", lo_ptr="*i32", hi_ptr="*i32", out_ptr="*fp32", r2t_stride="i32", pcap="i32",
                   q_stride="i32", qout_ptr="*bf16", kin_ptr="*bf16", vin_ptr="*bf16", k_stride="i32", v_stride="i32",
                   vbuf_ptr="*bf16")
ROW_TYPES = dict(q_ptr="*bf16", lm_ptr="*bf16", lms_ptr="*bf16", kbuf_ptr="*bf16", loc_ptr="*i64",
                 scores_ptr="*fp32", pcap="i32", r2t_ptr="*i32", rpi_ptr="*i64", n_ptr="*i32", cnt_ptr="*i32",
                 sink_ptr="*i32", k_ptr="*i32", lo_ptr="*i32", hi_ptr="*i32", indptr_ptr="*i32", out_ptr="*i32",
                 bins_ptr="*i32", r2t_stride="i32", q_stride="i32", qout_ptr="*bf16", kin_ptr="*bf16", vin_ptr="*bf16",
                 k_stride="i32", v_stride="i32", vbuf_ptr="*bf16")
# float8 landmarks: their scales' pointer a float32 one (bfloat16 landmarks: the landmarks passed again, unread)
FLOAT8_LANDMARK_TYPES = dict(lm_ptr="*fp8e4nv", lms_ptr="*fp32")
SELECT_TYPES = dict(scores_ptr="*fp32", pcap="i32", r2t_ptr="*i32", rpi_ptr="*i64", n_ptr="*i32", cnt_ptr="*i32",
                    sink_ptr="*i32", k_ptr="*i32", lo_ptr="*i32", hi_ptr="*i32", indptr_ptr="*i32", out_ptr="*i32",
                    bins_ptr="*i32", r2t_stride="i32")


def compile_kernel(fn, types: dict, consts: dict, options: dict, arch: int):
    """``fn`` compiled for sm_``arch`` as Triton's launcher specializes a server's arguments: 16-byte aligned
    tensors, sizes that are multiples of 16 (Pcap, req_to_token's row stride). Without it every load compiles
    scalar (2-byte landmark loads)."""
    sig = {name: "constexpr" if name in consts else types[name] for name in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if name not in consts}
    return triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=aligned), target=GPUTarget("cuda", arch, 32),
                          options=options)


def row_kernel_launch(variant: str, scaled: bool = False) -> tuple[dict, dict]:
    """A fused variant's row kernel as the server launches it at Qwen3-1.7B shapes (``scaled``: float8 landmarks,
    types ``FLOAT8_LANDMARK_TYPES``): (constants, options)."""
    consts, options = topk.tier_launch(variant)
    v = topk.TOPK_VARIANTS[variant]
    return dict(H=8, G=2, D=128, PS=16, BLOCK_P=K.ROW_BLOCK_P, STAGES=K.ROW_STAGES, UPDATE=True, SELECT=True,
                HOIST=v.hoisted, COPY_Q=v.copies_query, STORE_KV=v.stores_kv, SCALED=scaled, **consts), options


def score_kernel_launch(variant: str, pcap: int, scaled: bool = False) -> tuple[dict, dict]:
    """A variant's split scoring kernel as the server launches it at Qwen3-1.7B shapes (a server of ``pcap`` pages;
    ``scaled`` as ``row_kernel_launch``'s): (constants, options)."""
    even = variant != "v1"
    consts = dict(H=8, G=2, D=128, PS=16, BLOCK_P=K.SCORE_BLOCK_P, NPROG=K.score_programs(pcap, variant), EVEN=even,
                  UPDATE=True, LM_BLOCK=1024, COPY_Q=topk.TOPK_VARIANTS[variant].copies_query,
                  STORE_KV=topk.TOPK_VARIANTS[variant].stores_kv, SCALED=scaled)
    return consts, {"num_warps": 8, **({"maxnreg": K.SCORE_MAXNREG} if even else {})}


WHOLE_PAGE_TYPES = {**SCORE_TYPES, "nprog": "i32"}


def whole_page_kernel_launch(variant: str, scaled: bool = False) -> tuple[dict, dict]:
    """A whole-page variant's scoring past its fused rows (``page_scores_whole``) as the server launches it at
    Qwen3-1.7B shapes (``scaled`` as ``row_kernel_launch``'s): (constants, options)."""
    from sparrow_server.kernels import page_scores_whole as W

    v = topk.TOPK_VARIANTS[variant]
    consts = dict(H=8, G=2, D=128, PS=16, BLOCK_P=W.PAGE_TILE, STAGES=K.ROW_STAGES, UPDATE=True, LM_BLOCK=1024,
                  COPY_Q=v.copies_query, STORE_KV=v.stores_kv, SCALED=scaled)
    return consts, {"num_warps": W.PAGE_WARPS}


def resources(fn, types: dict, consts: dict, options: dict, arch: int) -> str:
    """cuobjdump's resource line (REG, STACK, SHARED, LOCAL) of ``fn`` compiled for sm_``arch``."""
    return kernel_resources(compile_kernel(fn, types, consts, options, arch))


def cuobjdump(kernel, flag: str) -> str:
    """What Triton's bundled cuobjdump prints with ``flag`` (``-res-usage``, ``-sass``) for a compiled kernel."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def kernel_resources(kernel) -> str:
    """cuobjdump's resource line of a compiled kernel (its dynamic shared memory, what Triton's pipelines and
    reductions take, is ``kernel.metadata.shared``)."""
    return next(line.strip() for line in cuobjdump(kernel, "-res-usage").splitlines() if "REG:" in line)


@triton.jit
def _one_tier(scores_ptr, r2t_ptr, out_ptr, bins_ptr, k_ptr, lo_ptr, hi_ptr, PS: tl.constexpr, ROW: tl.constexpr,
              TAIL: tl.constexpr, EXIT: tl.constexpr, PACKED: tl.constexpr, ROLLED: tl.constexpr,
              ATOMIC: tl.constexpr):
    """One register tier of the histogram top-k (``topk._topk_in_registers``, 8-bit rounds), alone in a kernel."""
    topk._topk_in_registers(scores_ptr, tl.load(lo_ptr), tl.load(hi_ptr), tl.load(k_ptr), r2t_ptr, out_ptr, bins_ptr,
                            0, 8, PS, ROW, TAIL, 8, EXIT, PACKED, ROLLED, ATOMIC)


TIER_TYPES = dict(scores_ptr="*fp32", r2t_ptr="*i32", out_ptr="*i32", bins_ptr="*i32", k_ptr="*i32", lo_ptr="*i32",
                  hi_ptr="*i32")


def tier_sass_counts(row: int, tail: int, variant: str, arch: int) -> dict:
    """SASS instructions, BAR.SYNC, ATOMS (shared) and ATOMG/REDG (global atomics) of one top-k tier (ROW + TAIL
    lanes) of a histogram variant, as the fused row kernel runs it."""
    v = topk.TOPK_VARIANTS[variant]
    consts = dict(PS=16, ROW=row, TAIL=tail, EXIT=v.exit_early, PACKED=v.packed_code, ROLLED=v.rolled,
                  ATOMIC=v.atomic_code)
    kernel = compile_kernel(_one_tier, TIER_TYPES, consts, {"num_warps": topk.SELECT_WARPS, "maxnreg": 64}, arch)
    ins = [line for line in cuobjdump(kernel, "-sass").splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    return {"instructions": len(ins), "barriers": sum("BAR.SYNC" in i for i in ins),
            "shared_atomics": sum("ATOMS" in i for i in ins),
            "global_atomics": sum("ATOMG" in i or "REDG" in i or "RED.E" in i for i in ins),
            "resources": kernel_resources(kernel)}


def print_tiers(arch: int) -> None:
    tiers = [(topk.SELECT_FINE[0], 0), (topk.SELECT_FINE[0], topk.SELECT_FINE[1]), (topk.SELECT_ROWS[1], 0),
             *((topk.SELECT_ROWS[1], t) for t in topk.SELECT_TAILS)]
    for variant in ("fused_packed_narrow", "fused_rolled_narrow", "fused_atomic_narrow", "fused_topdigits_narrow",
                    "fused_joint_narrow"):
        for row, tail in tiers:
            c = tier_sass_counts(row, tail, variant, arch)
            print(f"{variant} tier {row} + {tail:4} lanes: {c['instructions']} SASS instructions, {c['barriers']} "
                  f"BAR.SYNC, {c['shared_atomics']} ATOMS, {c['global_atomics']} global atomics; {c['resources']}",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--pcap", type=int, default=2560, help="server context length in pages (sets even's grid)")
    ap.add_argument("--tiers", action="store_true", help="the top-k's register tiers alone: SASS counts")
    a = ap.parse_args()
    if a.tiers:
        print_tiers(a.arch)
        return
    for v in K.SELECT_VARIANTS:
        nprog = K.score_programs(a.pcap, v)
        consts, opts = score_kernel_launch(v, a.pcap)
        line = resources(K._score_kernel, SCORE_TYPES, consts, opts, a.arch)
        print(f"score  {v:5} ({nprog} programs/request): {line}")
        launches = K.select_launches(v)
        for consts, options in launches:
            line = resources(topk._select_kernel, SELECT_TYPES, dict(H=8, PS=16, **consts), options, a.arch)
            part = f" part {consts['PART']} ({options['num_warps']} warps)" if len(launches) > 1 else ""
            print(f"select {v:5}{part}: {line}", flush=True)
        if topk.TOPK_VARIANTS[v].fused:  # the one launch of scoring and top-k (score_and_select)
            consts, options = row_kernel_launch(v)
            kernel = compile_kernel(K._row_kernel, ROW_TYPES, consts, options, a.arch)
            print(f"fused  {v:5} ({options['num_warps']} warps): {kernel_resources(kernel)} dynamic shared "
                  f"{kernel.metadata.shared}", flush=True)


if __name__ == "__main__":
    main()
