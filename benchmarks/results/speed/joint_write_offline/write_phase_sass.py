"""Offline record (twenty-first session): the index write of the 2,048 + 256 register tier of
``fused_topdigits_narrow`` and ``fused_joint_narrow`` in sm_90 SASS (a 16-warp program under 64 registers, as the fused
row kernel runs it), compiled by the GPU hosts' Triton 3.6 on a CPU machine: the order of barriers, global loads and
stores after the search's last global-memory step, and each fused row kernel's resources.

Run from the repo root: PYTHONPATH=<Triton 3.6 site>:$PWD python benchmarks/results/speed/joint_write_offline/write_phase_sass.py
"""
import re
import sys

sys.path.insert(0, "benchmarks")
import selection_kernel_resources as res  # noqa: E402
import triton  # noqa: E402

from sparrow_server.kernels import sparse_decode as K  # noqa: E402
from sparrow_server.kernels import topk  # noqa: E402

OPS = ("BAR.SYNC", "LDG", "STG", "LDL", "STL", "BRA")
print("triton", triton.__version__)
for variant in ("fused_topdigits_narrow", "fused_joint_narrow"):
    consts, options = res.row_kernel_launch(variant)
    print(variant, "fused row kernel:", res.kernel_resources(res.compile_kernel(K._row_kernel, res.ROW_TYPES, consts,
                                                                               options, 90)).split(" CONST")[0])
    v = topk.TOPK_VARIANTS[variant]
    consts = dict(PS=16, ROW=2048, TAIL=256, EXIT=v.exit_early, PACKED=v.packed_code, ROLLED=v.rolled,
                  ATOMIC=v.atomic_code)
    kernel = res.compile_kernel(res._one_tier, res.TIER_TYPES, consts, {"num_warps": 16, "maxnreg": 64}, 90)
    ins = [line for line in res.cuobjdump(kernel, "-sass").splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    # the search's last global-memory step: an atomic round's bins read (.STRONG.GPU, the .cg load) or its atomics
    last = max(i for i, line in enumerate(ins) if ("LDG" in line and ".STRONG.GPU" in line) or "ATOMG" in line
               or "REDG" in line)
    seq = [next(op for op in OPS if op in line) for line in ins[last + 1:] if any(op in line for op in OPS)]
    print(f"  tier 2048 + 256: {res.kernel_resources(kernel).split(' CONST')[0]}; after the search's last global step "
          f"({len(ins) - last - 1} instructions): {' '.join(seq)}")
