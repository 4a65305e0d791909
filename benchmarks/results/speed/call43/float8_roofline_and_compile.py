"""The float8 rooflines and the row kernel's sm_90 resources quoted in README.md and tests/engine/test_kernel_compile.py.
Run from the repository root: PYTHONPATH=. python3 benchmarks/results/speed/call43/float8_roofline_and_compile.py"""
import sys

sys.path.insert(0, "benchmarks")
import selection_kernel_resources as res  # noqa: E402
import sglang_throughput as B  # noqa: E402

from sparrow_server.kernels import sparse_decode as K  # noqa: E402
from sparrow_server.sparsity.registry import builtin_schedules  # noqa: E402

cfg = B.S.qwen3_config("qwen3-1.7b")
schedule = {s.name: s for s in builtin_schedules()}["qwen3-1.7b-0.86"]
for dtype in ("bfloat16", "float8_e4m3fn"):
    ratios = {b: round(B.roofline_ratio(cfg, "qwen3-1.7b", schedule, "decode_ctx", 32768, b, 256, 0, dtype), 3)
              for b in (16, 34)}
    print("roofline at 32K,", dtype, ratios)
for scaled in (False, True):
    consts, options = res.row_kernel_launch("fused_kvstore_narrow", scaled)
    types = {**res.ROW_TYPES, **(res.FLOAT8_LANDMARK_TYPES if scaled else {})}
    kernel = res.compile_kernel(K._row_kernel, types, consts, options, 90)
    print("row kernel,", "float8" if scaled else "bfloat16", res.kernel_resources(kernel), "dynamic shared",
          kernel.metadata.shared)
