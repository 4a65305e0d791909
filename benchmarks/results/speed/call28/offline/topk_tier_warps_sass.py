"""The histogram top-k tiers of fused_packed_narrow compiled alone for sm_90 (offline, no GPU) at 16, 8 and 4 warps:
SASS instructions a thread, block barriers, shared atomics, registers (selection_kernel_resources.py --tiers at
other launch options). Run: PYTHONPATH=. python benchmarks/results/speed/call28/offline/topk_tier_warps_sass.py"""
import sys, re
sys.path.insert(0, "benchmarks")
import selection_kernel_resources as res
from sparrow_server.kernels import topk
def counts(row, tail, warps, maxnreg):
    v = topk.TOPK_VARIANTS["fused_packed_narrow"]
    k = res.compile_kernel(res._one_tier, res.TIER_TYPES, dict(PS=16, ROW=row, TAIL=tail, EXIT=v.exit_early, PACKED=v.packed),
                           {"num_warps": warps, "maxnreg": maxnreg}, 90)
    ins = [l for l in res.cuobjdump(k, "-sass").splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    return len(ins), sum("BAR.SYNC" in i for i in ins), sum("ATOMS" in i for i in ins), res.kernel_resources(k)
for warps, mr in ((16, 64), (8, 128), (8, 64), (4, 128)):
    for row, tail in ((2048, 0), (2048, 256), (2048, 512)):
        print(warps, mr, row, tail, counts(row, tail, warps, mr), flush=True)
