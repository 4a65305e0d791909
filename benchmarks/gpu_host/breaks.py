"""Deliberate breaks of the production engine, each expected to fail at least one GPU test.

Each break is one exact text substitution in one file of ``sparrow_server`` and the GPU tests that
should catch it. ``run`` copies the tree once per break (so breaks run side by side, one per GPU, and
the checkout is never edited), applies the break there, runs its tests, and writes one JSON line
per break: which tests failed (caught) or that none did (survived).

    python benchmarks/gpu_host/breaks.py list
    python benchmarks/gpu_host/breaks.py check                # every substitution applies exactly once (CPU)
    python benchmarks/gpu_host/breaks.py run --gpus 0,1 --out DIR [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING = "tests/gpu/test_sglang_serving.py"
TP = "tests/gpu/test_sglang_tp.py"
SERVICE = "tests/gpu/test_sglang_service.py"
TRAINER = "tests/gpu/test_sglang_trainer_compat.py"
BACKEND = "sparrow_server/sglang_plugin/scheduler/backend.py"
PLANNING = "sparrow_server/sglang_plugin/scheduler/planning.py"
KERNELS = "sparrow_server/kernels/sparse_decode.py"
TILES = "sparrow_server/kernels/score_tiles.py"  # the scoring's building blocks, shared by its launches
_STORE = ("        if STORE_KV:\n            store_step_kv(kin_ptr, vin_ptr, k_stride, v_stride, kbuf_ptr, vbuf_ptr, "
          "loc_ptr, b, h * D, H * D, D)\n            tl.debug_barrier()\n")
# the fused row's store, then its landmark update (kv_store_after_landmark swaps them)
_UPDATE = "        if UPDATE:\n            row_update(kbuf_ptr, lm_ptr, lms_ptr, loc_ptr, b, h, H, D, PS, SCALED)\n"
RADIX = "sparrow_server/kernels/radix.py"
TOPK = "sparrow_server/kernels/topk.py"
LAYER_GROUPS = "sparrow_server/sglang_plugin/scheduler/layer_groups.py"
LAYER_PLANS = "sparrow_server/sglang_plugin/scheduler/layer_plans.py"
DETERMINISM = "sparrow_server/sglang_plugin/scheduler/determinism.py"
DENSE_LAYERS = "tests/gpu/test_dense_layers.py"
EXACT = "tests/gpu/test_exact_acceptance.py"
EXACT_ROWS = "sparrow_server/sglang_plugin/scheduler/exact_rows.py"
EXACT_HOOKS = "sparrow_server/sglang_plugin/scheduler/exact_hooks.py"
EXACT_VERIFY = "sparrow_server/sglang_plugin/scheduler/exact_verify.py"
DETERMINISTIC = "tests/gpu/test_deterministic.py"
GROUPED = "tests/gpu/test_grouped_query_heads.py"
KERNEL_TESTS = "tests/gpu/test_sparse_kernels.py"
MERGE = "sparrow_server/kernels/merge.py"
LANDMARKS = "sparrow_server/kernels/landmarks.py"
WHOLE_PAGES = "sparrow_server/kernels/page_scores_whole.py"
SUB_ROWS = "tests/gpu/test_sub_rows.py"


@dataclass(frozen=True)
class Break:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    gpus: int = 1


BREAKS = (
    Break("merge_natural_log", "sub-row states weighted as if their log-sum-exps were natural (FlashInfer's: base 2)",
          MERGE, "w = tl.exp2(", "w = tl.exp(",
          (f"{KERNEL_TESTS}::test_sub_rows_merged_equal_the_sparse_layer",)),
    Break("sub_rows_query_of_another_row", "served sub-rows attend with the queries tiled (sub-row i: row i mod rows)",
          MERGE, "out[lead:].view(rows, parts, *q.shape[1:]).copy_(q[:, None].expand(rows, parts, *q.shape[1:]))",
          "out[lead:].view(parts, rows, *q.shape[1:]).copy_(q[None].expand(parts, rows, *q.shape[1:]))",
          (f"{SUB_ROWS}::test_sub_rows_decode_as_flashinfer_s_own_split",)),
    Break("sub_rows_last_page_full", "every sub-row's last page taken as full (the row's partial last page over-read)",
          PLANNING, "sub_last[:, -1] = last_page_len", "sub_last[:, -1] = page_size",
          (f"{KERNEL_TESTS}::test_sub_rows_merged_equal_the_sparse_layer",)),
    Break("schedule_from_wrong_row", "each request planned with the schedule of the batch row before it",
          BACKEND, "schedules = [self.table.schedule_of(int(r)) for r in rows]",
          "schedules = [self.table.schedule_of(int(r)) for r in np.roll(rows, 1)]",
          (f"{SERVING}::test_mixed_batch_equals_alone",)),
    Break("graph_one_schedule_for_all", "under CUDA graphs every request gets the first request's budget",
          BACKEND, "schedules = [self.table.schedule_of(int(r)) for r in rows]",
          "schedules = [self.table.schedule_of(int(rows[0] if graph else r)) for r in rows]",
          (f"{SERVING}::test_mixed_batch_equals_alone",)),
    Break("sink_off_by_one", "one sink page more (one top-k page fewer) than the schedule says",
          PLANNING, "sink, recent = schedule.sink_pages, schedule.recent_pages",
          "sink, recent = schedule.sink_pages + 1, schedule.recent_pages",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",)),
    Break("recent_off_by_one", "one recent page more (one top-k page fewer) than the schedule says",
          PLANNING, "sink, recent = schedule.sink_pages, schedule.recent_pages",
          "sink, recent = schedule.sink_pages, schedule.recent_pages + 1",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",)),
    # The split scoring grid: since call 25 the default serves its batches of up to 264 rows on the fused row
    # programs (the next break), so the serving test no longer runs this kernel; the kernel tests run it at every
    # split variant against the reference scores.
    Break("kv_head_landmarks_swapped", "each KV head's pages scored with the next KV head's landmarks (split grid)",
          KERNELS, "lm = tl.load(lm_ptr + page[:, None] * (H * D) + h * D + d[None, :]",
          "lm = tl.load(lm_ptr + page[:, None] * (H * D) + ((h + 1) % H) * D + d[None, :]",
          (f"{KERNEL_TESTS}::test_rows_past_2048_candidates",)),
    Break("kv_head_landmarks_swapped_fused", "the fused row programs score each KV head's pages with the next KV "
          "head's landmarks", TILES, "tl.load(lm_ptr + page.to(tl.int64)[:, None] * (H * D) + h * D + d[None, :]",
          "tl.load(lm_ptr + page.to(tl.int64)[:, None] * (H * D) + ((h + 1) % H) * D + d[None, :]",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",
           f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do")),
    Break("radix_exit_at_any_bucket", "the top-k's histogram rounds stop after the first whatever its bucket holds "
          "(the whole bucket taken: more pages than k)", RADIX, "(both >= 512).to(tl.int32)", "(both >= 0).to(tl.int32)",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",
           f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do")),
    Break("radix_packed_keys_above_halved", "the packed histogram round counts half the live keys above the chosen "
          "bucket (fused_packed_narrow, the default since call 27)", RADIX, "n_gt + (packed >> 18), exact",
          "n_gt + (packed >> 19), exact",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",
           f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do",
           f"{KERNEL_TESTS}::test_rows_past_2048_candidates")),
    Break("atomic_rounds_share_bins", "the atomic histograms' rounds count into one set of 256 bins, not each its own "
          "zeroed third of the row's (fused_atomic_narrow and the variants built on it, the default "
          "fused_joint_narrow among them)", TOPK,
          "round_bins = bins + (16 - shift) * 32", "round_bins = bins",
          (f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do",
           f"{KERNEL_TESTS}::test_rows_past_2048_candidates")),
    Break("atomic_bins_read_unsynced", "the atomic histograms' bins read without the block barrier after the atomics "
          "(fused_atomic_narrow and the variants built on it, the default fused_joint_narrow among them)", RADIX,
          "tl.debug_barrier()\n    return tl.load(bins + tl.arange(0, 256)", "return tl.load(bins + tl.arange(0, 256)",
          (f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do",
           f"{KERNEL_TESTS}::test_rows_past_2048_candidates")),
    Break("joint_write_second_block_unranked", "the joint write ranks a row's second register block as if no key of "
          "the first were taken (fused_joint_narrow)", RADIX,
          "take2, rank2, n_eq, n_taken = taken_ranks_packed(key2, prefix, need, n_eq, n_taken)\n        slot = ",
          "take2, rank2, n_eq, n_taken = taken_ranks_packed(key2, prefix, need, zero, zero)\n        slot = ",
          (f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do",
           f"{KERNEL_TESTS}::test_rows_past_2048_candidates")),
    Break("hoisted_sink_page_unstored", "a fused row's reserved page ids, gathered before its scoring, stored after it "
          "without the sink page's (fused_hoisted_narrow)", KERNELS,
          "tl.store(out + t, slot * H + h, mask=m)", "tl.store(out + t, slot * H + h, mask=m & (t > 0))",
          (f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do",)),
    Break("hoisted_second_block_ungathered", "the write's page ids of a row's second register block, gathered before "
          "its ranks, gathered for none of its keys (fused_hoisted_narrow)", RADIX,
          "slot2 = tl.load(row + j2.to(tl.int64) * PS, mask=key2 >= prefix, other=0)",
          "slot2 = tl.load(row + j2.to(tl.int64) * PS, mask=key2 < 0, other=0)",
          (f"{KERNEL_TESTS}::test_rows_past_2048_candidates",
           f"{KERNEL_TESTS}::test_one_launch_scores_selects_and_updates_as_two_do")),
    Break("query_copy_one_head", "the fused launch's copy of the query stores every head of a KV head's group into "
          "the group's first slot (fused_qcopy_narrow)", TILES,
          "tl.store(qout_ptr + (b * H * G + h * G + g) * D + d, x)",
          "tl.store(qout_ptr + (b * H * G + h * G) * D + d, x)",
          (f"{KERNEL_TESTS}::test_query_copy_takes_the_strided_query_and_attends_the_same",)),
    Break("query_copy_split_one_head", "the split scoring's copy of the query stores every head of a request into its "
          "first slot (fused_qcopy_narrow past its fused rows)", TILES,
          "tl.store(qout_row + i * D + d, tl.load(q_row + i * D + d))",
          "tl.store(qout_row + d, tl.load(q_row + i * D + d))",
          (f"{KERNEL_TESTS}::test_query_copy_takes_the_strided_query_and_attends_the_same",)),
    Break("kv_store_one_head", "the selection's store of the step's K writes every KV head's key into head 0's "
          "place (fused_kvstore_narrow, both launch paths)", TILES,
          "tl.store(kbuf_ptr + loc * HD + e, tl.load(kin_ptr + b.to(tl.int64) * k_stride + e))",
          "tl.store(kbuf_ptr + loc * HD + (e - first), tl.load(kin_ptr + b.to(tl.int64) * k_stride + e))",
          (f"{KERNEL_TESTS}::test_kv_store_stores_the_step_kv_and_attends_the_same",)),
    Break("kv_store_after_landmark", "a fused row stores the step's K and V after its landmark update read the slot "
          "(fused_kvstore_narrow)", KERNELS,
          f"{_STORE}{_UPDATE}        if SELECT:\n            t, slot, m",
          f"{_UPDATE}{_STORE}        if SELECT:\n            t, slot, m",
          (f"{KERNEL_TESTS}::test_kv_store_stores_the_step_kv_and_attends_the_same",)),
    Break("prefill_landmark_over_15_tokens", "a page's landmark after a prefill divides its 16 keys' sum by 15",
          LANDMARKS, "tl.store(lm_ptr + page * HD + offs, (acc / PS)",
          "tl.store(lm_ptr + page * HD + offs, (acc / (PS - 1))",
          (f"{KERNEL_TESTS}::test_landmark_kernel_matches_reference",)),
    Break("float8_landmark_scale_dropped", "float8 landmarks scored without their pages' scales",
          TILES, "        sc = sc * scale  # a power", "        sc = sc  # a power",
          (f"{KERNEL_TESTS}::test_scores_and_indices_match_reference",
           f"{SERVING}::test_float8_selections_agree_with_the_oracle")),
    Break("float8_landmark_stored_twice_its_scale", "a float8 landmark stored at twice the value its scale says",
          LANDMARKS, "_INV_EXP = tl.constexpr(261)", "_INV_EXP = tl.constexpr(262)",
          (f"{KERNEL_TESTS}::test_landmark_kernel_matches_reference",)),
    Break("query_group_layout", "a KV head's query group read strided (g * H + h) instead of contiguous",
          TILES, "qs += tl.load(q_ptr + (b * H * G + h * G + g) * D + d)",
          "qs += tl.load(q_ptr + (b * H * G + g * H + h) * D + d)",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",)),
    Break("dense_layers_ignored", "the schedule's dense layers decoded sparsely",
          BACKEND, "dense = set(self.table.default.dense_layers)", "dense = set()",
          (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",)),
    Break("landmarks_stale_after_prefill", "prefill does not recompute the landmarks of the pages it writes "
          "(pages keep whatever an earlier request, or the old weights, left)",
          BACKEND, "if lm is not None and save_kv_cache and k is not None and not layer.is_cross_attention:",
          "if False:", (f"{SERVING}::test_sparse_selections_agree_with_the_oracle",)),
    Break("request_dense_layers_ignored", "a request's own dense layers decoded sparsely (the server's only)",
          LAYER_GROUPS, "return frozenset(schedule.dense_layers) & frozenset(sparse_layers)", "return frozenset()",
          (f"{DENSE_LAYERS}::test_the_odd_schedule_changes_the_requests_outputs",
           f"{DENSE_LAYERS}::test_dense_by_budget_equals_the_stock_dense_layers")),
    Break("layer_plans_all_from_group_0", "under CUDA graphs every sparse layer runs the base group's FlashInfer plan",
          LAYER_PLANS, "torch.index_select(self.slot_ws[:, :n], 0, self.group_of_layer)",
          "torch.index_select(self.slot_ws[:, :n], 0, torch.zeros_like(self.group_of_layer))",
          (f"{DENSE_LAYERS}::test_a_request_gets_its_own_dense_layers_in_a_mixed_batch",
           f"{DENSE_LAYERS}::test_cuda_graph_on_off_agree")),
    # A per-slot "landmark computed" mask that the flush on a weight update does not reset: prefill
    # skips slots computed before, so after the update reused slots keep zeroed landmarks. (GPU call 9
    # turned prefill's landmarks off everywhere, call 10 skipped slots whose landmarks were nonzero:
    # neither is this bug, and neither was caught, the first because the fresh server compared with
    # lacked landmarks too, the second because the flush zeroes landmarks, so prefill recomputed them.)
    Break("landmarks_stale_after_update", "prefill skips page slots it computed landmarks for before, by a "
          "mask the weight update's flush does not reset: reused slots keep no landmarks of the new keys",
          BACKEND, "K.update_landmarks(k_buf, forward_batch.out_cache_loc, lm, self.page_size, only_full=True,",
          "loc = forward_batch.out_cache_loc\n"
          "            seen = self.__dict__.setdefault('_seen', {}).setdefault(layer.layer_id, torch.zeros(\n"
          "                lm.shape[0], dtype=torch.bool, device=lm.device))\n"
          "            loc = loc[~seen[loc // self.page_size]]\n"
          "            seen[loc // self.page_size] = True\n"
          "            K.update_landmarks(k_buf, loc, lm, self.page_size, only_full=True,",
          (f"{SERVICE}::test_weight_update_while_streaming",)),
    Break("landmarks_outside_kv_region", "the landmarks allocated outside the memory saver's kv_cache region: "
          "a release frees the KV pool but not them",
          BACKEND, "with kv_cache_region(model_runner):  # released and resumed with the KV pool (memory saver)",
          "if True:", (f"{TRAINER}::test_fresh_rollout_and_discovery",
                       f"{TRAINER}::test_release_and_resume_kv_cache_frees_the_landmarks_with_the_kv_pool")),
    Break("kv_heads_swapped_between_ranks", "each TP rank believes it holds the other rank's KV heads",
          PLANNING, "return tuple(range(rank * n, (rank + 1) * n))",
          "return tuple(range((tp_size - 1 - rank) * n, (tp_size - rank) * n))",
          (f"{TP}::test_each_rank_builds_the_backend_over_its_own_kv_heads",
           f"{TP}::test_each_rank_selects_what_the_oracle_selects"), gpus=2),
    Break("exact_capture_off_by_one", "the decode row kept for generated position g is the one predicting g + 1",
          EXACT_ROWS, "position = length - _prompt_len(req)",
          "position = length - _prompt_len(req) - 1",
          (f"{EXACT}::test_exact_values_match_the_full_logprobs_at_every_kept_position",)),
    Break("exact_dense_step_measured", "a kept position whose step attended every page is compared row against "
          "row (the decode and verify kernels' bf16 difference) instead of scoring 1",
          EXACT_HOOKS, "        if c.dense:", "        if False:",
          (f"{EXACT}::test_a_dense_step_scores_one_where_measuring_would_not",)),
    Break("exact_bound_is_the_value", "the payload's top-k bound is the exact value itself (the top-k lists never "
          "formed)", EXACT_VERIFY, "    bounds = [kept_bound(sparse.float(), dense[have], v.k),",
          "    bounds = [values.float(),",
          (f"{EXACT}::test_the_bound_beside_each_value_is_the_top_k_bound_of_the_same_rows",)),
    Break("deterministic_split_ignored", "under deterministic inference the sparse plans keep tensor cores but "
          "leave the KV split to FlashInfer, which chooses it from the whole batch",
          BACKEND, "non_blocking=True, **split.plan_kwargs())", "non_blocking=True)",
          (f"{DETERMINISTIC}::test_a_request_is_bit_identical_alone_and_in_a_mixed_batch",
           f"{DETERMINISTIC}::test_the_two_batches_agree_on_every_request_they_share")),
    Break("grouped_heads_on_cuda_cores", "the sparse plans stay on FlashInfer's CUDA-core decode where SGLang "
          "chose tensor cores (a GQA group of 4): half the bandwidth on Qwen3-4B",
          DETERMINISM, 'cores = bool(getattr(backend, "decode_use_tensor_cores", False))', "cores = False",
          (f"{GROUPED}::test_each_server_names_the_kernel_of_its_sparse_plans",)),
    Break("tensor_core_graph_plan_stale", "under CUDA graphs the tensor-core sparse layers keep the plan of the "
          "graph's capture: this step's plan is never copied to their workspaces",
          LAYER_PLANS, "        self.layer_ws[:, :n].copy_(",
          "        n = 0 if self.use_tensor_cores else n\n        self.layer_ws[:, :n].copy_(",
          (f"{GROUPED}::test_tensor_core_sparse_decode_under_graphs_equals_eager",
           f"{GROUPED}::test_sparse_decode_on_tensor_cores_equals_cuda_cores")),
    Break("ignore_eos_cut_unaligned", "under deterministic inference an ignore_eos request is cut where the "
          "batch's chunk budget ends, as SGLang's own ignore_eos admission cuts it",
          DETERMINISM, "    if not _admitted_as_ignore_eos(adder, req):", "    if True:",
          (f"{DETERMINISTIC}::test_the_two_batches_agree_on_every_request_they_share",)),
    Break("pages_share_one_page_short", "each program of the whole-page scoring stops one page before its share ends "
          "(the last candidate of every share left unscored)",
          WHOLE_PAGES, "lo + (p * n) // nprog, lo + ((p + 1) * n) // nprog,",
          "lo + (p * n) // nprog, lo + ((p + 1) * n) // nprog - 1,",
          (f"{KERNEL_TESTS}::test_whole_page_scoring_past_the_fused_rows",)),
    Break("pages_query_of_the_next_head", "the whole-page scoring scores each KV head's landmarks against the next "
          "head's group query",
          WHOLE_PAGES, "qs += tl.load(q_row + (h[:, None] * G + g) * D + d[None, :])",
          "qs += tl.load(q_row + (((h[:, None] + 1) % H) * G + g) * D + d[None, :])",
          (f"{KERNEL_TESTS}::test_whole_page_scoring_past_the_fused_rows",)),
)


def by_name(names) -> list[Break]:
    known = {b.name: b for b in BREAKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown break(s) {unknown}: one of {sorted(known)}")
    return [known[n] for n in names] if names else list(BREAKS)


def apply(root: Path, brk: Break) -> None:
    path = root / brk.path
    text = path.read_text()
    if text.count(brk.old) != 1:
        raise ValueError(f"{brk.name}: {brk.path} holds the text to replace {text.count(brk.old)} times (want 1)")
    path.write_text(text.replace(brk.old, brk.new))


def copy_tree(dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", ".whl*", ".kit", ".rt", "__pycache__", ".gpu*",
                                                               ".model*"))
    return dest


def run_one(brk: Break, gpus: str, port_offset: int, out: Path, timeout_s: float) -> dict:
    tree = copy_tree(Path("/tmp") / f"break-{brk.name}")
    apply(tree, brk)
    log = out / f"break-{brk.name}.log"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus, SPARROW_GPU_PORT_OFFSET=str(port_offset),
               OUT=str(tree / "out"), PYTHONPATH=f"{tree}:{os.environ.get('PYTHONPATH', '')}")
    (tree / "out").mkdir()
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "pytest", *PYTEST_ARGS,
                               f"--basetemp=/tmp/break-{brk.name}-pytest", *brk.tests], cwd=tree, env=env,
                              stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
    return {"break": brk.name, "what": brk.what, "file": brk.path,
            **outcome(log.read_text(errors="replace"), proc.returncode), "seconds": round(time.time() - t0, 1)}


# -rfE: the short summary names failed and errored tests (call 26's breaks ran -rf: a server that crashed on a break
# errored in its fixture and went unrecorded)
PYTEST_ARGS = ("-q", "-p", "no:cacheprovider", "-rfE")


def outcome(pytest_log: str, returncode: int) -> dict:
    """Caught means a test's check failed. A fixture's ERROR (a server that never started, a hang cut by a
    timeout) shows no check seeing the break: recorded, not counted."""
    lines = pytest_log.splitlines()
    failed = [line.split(" ")[1] for line in lines if line.startswith("FAILED ")]
    errored = [line.split(" ")[1] for line in lines if line.startswith("ERROR ")]
    return {"caught": bool(failed) and returncode != 0, "failed_tests": failed, "errored_tests": errored,
            "returncode": returncode}


def port_offset(gpu: str) -> int:
    """Ports of a break's servers: apart from the unbroken suite's (offset 0) and from other GPUs' lanes."""
    return 1000 * (1 + int(gpu))


def run(breaks: list[Break], gpus: list[str], out: Path, timeout_s: float) -> list[dict]:
    """One break per GPU at a time (a two-GPU break takes every GPU); results in the breaks' order."""
    out.mkdir(parents=True, exist_ok=True)
    single = [b for b in breaks if b.gpus == 1]
    results = {}
    with ThreadPoolExecutor(len(gpus)) as pool:
        lanes = [single[i::len(gpus)] for i in range(len(gpus))]

        def lane(i: int) -> None:
            for b in lanes[i]:
                results[b.name] = run_one(b, gpus[i], port_offset(gpus[i]), out, timeout_s)

        list(pool.map(lane, range(len(gpus))))
    for b in breaks:
        if b.gpus > 1:
            results[b.name] = (run_one(b, ",".join(gpus), port_offset(gpus[0]), out, timeout_s) if len(gpus) >= b.gpus else
                               {"break": b.name, "skipped": f"needs {b.gpus} GPUs"})
    ordered = [results[b.name] for b in breaks]
    with open(out / "breaks.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in ordered)
    return ordered


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    sub.add_parser("check")
    r = sub.add_parser("run")
    r.add_argument("--gpus", default="0", help="comma-separated GPU ids, one lane each")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*", default=[])
    r.add_argument("--timeout-s", type=float, default=500)
    args = ap.parse_args()
    if args.cmd == "list":
        for b in BREAKS:
            print(f"{b.name}: {b.what} ({b.path}; caught by {', '.join(t.split('::')[1] for t in b.tests)})")
        return 0
    if args.cmd == "check":
        for b in BREAKS:
            text = (ROOT / b.path).read_text()
            assert text.count(b.old) == 1, (b.name, text.count(b.old))
        print(f"{len(BREAKS)} breaks apply")
        return 0
    results = run(by_name(args.only), args.gpus.split(","), args.out, args.timeout_s)
    for res in results:
        print(json.dumps(res))
    return 0 if all(res.get("caught") for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
