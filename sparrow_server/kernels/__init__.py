"""GPU kernels of the sparse decode path (Triton), with pure-PyTorch references.

``reference`` imports on any machine; ``sparse_decode`` needs Triton and a CUDA GPU.
"""

# Selection kernels of ``sparse_decode`` (same pages, different speed; issue 24): ``v1`` the
# gpu_call14 kernels, ``split`` an even score split (v1's top-k), ``even`` that + top-k tiers past
# 2048, ``hist`` ``split`` with histogram radix rounds, ``fine`` ``even`` with register tiers of 1024 and
# 1024 + 512 lanes below 2048 candidates, ``fine_hist`` ``fine`` with ``hist``'s rounds, ``fine_hist64`` and
# ``fine_hist40`` that with its top-k kernel capped at 64 or 40 registers (2 or 3 programs per SM instead of
# 1); ``short8_hist40`` runs the rows of up to 1536 candidates in a launch
# of their own with fewer registers (topk.TopKVariant.short_warps), ``short8_hist40_wide`` only where
# the rows outnumber what one launch runs at once (TopKVariant.short_from_rows); ``fused_hist64`` scores and
# selects in one launch, a program per row (``fine_hist64``'s top-k after the row's own scoring), and
# ``fused_hist64_wide`` does so only from as many rows (TopKVariant.fused_from_rows). Here so that the plug-in's
# settings can check a name without Triton.
SELECT_VARIANTS = ("v1", "split", "even", "hist", "fine", "fine_hist", "fine_hist64", "fine_hist40", "short8_hist40",
                   "short8_hist40_wide", "fused_hist64", "fused_hist64_wide")
# ``short8_hist40_wide`` (call 24, H200, benchmarks/results/speed/call24/): selection 67.9 vs ``fine_hist64``'s 78.2 µs
# per layer at 16K x 64 (rollout A's batch), 45.5 vs 50.4 at 16K x 40, 54.3 vs 59.4 at a GQA group of 4, the same
# launch as ``fine_hist64`` at batch 16 (fine_hist64 over ``even``: call 23). Rollout A served 2.31x dense with it
# (``fine_hist64``: 2.28x), rollout B at 33 requests 2.60x. Picked by pick_select_variant.py.
DEFAULT_SELECT_VARIANT = "short8_hist40_wide"
