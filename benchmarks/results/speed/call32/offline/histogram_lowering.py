"""How a Triton build lowers ``tl.histogram`` (256 or 32 bins, 2,048 masked keys, 16 warps, sm_90): counts of the
PTX instructions that carry it. Offline, no GPU. Run with each Triton on PYTHONPATH:
    python benchmarks/results/speed/call32/offline/histogram_lowering.py
"""
import re

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _histogram(x_ptr, o_ptr, N: tl.constexpr, BINS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(o_ptr + tl.arange(0, BINS), tl.histogram(x & (BINS - 1), BINS, mask=x >= 0))


for bins in (256, 32):
    kernel = triton.compile(ASTSource(_histogram, {"x_ptr": "*i32", "o_ptr": "*i32", "N": "constexpr",
                                                   "BINS": "constexpr"}, constexprs={"N": 2048, "BINS": bins}),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
    ptx = kernel.asm["ptx"]
    print(f"triton {triton.__version__}: 2,048 keys over 512 threads (4 a thread), {bins} bins")
    for op in ("vote.sync.ballot", "popc", "atom.", "bar.sync"):
        print(f"  {op:18} {len(re.findall(re.escape(op), ptx))}")
