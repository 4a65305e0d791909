"""The default fused row kernel's sm_90 SASS at a git revision against the working tree (offline: Triton's bundled
ptxas and cuobjdump, no GPU), and where the index write's gathers are first used.

Usage (repo root): python benchmarks/results/speed/call34/offline_sass/compare_row_kernel_sass.py [REV] [VARIANT]
  REV defaults to 6e648e0 (call 34's suite digest but for a comment), VARIANT to fused_hoisted_narrow.
Prints each build's resources and instruction count, how many instructions differ once the constant-bank offsets of
the kernel's arguments are masked (the row kernel gained two arguments since), and, in the working tree's SASS, for
each predicated 32-bit gather whose value becomes a page id (``LEA Rx, Rx, UR, 0x3``: slot * H + h), how many
instructions later it is first used, or spilled (``STL``) first.
"""
from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import tempfile

CHILD = r'''
import sys
sys.path.insert(0, "benchmarks")
import selection_kernel_resources as res
from sparrow_server.kernels import sparse_decode as K
consts, options = res.row_kernel_launch(sys.argv[1])
k = res.compile_kernel(K._row_kernel, res.ROW_TYPES, consts, options, 90)
print("RESOURCES", res.kernel_resources(k))
print(res.cuobjdump(k, "-sass"))
'''


def sass(root: str, variant: str) -> tuple[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", CHILD, variant], cwd=root, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": root}).stdout
    resources = out.splitlines()[0]
    ins = [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[ARG]", m.group(1)).strip()
           for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", out, re.M)]
    return resources, ins


def gather_uses(ins: list[str]) -> list[str]:
    rows = []
    for i, x in enumerate(ins):
        m = re.match(r"@!?P\d LDG\.E (R\d+),", x)
        if not m:
            continue
        reg = m.group(1)
        for k in range(i + 1, min(i + 600, len(ins))):
            if re.search(rf"\b{reg}\b", ins[k]):
                if re.match(rf"LEA {reg}, {reg}, UR\d+, 0x3|LEA R\d+, {reg}, UR\d+, 0x3", ins[k]):
                    rows.append(f"gather at {i}: first used {k - i} instructions later")
                elif ins[k].startswith("STL"):
                    rows.append(f"gather at {i}: spilled {k - i} instructions later")
                break
    return rows


def main() -> None:
    rev = sys.argv[1] if len(sys.argv) > 1 else "6e648e0"
    variant = sys.argv[2] if len(sys.argv) > 2 else "fused_hoisted_narrow"
    with tempfile.TemporaryDirectory() as old_root:
        archive = subprocess.run(["git", "archive", rev, "sparrow_server", "benchmarks/selection_kernel_resources.py"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", old_root], input=archive, check=True)
        old_res, old = sass(old_root, variant)
    new_res, new = sass(os.getcwd(), variant)
    diff = [d for d in difflib.unified_diff(old, new, lineterm="", n=0)
            if d.startswith(("+", "-")) and not d.startswith(("+++", "---"))]
    print(f"{variant} at {rev}: {old_res.split(' ', 1)[1]}; {len(old)} instructions")
    print(f"{variant} in the working tree: {new_res.split(' ', 1)[1]}; {len(new)} instructions")
    print(f"instructions that differ, argument offsets masked: {len(diff)}")
    print("\n".join(gather_uses(new)))


if __name__ == "__main__":
    main()
