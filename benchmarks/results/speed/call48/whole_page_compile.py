"""Offline sm_90 compile (CPU, Triton's compiler) of ``fused_pages_narrow``'s whole-page scoring and the default's split
scoring kernel, as the server launches them at Qwen3-1.7B shapes: registers, stack, shared memory and the global loads.
    PYTHONPATH=. python benchmarks/results/speed/call48/whole_page_compile.py > benchmarks/results/speed/call48/whole_page_compile.log
"""
from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # benchmarks/
import selection_kernel_resources as res  # noqa: E402

from sparrow_server.kernels import page_scores_whole as W  # noqa: E402
from sparrow_server.kernels import sparse_decode as K  # noqa: E402


def _report(name: str, kernel) -> None:
    loads = collections.Counter(re.findall(r"\b(LDGSTS[.\w]*|LDG[.\w]*)", res.cuobjdump(kernel, "-sass")))
    print(f"{name}: {res.kernel_resources(kernel).strip()}; shared {kernel.metadata.shared} B; loads {dict(loads)}")


def main() -> None:
    for scaled in (False, True):
        consts, options = res.whole_page_kernel_launch("fused_pages_narrow", scaled)
        types = {**res.WHOLE_PAGE_TYPES, **(res.FLOAT8_LANDMARK_TYPES if scaled else {})}
        _report(f"whole-page scoring, {'float8' if scaled else 'bfloat16'}",
                res.compile_kernel(W._whole_page_score_kernel, types, consts, options, 90))
    consts, options = res.score_kernel_launch("fused_kvstore_narrow", 40960 // 16)
    _report("split scoring (default), bfloat16", res.compile_kernel(K._score_kernel, res.SCORE_TYPES, consts, options, 90))


if __name__ == "__main__":
    main()
