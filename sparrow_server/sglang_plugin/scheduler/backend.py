"""The ``sparrow`` attention backend: FlashInfer prefill, block-sparse FlashInfer decode.

A thin adapter over SGLang's ``FlashInferAttnBackend``:
- extend (prefill) and the server's dense layers (the default schedule's, fixed at start) run the
  stock FlashInfer paths unchanged;
- per decode step, ``planning.plan_step`` turns each request's schedule and length into page
  counts on the host (no device sync) and one FlashInfer plan with one row per
  (request, KV head), G query heads, page size 16, over a per-head strided view of the pool;
  a request whose schedule keeps one of the server's sparse layers dense attends all its pages
  there (dense by budget): ``layer_groups`` groups the sparse layers by the requests planned dense
  on them (one group unless a request asks), and ``layer_plans`` gives each layer its group's
  fields and FlashInfer plan, in buffers of its own under CUDA graphs;
- per sparse layer, inside the CUDA graph, ``kernels.sparse_decode.score_and_select``: Triton launches whose
  work follows each request's page count (not ``--context-length``): ``page_scores`` (landmark
  scoring, the landmark of the page this step completes folded in), then ``select_and_write``
  (exact radix-select top-k, the row's scores held in registers when they fit, else streamed,
  fused with writing the FlashInfer page ids into the wrapper's index buffer), or for a fused
  selection variant one launch of both, a program per (request, KV head) row; then FlashInfer
  decode over the selected pages (with ``SPARROW_SUB_ROWS`` N > 1, under CUDA graphs: each row's pages as N rows of
  their own on FlashInfer's tensor cores, unsplit, their states merged by ``kernels.merge``).
Deterministic inference (``--enable-deterministic-inference``): SGLang's parent class plans prefill and
the dense layers batch-invariantly; ``determinism.backend_splits`` gives the sparse plans the same
policy (tensor-core decode, no KV split under CUDA graphs, a fixed split eagerly), so a request's
sparse decode does not depend on its batch (the selection kernels never did: every program reads
one request's query, landmarks and plan fields).
Landmarks (mean post-RoPE key per page and KV head) live in a side cache per sparse layer,
sized at backend creation from the KV pool, inside the memory saver's ``kv_cache`` region
(``landmarks.kv_cache_region``).

Tensor parallelism: each TP rank's scheduler process builds its own backend over its own KV pool,
whose heads are the rank's (``get_num_kv_heads(attn_tp_size)``); every count here (rows,
landmarks, group size) is that rank's, and the plan's per-request fields depend on no rank, so
every rank runs the same budgets and selects for its own heads (``planning.rank_plan``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, KVWriteLoc
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from sparrow_server.kernels import sparse_decode as K
from sparrow_server.kernels.merge import merge_parts, sub_row_queries
from sparrow_server.kernels.reference import zero_landmarks
from sparrow_server.sglang_plugin.scheduler import state
from sparrow_server.sglang_plugin.config import PAGE_SIZE
from sparrow_server.sglang_plugin.scheduler.determinism import FLASHINFER_CHOICE, backend_splits
from sparrow_server.sglang_plugin.scheduler.hooks import ROWS_ATTR
from sparrow_server.sglang_plugin.scheduler.layer_groups import (
    LayerGroups, extra_dense_layers, group_layers, group_plans,
)
from sparrow_server.sglang_plugin.scheduler.layer_plans import EagerLayerPlans, GraphLayerPlans, LayerDecode
from sparrow_server.sglang_plugin.scheduler.planning import EMPTY_ROWS, StepPlan, plan_step, rank_kv_heads
from sparrow_server.sglang_plugin.scheduler.selection_debug import recorder_from_env
from sparrow_server.sglang_plugin.scheduler.landmarks import kv_cache_region

logger = logging.getLogger(__name__)

LOG_EVERY = 500  # decode steps between sparsity log lines


def plain_token_major_pool(pool) -> bool:
    """Whether ``pool.set_kv_buffer`` of a step's K and V of the pool's dtype is a plain store of each token's
    [H, D] row at its slot (SGLang 0.5.17's ``MHATokenToKVPool``, unquantized, token-major "nhd", no subclass)."""
    return (type(pool) is MHATokenToKVPool and not pool.is_quantized_kv_cache and pool.store_dtype == pool.dtype
            and not pool.use_hnd and pool.kv_cache_layout == "nhd")


def _rank_heads(model_runner, local_heads: int) -> tuple[int, ...]:
    """Global KV heads of this attention-TP rank (its pool holds ``local_heads``), checked against
    SGLang's own split so a partition we do not mirror fails at start, not in the selections."""
    from sglang.srt.runtime_context import get_parallel

    par = get_parallel()
    total = model_runner.model_config.get_total_num_kv_heads()
    heads = rank_kv_heads(total, par.attn_tp_size, par.attn_tp_rank)
    if len(heads) != local_heads:
        raise RuntimeError(f"sparrow: TP rank {par.attn_tp_rank}/{par.attn_tp_size} holds {local_heads} of {total} "
                           f"KV heads; expected {len(heads)}")
    return heads


@dataclass
class _Step:
    """Device-side view of one decode step's plan, consumed by every sparse layer."""

    plan: StepPlan          # the base plan (every request at its budget), for accounting
    plans: list             # one StepPlan per layer group (``layer_groups``); plans[0] is ``plan``
    groups: LayerGroups
    layers: dict            # sparse layer id -> LayerDecode (its fields, row pointers, wrapper)
    indices: torch.Tensor   # int32 FlashInfer page ids (the wrappers' buffer)
    scores: torch.Tensor    # [bs * Hkv, Pcap] float32 (each row read on its candidate range only)
    rows: np.ndarray        # host: KV row of each request (for the selection debug hook)
    lengths: np.ndarray     # host: tokens attended by each request this step
    real_bs: int

    def plan_of(self, layer: int) -> StepPlan:
        return self.plans[self.groups.group_of(layer)]


class SparrowAttnBackend(FlashInferAttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner, init_new_workspace=model_runner.init_new_workspace)
        cfg = state.config()
        if self.page_size != PAGE_SIZE:
            raise ValueError(f"--page-size={self.page_size}: the sparrow backend needs --page-size {PAGE_SIZE}")
        upd = self.indices_updater_decode
        self.num_kv_heads, self.num_qo_heads, self.head_dim = upd.num_kv_heads, upd.num_qo_heads, upd.head_dim
        self.group = self.num_qo_heads // self.num_kv_heads
        self.kv_heads = _rank_heads(model_runner, self.num_kv_heads)  # global ids, this TP rank's
        self.q_dtype, self.kv_dtype = upd.q_data_type, upd.data_type
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.table = state.table(self.req_to_token.shape[0])
        self.pcap = math.ceil(self.max_context_len / self.page_size)
        self.topk_cap = min(cfg.topk_cap_pages, self.pcap)  # pcap >= 1; lengths never exceed it
        self.select_variant = cfg.select_variant_for(self.group)  # which selection kernels (same pages, other speed)
        # the selection's launch copies the query for the attention, and stores the step's K and V itself where its
        # variant does and the pool is plain: decided once here, not per layer
        self.copies_query = K.copies_query(self.select_variant)
        self.stores_kv = K.stores_kv(self.select_variant) and plain_token_major_pool(self.token_to_kv_pool)
        # FlashInfer's KV split of the sparse plans (eager, graph): batch-invariant under deterministic inference
        self.split_eager, self.split_graph = backend_splits(self, self.page_size)
        # sub-rows replace FlashInfer's own split of the CUDA-core graph plan only (``config.ENV_SUB_ROWS``)
        self.sub_rows = cfg.sub_rows if self.split_graph == FLASHINFER_CHOICE else 1
        if self.sub_rows != cfg.sub_rows:
            logger.warning("sparrow: SPARROW_SUB_ROWS=%d ignored: the graph plan is %s, not FlashInfer's CUDA-core "
                           "split", cfg.sub_rows, self.split_graph)
        pool = self.token_to_kv_pool
        first, n_layers = pool.start_layer, pool.layer_num
        dense = set(self.table.default.dense_layers)
        lm_dtype = getattr(torch, cfg.landmark_dtype)
        n_slots = pool.get_key_buffer(first).shape[0]
        with kv_cache_region(model_runner):  # released and resumed with the KV pool (memory saver)
            side = {layer: zero_landmarks(n_slots // self.page_size, self.num_kv_heads, self.head_dim, lm_dtype,
                                          model_runner.device)
                    for layer in range(first, first + n_layers) if layer not in dense}
        self.landmarks = {layer: lm for layer, (lm, _) in side.items()}
        # float8 landmarks' scales, a power of two per (page, KV head) (kernels.reference.store_landmarks)
        self.landmark_scales = {layer: s for layer, (_, s) in side.items() if s is not None}
        self.sparse_layers = tuple(sorted(self.landmarks))
        self._extra: dict[int, frozenset] = {}  # schedule slot -> the sparse layers its schedule keeps dense
        self.eager_plans = EagerLayerPlans(self.workspace_buffer, self.sparse_layers, self.num_kv_heads,
                                           use_tensor_cores=self.split_eager.use_tensor_cores)
        self.graph_plans: GraphLayerPlans | None = None
        self.step: _Step | None = None
        self._warned: set[str] = set()
        self.selection_recorder = recorder_from_env(self.page_size, self.num_kv_heads,  # None unless debugging
                                                    heads=self.kv_heads)
        side = (*self.landmarks.values(), *self.landmark_scales.values())
        lm_mib = sum(t.numel() * t.element_size() for t in side) / 2**20
        logger.info("sparrow backend: %d sparse layers, dense layers %s, landmarks %.0f MiB (%s), top-k cap %d "
                    "pages, Pcap %d, rows = request x %d KV heads (global %s), G = %d, selection %s, "
                    "KV split eager %s / graph %s, graph sub-rows %d, step K/V stored by the selection %s",
                    len(self.landmarks), sorted(dense), lm_mib, cfg.landmark_dtype, self.topk_cap, self.pcap,
                    self.num_kv_heads, list(self.kv_heads), self.group, self.select_variant, self.split_eager,
                    self.split_graph, self.sub_rows, self.stores_kv)

    # ---- CUDA graph state -------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None):
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)
        rows = max_bs * self.num_kv_heads
        self.graph_plans = GraphLayerPlans(self.sparse_layers, max_bs, self.num_kv_heads, self.pcap,
                                           use_tensor_cores=self.split_graph.use_tensor_cores, max_parts=self.sub_rows)
        self.g_scores = torch.empty(rows, self.pcap, dtype=torch.float32, device="cuda")

    # ---- per-step planning (host) -----------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self._plan(forward_batch, graph=False, in_capture=False)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        self._plan(forward_batch, graph=True, in_capture=in_capture)

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg)

    def _host_inputs(self, fb, bs: int, in_capture: bool):
        rows = getattr(fb, ROWS_ATTR, None)
        if rows is None:
            if in_capture:
                rows = []
            else:
                self._warn_once("rows", "sparrow: no host KV rows on the batch (hook missing?); reading them from the GPU")
                rows = fb.req_pool_indices[:bs].tolist()
        rows = np.asarray(list(rows)[:bs] + [0] * (bs - min(len(rows), bs)), dtype=np.int64)
        if fb.seq_lens_cpu is not None:
            lengths = fb.seq_lens_cpu[:bs].numpy()
        else:
            self._warn_once("lens", "sparrow: no seq_lens_cpu; reading lengths from the GPU")
            lengths = fb.seq_lens[:bs].cpu().numpy()
        return rows, lengths.astype(np.int64)

    def _log_step(self, plan: StepPlan, lengths: np.ndarray, real_bs: int) -> None:
        """Every LOG_EVERY steps: attended vs total tokens per request (evidence of sparsity in the log)."""
        self._steps = getattr(self, "_steps", 0) + 1
        if self._steps % LOG_EVERY == 0 and real_bs > 0:
            logger.info("sparrow step %d: batch %d, mean attended tokens/request/sparse layer %.0f of %.0f",
                        self._steps, real_bs, plan.budget_tokens[:real_bs].mean(), lengths[:real_bs].mean())

    def _plan(self, fb, graph: bool, in_capture: bool) -> None:
        if not fb.forward_mode.is_decode_or_idle() or fb.batch_size == 0 or fb.forward_mode.is_idle():
            self.step = None
            return
        bs = fb.batch_size
        rows, lengths = self._host_inputs(fb, bs, in_capture)
        real_bs = bs - int(getattr(fb, "num_padding", 0) or 0)
        if self.selection_recorder is not None:
            self.selection_recorder.flush()
        schedules = [self.table.schedule_of(int(r)) for r in rows]
        plan = plan_step(schedules, lengths, self.table.prompt_len[rows], self.num_kv_heads, self.page_size,
                         self.topk_cap)
        groups = group_layers(self._extra_dense(rows), plan.count < plan.n_pages, self.sparse_layers)
        plans = group_plans(plan, groups)
        if not in_capture:
            self.table.record_step(rows, plan.budget_tokens)
            self._log_step(plan, lengths, real_bs)
            if plan.clamped:
                self.table.clamped_steps += plan.clamped
                self._warn_once("clamp", f"sparrow: a budget exceeds the top-k cap of {self.topk_cap} pages; "
                                         "clamped (raise SPARROW_TOPK_CAP_TOKENS)")
        nrows = bs * self.num_kv_heads
        plan_args = (self.group, 1, self.head_dim, self.page_size)
        split = self.split_graph if graph else self.split_eager
        plan_kwargs = dict(data_type=self.kv_dtype, q_data_type=self.q_dtype, non_blocking=True, **split.plan_kwargs())
        if graph:
            if in_capture:
                self.graph_plans.capture(bs, self.workspace_buffer, plan, plan_args, plan_kwargs, parts=self.sub_rows)
            layers = self.graph_plans.step(bs, plans, groups, plan_args, plan_kwargs)
            indices, scores = self.graph_plans.indices, self.g_scores[:nrows]
        else:
            layers, indices = self.eager_plans.step(bs, plans, groups, plan_args, plan_kwargs)
            scores = torch.empty(nrows, self.pcap, dtype=torch.float32, device="cuda")
        self.step = _Step(plan, plans, groups, layers, indices, scores, rows, lengths, real_bs)

    def _extra_dense(self, rows: np.ndarray) -> list[frozenset]:
        """Each request's extra dense layers, cached by schedule slot (a slot keeps its schedule)."""
        out = []
        for slot in self.table.schedule_slot[rows].tolist():
            extra = self._extra.get(slot)
            if extra is None:
                extra = self._extra[slot] = extra_dense_layers(self.table.schedule_in(slot), self.sparse_layers)
            out.append(extra)
        return out

    def _step_kv(self, k, v, k_buf, v_buf) -> tuple | None:
        """The step's K and V as the selection's launch stores them (``sparse_decode.score_and_select``'s
        ``store_kv``), or None where ``set_kv_buffer`` must: a variant that does not store, a pool that is not
        plain, a dtype that ``set_kv_buffer`` would cast (and scale), a hybrid pool's SWA slots."""
        if not self.stores_kv or k.dtype != k_buf.dtype or v.dtype != v_buf.dtype:
            return None
        if self.forward_metadata.swa_out_cache_loc is not None:
            return None
        k3, v3 = (t.reshape(t.shape[0], *k_buf.shape[1:]) for t in (k, v))  # views of SGLang's QKV slices
        return k3, v3, v_buf

    # ---- layers -----------------------------------------------------------------------------
    # Under --enable-torch-compile SGLang compiles the model's forward around these calls: dynamo must not trace
    # them (their host-planned step state and Triton launches on side buffers are not graph inputs it could track),
    # so each call is a graph break that runs eagerly, captured in the decode CUDA graph as without compile.
    @torch.compiler.disable
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        o = super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        lm = self.landmarks.get(layer.layer_id)
        if lm is not None and save_kv_cache and k is not None and not layer.is_cross_attention:
            k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
            K.update_landmarks(k_buf, forward_batch.out_cache_loc, lm, self.page_size, only_full=True,
                               landmark_scales=self.landmark_scales.get(layer.layer_id))
        return o

    @torch.compiler.disable
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        lm = self.landmarks.get(layer.layer_id)
        step = self.step
        if lm is None or step is None or layer.is_cross_attention:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        cache_loc = forward_batch.out_cache_loc
        pool = self.token_to_kv_pool
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        store_kv = None
        if k is not None and save_kv_cache:
            store_kv = self._step_kv(k, v, k_buf, v_buf)
            if store_kv is None:
                pool.set_kv_buffer(layer, KVWriteLoc(cache_loc, self.forward_metadata.swa_out_cache_loc), k, v,
                                   *self._kv_write_scales(layer))
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)  # SGLang's q: a slice of the QKV output, strided
        # the attention reads a contiguous query: the selection's launch writes it where its variant copies the
        # query (no copy kernel of its own; at every batch size, so one compiled launch), else q.contiguous()
        q_out = K.query_copy(q3, self.copies_query)
        if q_out is None:
            q3 = q3.contiguous()
        rpi = forward_batch.req_pool_indices
        decode: LayerDecode = step.layers[layer.layer_id]
        f = decode.fields
        K.score_and_select(q3, lm, self.req_to_token, rpi, f, decode.row_indptr, self.page_size, step.scores,
                           step.indices, k_buf=k_buf, cache_loc=cache_loc, variant=self.select_variant, q_out=q_out,
                           store_kv=store_kv, landmark_scales=self.landmark_scales.get(layer.layer_id))
        if self.selection_recorder is not None:
            self.selection_recorder.record(layer.layer_id, step.rows, step.lengths, self.table.prompt_len[step.rows],
                                           step.plan_of(layer.layer_id).row_indptr, step.indices, self.req_to_token,
                                           step.real_bs)
        kv = (K.per_head_kv_view(k_buf, self.page_size), K.per_head_kv_view(v_buf, self.page_size))
        q_att = (q3 if q_out is None else q_out).view(-1, self.group, layer.head_dim)
        scales = dict(sm_scale=layer.scaling, logits_soft_cap=layer.logit_cap, k_scale=layer.k_scale_float,
                      v_scale=layer.v_scale_float)
        if decode.parts > 1:
            o = self._attend_sub_rows(decode, q_att, kv, scales)
        else:
            o = decode.wrapper.forward(q_att, kv, **scales)
        return o.view(-1, layer.tp_q_head_num * layer.head_dim)

    @staticmethod
    def _attend_sub_rows(decode: LayerDecode, q: torch.Tensor, kv: tuple, scales: dict) -> torch.Tensor:
        """Each row's query once per sub-row, FlashInfer's output and log-sum-exp of each sub-row (after the
        plan's empty rows), merged."""
        v, lse = decode.wrapper.forward_return_lse(sub_row_queries(q, decode.parts, EMPTY_ROWS), kv, **scales)
        return merge_parts(v[EMPTY_ROWS:], lse[EMPTY_ROWS:], decode.parts, torch.empty_like(q))
