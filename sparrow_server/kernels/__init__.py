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
# ``fused_hist64_narrow`` does so up to as many rows (TopKVariant.fused_max_rows), ``short8_hist40_wide`` past
# them; ``fused_exit_narrow`` is that whose histogram rounds stop early (TopKVariant.exit_early), and
# ``fused_packed_narrow`` that in fewer block-wide steps (TopKVariant.packed). Here so that the plug-in's
# settings can check a name without Triton. ``fused_rolled_narrow``: ``fused_packed_narrow`` whose histogram rounds
# are a loop to the early exit (TopKVariant.rolled); ``fused_atomic_narrow`` that whose rounds after the first count
# the live keys by global atomics (TopKVariant.atomic); ``fused_topdigits_narrow`` that whose first round counts
# against the top digits, no histogram (TopKVariant.top_digits); ``fused_joint_narrow`` that whose rows of two register
# blocks rank both before either gathers its page ids (TopKVariant.joint_write); ``fused_hoisted_narrow`` that whose row
# programs issue their plan loads and reserved pages' gathers ahead of the scoring (TopKVariant.hoisted);
# ``fused_qcopy_narrow`` that which takes the query strided per token and copies it contiguous for the attention, in
# either launch path (TopKVariant.copies_query); ``fused_kvstore_narrow`` that which also stores the step's key and
# value into the pool (TopKVariant.stores_kv); ``fused_pages_narrow`` that whose scoring past the fused rows reads
# every KV head's landmark of a page together, a few programs an SM (TopKVariant.scores_whole_pages).
# Landmark dtypes the kernels take (GPU-tested) and a server offers (SPARROW_LANDMARK_DTYPE); float8 is stored scaled
# (``reference.store_landmarks``).
LANDMARK_STORAGE_DTYPES = ("bfloat16", "float32", "float8_e4m3fn")
# A server's unless SPARROW_LANDMARK_DTYPE says otherwise, and what the cost model assumes: float8 halves the scoring's
# read, but its acceptance on a real Qwen3 is unmeasured (benchmarks/results/speed/call43/README.md).
DEFAULT_LANDMARK_DTYPE = "bfloat16"
SELECT_VARIANTS = ("v1", "split", "even", "hist", "fine", "fine_hist", "fine_hist64", "fine_hist40", "short8_hist40",
                   "short8_hist40_wide", "fused_hist64", "fused_hist64_narrow", "fused_exit_narrow",
                   "fused_packed_narrow", "fused_rolled_narrow", "fused_atomic_narrow",
                   "fused_topdigits_narrow", "fused_joint_narrow", "fused_hoisted_narrow", "fused_qcopy_narrow",
                   "fused_kvstore_narrow", "fused_pages_narrow")
# ``fused_hist64_narrow`` (call 25, H200, benchmarks/results/speed/call25/): at batch 16 (128 rows) selection 36.3 vs
# ``short8_hist40_wide``'s 38.6 us per layer at 32K, 41.7 vs 45.1 at 33K, 44.1 vs 48.9 at 40K (16K: 21.9 vs 23.8); past
# 264 rows ``short8_hist40_wide``'s own launches (call 24: 67.9 vs ``fine_hist64``'s 78.2 us at 16K x 64, rollout A
# 2.31x, rollout B at 33 requests 2.60x). ``fused_exit_narrow`` (call 26, H200, benchmarks/results/speed/call26/):
# less than ``fused_hist64_narrow`` in every case of its bench, e.g. batch 16: 35.4 vs 36.8 us at 32K, 40.6 vs 41.9 at
# 33K, 42.4 vs 44.6 at 40K; batch 34 (272 rows) 73.0 vs 77.4 at 32K; batch 64: 65.8 vs 72.2 at 16K.
# ``fused_packed_narrow`` (call 27, H200, benchmarks/results/speed/call27/): the same rounds in fewer block-wide steps,
# less top-k than ``fused_exit_narrow`` in every case of its bench (batch 16 at 33K: 38.9 vs 41.1 us of selection).
# ``fused_rolled_narrow`` (call 31, H200, benchmarks/results/speed/call31/): picked in both of its benches (summed over
# six contexts at batch 16: 230.5 vs 233.9 and 230.7 vs 231.9 us; batch 34: 0.8-2.1 us less a case; batch 64 at
# 17.4K: 73.6 vs 76.9 and 73.4 vs 77.3, at 16K within 0.3).
# ``fused_atomic_narrow`` (call 32, H200, benchmarks/results/speed/call32/): picked in both of its benches, less
# selection than ``fused_rolled_narrow`` in every case (summed over six contexts at batch 16: 208.2 vs 234.1 and 207.0
# vs 231.5 us; 33K x 16: 33.9 vs 39.6 and 33.8 vs 39.0; batch 34: 69.1-72.7 vs 78.1-81.3; batch 64: 61.8-68.4 vs
# 64.0-74.0).
# ``fused_joint_narrow`` (call 33, H200, benchmarks/results/speed/call33/): picked over ``fused_topdigits_narrow`` and
# ``fused_atomic_narrow`` (summed over six contexts at batch 16: 201.2 vs 202.0 vs 208.2 us), less selection than
# ``fused_atomic_narrow`` in every case (33K x 16: 32.9 vs 34.1; batch 34: 67.2-69.7 vs 69.4-72.9; batch 64: 60.2-67.3
# vs 61.8-67.9); its index write 2.17 vs 2.42 us in the phase profile at 33K x 16.
# ``fused_hoisted_narrow`` (call 34, H200, benchmarks/results/speed/call34/): picked over ``fused_joint_narrow`` on
# both cards of one host (summed over six contexts at batch 16: 196.6 vs 203.1 and 196.6 vs 200.7 us; 33K x 16: 32.1 vs
# 33.3 and 32.0 vs 32.8; batch 32: 52.7-56.0 vs 54.0-57.5) and less in every batch-16 case on another (32.0 vs 33.7 at
# 33K); in its phase profile the reserved pages 0.03 vs 0.76 us after the scoring, the write 1.85 vs 2.21.
# ``fused_qcopy_narrow`` (call 35, H200, benchmarks/results/speed/call35/): the same selection, but the backend's
# ``q.contiguous()`` copy kernel not launched; served decode at 32K on the same two cards, dense and sparse at once:
# sparse 2833.5 vs 2797.5 tok/s at batch 16 (+1.3%), 3532.1 vs 3503.5 at batch 34 (+0.8%).
# ``fused_kvstore_narrow`` (calls 35-36, H200, benchmarks/results/speed/call36/): the same selection, storing the
# step's K and V itself, so the backend skips ``set_kv_buffer``'s store kernel on a plain pool; served decode at 32K
# on the same two cards, dense and sparse at once: sparse 2854.3 vs 2831.8 tok/s at batch 16 (+0.8%), 3528.1 vs
# 3526.0 at batch 34 (+0.1%); in the other order on another host 2827.2 vs 2804.3 (+0.8%) and 3462.4 vs 3472.3
# (-0.3%); one H200 alone at batch 16: 2828.1 vs 2801.8 (+0.9%).
DEFAULT_SELECT_VARIANT = "fused_kvstore_narrow"
# A model whose GQA group is 4 or more (Qwen3-4B and 8B: 32 query heads over 8 KV heads) is served by
# ``fused_pages_narrow`` (call 49, H200, benchmarks/results/speed/call49/): its scoring past the fused rows, at
# Qwen3-4B's shape, 15.0 against 21.9 us a layer at 48 x 8K and 30.9 against 36.0 at 48 x 16K, but at Qwen3-1.7B's
# group of 2 slower than the default in five of six cases (49.2 against 45.4 at 34 x 32K, 53.7 against 51.8 at 34 x
# 36K, 58.2 against 51.0 at 40 x 32K, 28.2 against 24.5 at 64 x 8K, 49.5 against 44.8 at 64 x 16K; 31.0 against 34.5
# at 48 x 16K) and in served decode at 32K (2,825.7 against 2,855.5 tok/s at 16, 3,471.7 against 3,480.8 at 34, one
# card, back to back).
WIDE_GROUP, WIDE_GROUP_SELECT_VARIANT = 4, "fused_pages_narrow"


def default_select_variant(group: int) -> str:
    """The selection kernels a server runs where SPARROW_SELECT_VARIANT names none: by its model's GQA group."""
    return WIDE_GROUP_SELECT_VARIANT if group >= WIDE_GROUP else DEFAULT_SELECT_VARIANT
