"""The fused row kernel's scoring loop compiled offline for sm_90 (Triton's bundled compiler, no GPU): per variant,
its dynamic shared memory, the cp.async wait-group counts of its PTX and, in its TTGIR, the asynchronous copies
issued before the loop (page ids and landmark tiles in flight when the loop starts)."""
import re
import sys

sys.path.insert(0, "benchmarks")
import selection_kernel_resources as res  # noqa: E402
from sparrow_server.kernels import sparse_decode as K  # noqa: E402

for variant in ("fused_packed_narrow", "fused_packed_s4_narrow", "fused_packed_b64s6_narrow"):
    consts, options = res.row_kernel_launch(variant)
    k = res.compile_kernel(K._row_kernel, res.ROW_TYPES, consts, options, 90)
    ttgir = k.asm["ttgir"].splitlines()
    loop = next(i for i, line in enumerate(ttgir) if "scf.for" in line and "iter_args" in line)
    before = [line for line in ttgir[:loop] if "async_copy_global_to_local" in line]
    tiles = sum("bf16" in line for line in before)
    waits = re.findall(r"cp.async.wait_group\s+(\d+)", k.asm["ptx"])
    print(f"{variant}: {K.row_loop(variant)}, dynamic shared {k.metadata.shared} B; before the loop {len(before)} "
          f"async copies ({tiles} landmark tiles, {len(before) - tiles} page-id tiles); PTX wait_group counts "
          f"{waits}")
