# The split scoring kernel of a variant compiled for sm_90 (offline), its resources and SASS with the kernel
# arguments' constant-bank offsets masked. Run from a checkout's root (PYTHONPATH=that root), once at each revision;
# then diff the outputs but for their first lines (commands in README.md).
import re, sys
sys.path.insert(0, "benchmarks")
import selection_kernel_resources as res
from sparrow_server.kernels import sparse_decode as K
consts, opts = res.score_kernel_launch(sys.argv[1], 2560)
types = dict(res.SCORE_TYPES)
types = {k: v for k, v in types.items() if k in K._score_kernel.arg_names}
k = res.compile_kernel(K._score_kernel, types, consts, opts, 90)
ins = [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[ARG]", m.group(1)).strip()
       for m in re.finditer(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", res.cuobjdump(k, "-sass"), re.M)]
print(res.kernel_resources(k)); print("\n".join(ins))
