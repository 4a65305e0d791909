"""Registers, stack and shared memory of the fused row kernel (fused_kvstore_narrow's constants) compiled offline for
sm_90 at other warp counts, register caps and pipeline stages: what 3 row programs an SM (fused_kvstore_wide3, call 39,
7) would cost. Run from the repository root on any machine with Triton: python3 <this file>."""
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, ".")
import selection_kernel_resources as R  # noqa: E402

from sparrow_server.kernels import sparse_decode as K  # noqa: E402

consts, opts = R.row_kernel_launch("fused_kvstore_narrow")
print("fused_kvstore_narrow's launch:", opts)
for warps, cap, stages in [(16, 64, 3), (16, 40, 3), (16, 48, 3), (8, 80, 3), (8, 96, 3), (8, 64, 3), (16, 40, 2)]:
    kernel = R.compile_kernel(K._row_kernel, R.ROW_TYPES, {**consts, "STAGES": stages},
                              {"num_warps": warps, "maxnreg": cap}, 90)
    print(f"warps {warps} maxnreg {cap} stages {stages}: {R.kernel_resources(kernel)}; "
          f"dynamic shared {kernel.metadata.shared}", flush=True)
