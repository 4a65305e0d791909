"""GPU kernels of the sparse decode path (Triton), with pure-PyTorch references.

``reference`` imports on any machine; ``sparse_decode`` needs Triton and a CUDA GPU.
"""

# Selection kernels of ``sparse_decode`` (same pages, different speed; issue 24): ``v1`` the
# gpu_call14 kernels, ``split`` an even score split (v1's top-k), ``even`` that + top-k tiers past
# 2048, ``hist`` ``split`` with histogram radix rounds, ``fine`` ``even`` with register tiers of 1024 and
# 1024 + 512 lanes below 2048 candidates, ``fine_hist`` ``fine`` with ``hist``'s rounds, ``fine_hist64`` and
# ``fine_hist40`` that with its top-k kernel capped at 64 or 40 registers (2 or 3 programs per SM instead of
# 1). Here so that the plug-in's settings can check a name without Triton.
SELECT_VARIANTS = ("v1", "split", "even", "hist", "fine", "fine_hist", "fine_hist64", "fine_hist40")
# ``even``: 40.4 vs v1's 47.8 µs per layer just past 2048 candidates, 44.4 vs 52.1 at 40K, 1.4 µs slower
# at exactly 2045 (H200, batch 16; benchmarks/results/speed/); served 32K x 16 at 2.63x dense with it.
DEFAULT_SELECT_VARIANT = "even"
