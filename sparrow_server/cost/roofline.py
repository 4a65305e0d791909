"""Roofline cost of dense vs block-sparse decode, and the predicted rollout speedup of a schedule.

Every formula of the model lives in this module (docs/cost-model.md explains them). Per decode
step of ``batch`` requests that each attend ``L`` tokens (prompt + generated, current included):

- FLOPs per request: ``2 * matmul_params`` (linear layers) + per dense layer ``4 * Hq * hd * L``
  (QK and AV) + per sparse layer ``4 * Hq * hd * A + 2 * Hkv * hd * S`` (attention over the ``A``
  selected tokens, and scoring ``S`` landmarks);
- bytes per step: the weights once (``matmul_params * weight_bytes``, shared by the batch) + per
  request the KV read: dense layers ``L`` tokens, sparse layers ``A`` tokens, both at
  ``2 * Hkv * hd * kv_bytes`` per token per layer, + ``S`` landmarks of ``Hkv * hd`` elements in the server's
  landmark dtype (``landmark_element_bytes``; bfloat16 by default);
- time = max(FLOPs / peak FLOP/s, bytes / HBM bytes/s) + the hardware's fitted per-step costs times their
  counts (``step_fit.py``: per step, per request, per layer, per TFLOP of the linear layers, per GB of KV
  read on the CUDA-core decode per GB the batch holds, and for a step that selects pages per sparse layer, per
  request and sparse layer, per scored page): the presets carry costs fitted to measured SGLang decode and
  rollouts; ``Hardware.roofline()`` zeroes them (the pure roofline).

A sparse layer keeps ``budget_pages`` pages including the partial last one, so
``A = (budget_pages - 1) * ps + last_page_len``; it scores the ``n_pages - recent_pages`` pages
the reference scores (``[0, n_pages - recent)``). A step whose sequence fits in the budget is
dense (``A = L``, ``S = 0``). Top-k, the query summary and the new token's KV write are ignored
(each under 1% of the step). A rollout group is one dense prefill of the prompt (shared by the
``samples`` generations through the prefix cache) followed by ``samples`` decodes. ``batch`` requests decode
together in the waves SGLang admits (``rollout_waves``): as many as the KV pool holds at full length
(``kv_pool_tokens``, SGLang's ``max_total_num_tokens``; no limit when not given), the next wave after them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparrow_server.cost.hardware import HARDWARE_PRESETS, DEFAULT_HARDWARE, Hardware
from sparrow_server.cost.model_shape import ModelShape
from sparrow_server.cost.step_fit import STEP_COST_TERMS, step_cost_counts
from sparrow_server.kernels import DEFAULT_LANDMARK_DTYPE, LANDMARK_STORAGE_DTYPES
from sparrow_server.sparsity.schedule import Schedule, dense_schedule

DEFAULT_DECODE_BATCH = 64
DEFAULT_SAMPLES = 8  # generations per prompt (the paper's N)
LANDMARK_BYTES = 2  # a landmark element in DEFAULT_LANDMARK_DTYPE, bfloat16 (accumulated in fp32, as in the reference)
# SGLang decodes bf16 KV on FlashInfer's tensor-core kernel from a GQA group of 4 (should_use_tensor_core,
# flashinfer_backend.py), below it on the CUDA-core kernel; the sparse layers take the same choice
# (docs/gpu-serving.md). Only the CUDA-core decode pays step_fit's cuda_core_kv_s.
TENSOR_CORE_DECODE_GROUP = 4


def landmark_element_bytes(dtype: str, head_dim: int) -> float:
    """Bytes the scoring reads per landmark element stored in ``dtype`` (a server's SPARROW_LANDMARK_DTYPE): float8
    adds its float32 scale per page and KV head (``kernels.reference.store_landmarks``), 4 / head_dim an element."""
    per = {"bfloat16": 2.0, "float32": 4.0, "float8_e4m3fn": 1.0 + 4.0 / head_dim}
    assert set(per) == set(LANDMARK_STORAGE_DTYPES), "a landmark dtype the kernels store has no size here"
    if dtype not in per:
        raise ValueError(f"landmark dtype {dtype!r}: one of {sorted(per)}")
    return per[dtype]


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode step of a batch reads."""

    weights: float
    kv: float
    landmarks: float

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.landmarks


@dataclass(frozen=True)
class RooflineBytes:
    dense: StepBytes
    sparse: StepBytes

    @property
    def ratio(self) -> float:
        """Dense / sparse bytes of the whole step (weights included)."""
        return self.dense.total / self.sparse.total

    @property
    def attention_ratio(self) -> float:
        """Dense / sparse bytes of attention alone (KV + landmarks): what a decode-kernel benchmark sees."""
        return (self.dense.kv + self.dense.landmarks) / (self.sparse.kv + self.sparse.landmarks)


@dataclass(frozen=True)
class RolloutEstimate:
    """Predicted cost of one prompt's rollout group (one prefill, ``samples`` generations)."""

    prefill_s: float
    dense_decode_s: float  # per generation, summed over its steps (step time / batch)
    sparse_decode_s: float
    samples: int
    gen_len: int
    decode_waves: tuple[int, ...] = ()  # batch sizes the KV pool admits the decode in (rollout_waves)

    @property
    def dense_s(self) -> float:
        return self.prefill_s + self.samples * self.dense_decode_s

    @property
    def sparse_s(self) -> float:
        return self.prefill_s + self.samples * self.sparse_decode_s

    @property
    def speedup(self) -> float:
        return self.dense_s / self.sparse_s

    @property
    def dense_tokens_per_s(self) -> float:
        return self.samples * self.gen_len / self.dense_s

    @property
    def sparse_tokens_per_s(self) -> float:
        return self.samples * self.gen_len / self.sparse_s


def _sparse_layer_count(model: ModelShape, schedule: Schedule) -> int:
    if schedule.is_dense:
        return 0
    return model.num_layers - len({layer for layer in schedule.dense_layers if layer < model.num_layers})


def _attended_and_scored(schedule: Schedule, lengths: np.ndarray, prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step: tokens a sparse layer attends (A) and landmarks it scores (S). lengths: [S] -> ([S], [S])."""
    ps = schedule.page_size
    n_pages = -(-lengths // ps)
    if schedule.is_dense:
        return lengths.astype(np.float64), np.zeros(lengths.shape)
    basis = lengths if schedule.length_basis == "total" else np.maximum(lengths - prompt_len, 0)
    bins = np.minimum(basis // schedule.bin_tokens, len(schedule.budgets_tokens) - 1)
    budget_pages = np.asarray(schedule.budgets_tokens, dtype=np.int64)[bins] // ps
    last_page_len = lengths - (n_pages - 1) * ps
    sparse = n_pages > budget_pages
    attended = np.where(sparse, (budget_pages - 1) * ps + last_page_len, lengths)
    scored = np.where(sparse, n_pages - schedule.recent_pages, 0)
    return attended.astype(np.float64), scored.astype(np.float64)


def step_flops_and_bytes(
    model: ModelShape, schedule: Schedule, lengths, batch: int, prompt_len: int = 0,
    landmark_bytes: float = LANDMARK_BYTES,
) -> tuple[np.ndarray, StepBytes]:
    """FLOPs and bytes of decode steps at each length. lengths: [S] int -> (flops [S], StepBytes of [S] arrays).
    ``landmark_bytes``: per landmark element (``landmark_element_bytes``)."""
    if batch < 1:
        raise ValueError(f"batch = {batch!r}: must be >= 1")
    lengths = np.atleast_1d(np.asarray(lengths, dtype=np.int64))
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"lengths: minimum {lengths.min()} must be >= 1")
    n_sparse = _sparse_layer_count(model, schedule)
    n_dense = model.num_layers - n_sparse
    attended, scored = _attended_and_scored(schedule, lengths, prompt_len)
    hq_hd, hkv_hd = model.num_q_heads * model.head_dim, model.num_kv_heads * model.head_dim
    flops_req = (
        2.0 * model.matmul_params
        + n_dense * 4.0 * hq_hd * lengths
        + n_sparse * (4.0 * hq_hd * attended + 2.0 * hkv_hd * scored)
    )
    kv_token_layer = 2.0 * hkv_hd * model.kv_bytes
    kv_req = kv_token_layer * (n_dense * lengths + n_sparse * attended)
    landmark_req = n_sparse * scored * hkv_hd * landmark_bytes
    weights = np.full(lengths.shape, float(model.matmul_params * model.weight_bytes))
    return batch * flops_req, StepBytes(weights, batch * kv_req, batch * landmark_req)


def step_roofline_and_counts(
    model: ModelShape, schedule: Schedule, lengths, batch: int, hardware: Hardware, prompt_len: int = 0,
    landmark_bytes: float = LANDMARK_BYTES,
) -> tuple[np.ndarray, np.ndarray]:
    """Roofline seconds of decode steps at each length, and what each fitted per-step cost multiplies
    (``step_fit.step_cost_counts``): [S] -> ([S], [S, len(STEP_COST_TERMS)])."""
    flops, nbytes = step_flops_and_bytes(model, schedule, lengths, batch, prompt_len, landmark_bytes)
    roofline = np.maximum(flops / hardware.peak_flops, nbytes.total / hardware.mem_bytes_per_s)
    lengths = np.atleast_1d(np.asarray(lengths, dtype=np.int64))
    _, scored = _attended_and_scored(schedule, lengths, prompt_len)
    selecting = scored > 0  # the step scores landmarks: the sparse path's own kernels run
    held = batch * lengths * float(model.kv_bytes_per_token)  # the pool keeps every layer's KV, sparse or not
    cuda_cores = model.num_q_heads // model.num_kv_heads < TENSOR_CORE_DECODE_GROUP
    return roofline, step_cost_counts(batch, model.num_layers, _sparse_layer_count(model, schedule), selecting, scored,
                                      np.full(lengths.shape, batch * 2.0 * model.matmul_params),
                                      (nbytes.kv + nbytes.landmarks) * cuda_cores, held)


def step_time_s(model: ModelShape, schedule: Schedule, lengths, batch: int, hardware: Hardware, prompt_len: int = 0,
                landmark_bytes: float = LANDMARK_BYTES):
    """Roofline time of decode steps of ``batch`` requests at each length, plus the hardware's fitted
    per-step costs: [S] -> [S] seconds."""
    roofline, counts = step_roofline_and_counts(model, schedule, lengths, batch, hardware, prompt_len, landmark_bytes)
    return roofline + counts @ hardware.step_costs


def rollout_waves(requests: int, tokens_per_request: int, kv_pool_tokens: int | None = None,
                  max_running: int | None = None) -> list[int]:
    """Batch sizes SGLang decodes ``requests`` equal requests in: each wave admits what the KV pool holds at
    full length (``kv_pool_tokens // tokens_per_request``; no limit when ``kv_pool_tokens`` is None), up to
    ``max_running`` (default: all of them); the next wave starts after it."""
    if isinstance(requests, bool) or not isinstance(requests, (int, np.integer)) or requests < 1:
        raise ValueError(f"requests = {requests!r}: must be an integer >= 1")
    per_wave = requests if max_running is None else min(requests, max_running)
    if kv_pool_tokens is not None:
        per_wave = min(per_wave, kv_pool_tokens // tokens_per_request)
    if per_wave < 1:
        raise ValueError(f"tokens_per_request = {tokens_per_request}: larger than the KV pool ({kv_pool_tokens})")
    full, rest = divmod(int(requests), per_wave)
    return [per_wave] * full + ([rest] if rest else [])


def rollout_decode_roofline_and_counts(
    model: ModelShape, schedule: Schedule, prompt_len: int, gen_len: int, requests: int, hardware: Hardware,
    kv_pool_tokens: int | None = None, max_running: int | None = None, landmark_bytes: float = LANDMARK_BYTES,
) -> tuple[float, np.ndarray, list[int]]:
    """Decode of ``requests`` requests of ``prompt_len`` + ``gen_len`` tokens, in the waves the KV pool admits
    (``rollout_waves``), each wave's requests in lockstep through every length ``prompt_len + 1 ..
    prompt_len + gen_len``: (roofline seconds, fitted-cost counts [len(STEP_COST_TERMS)], both summed over
    every step of every wave; the waves)."""
    lengths = prompt_len + np.arange(1, gen_len + 1)
    waves = rollout_waves(requests, prompt_len + gen_len, kv_pool_tokens, max_running)
    roofline, counts = 0.0, np.zeros(len(STEP_COST_TERMS))
    for batch in waves:
        roof, c = step_roofline_and_counts(model, schedule, lengths, batch, hardware, prompt_len, landmark_bytes)
        roofline, counts = roofline + float(roof.sum()), counts + c.sum(axis=0)
    return roofline, counts, waves


def prefill_time_s(model: ModelShape, prompt_len: int, hardware: Hardware) -> float:
    """Dense causal prefill of one prompt: 2 * matmul_params * L + layers * 2 * Hq * hd * L^2 FLOPs,
    weights + the written KV as bytes."""
    if prompt_len <= 0:
        return 0.0
    flops = 2.0 * model.matmul_params * prompt_len + model.num_layers * 2.0 * model.num_q_heads * model.head_dim * prompt_len**2
    nbytes = model.matmul_params * model.weight_bytes + prompt_len * model.kv_bytes_per_token
    return max(flops / hardware.peak_flops, nbytes / hardware.mem_bytes_per_s)


def decode_time_per_request_s(
    model: ModelShape, schedule: Schedule, prompt_len: int, gen_len: int, hardware: Hardware, batch: int,
    kv_pool_tokens: int | None = None, landmark_bytes: float = LANDMARK_BYTES,
) -> float:
    """Decode time of ``batch`` concurrent requests (in the waves a KV pool of ``kv_pool_tokens`` admits,
    ``rollout_waves``) divided by ``batch``: with one wave, the sum over a generation's steps of step time /
    batch."""
    roofline, counts, _ = rollout_decode_roofline_and_counts(model, schedule, prompt_len, gen_len, batch, hardware,
                                                             kv_pool_tokens, landmark_bytes=landmark_bytes)
    return float((roofline + counts @ hardware.step_costs) / batch)


def rollout_estimate(
    model: ModelShape,
    schedule: Schedule,
    prompt_len: int,
    gen_len: int,
    samples: int = DEFAULT_SAMPLES,
    hardware: Hardware | None = None,
    batch: int = DEFAULT_DECODE_BATCH,
    kv_pool_tokens: int | None = None,
    landmark_dtype: str = DEFAULT_LANDMARK_DTYPE,
) -> RolloutEstimate:
    """Dense vs ``schedule`` cost of one rollout group (see the module docstring). ``batch`` requests decode
    together, in the waves a KV pool of ``kv_pool_tokens`` tokens admits (no limit when None); the sparse server
    stores its landmarks in ``landmark_dtype`` (its SPARROW_LANDMARK_DTYPE)."""
    for field_name, value, minimum in (("prompt_len", prompt_len, 0), ("gen_len", gen_len, 1), ("samples", samples, 1),
                                       ("batch", batch, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{field_name} = {value!r}: must be an integer >= {minimum}")
    if kv_pool_tokens is not None and (isinstance(kv_pool_tokens, bool) or not isinstance(kv_pool_tokens, (int, np.integer))
                                       or kv_pool_tokens < prompt_len + gen_len):
        raise ValueError(f"kv_pool_tokens = {kv_pool_tokens!r}: must be an integer >= prompt_len + gen_len "
                         f"({prompt_len + gen_len}), one request at full length")
    hardware = hardware or HARDWARE_PRESETS[DEFAULT_HARDWARE]
    landmark_bytes = landmark_element_bytes(landmark_dtype, model.head_dim)
    decode = lambda sched: decode_time_per_request_s(  # noqa: E731
        model, sched, prompt_len, gen_len, hardware, batch, kv_pool_tokens, landmark_bytes)
    return RolloutEstimate(
        prefill_s=prefill_time_s(model, prompt_len, hardware),
        dense_decode_s=decode(dense_schedule()),
        sparse_decode_s=decode(schedule),
        samples=int(samples),
        gen_len=int(gen_len),
        decode_waves=tuple(rollout_waves(batch, prompt_len + gen_len, kv_pool_tokens)),
    )


def predicted_speedup(
    model: ModelShape,
    schedule: Schedule,
    prompt_len: int,
    gen_len: int,
    samples: int = DEFAULT_SAMPLES,
    hardware: Hardware | None = None,
    batch: int = DEFAULT_DECODE_BATCH,
    kv_pool_tokens: int | None = None,
    landmark_dtype: str = DEFAULT_LANDMARK_DTYPE,
) -> float:
    """Predicted rollout speedup (dense time / sparse time) of ``schedule``, integrated over the generation."""
    return rollout_estimate(model, schedule, prompt_len, gen_len, samples, hardware, batch, kv_pool_tokens,
                            landmark_dtype).speedup


def roofline_bytes(
    model: ModelShape, schedule: Schedule, length: int, batch: int = 1, prompt_len: int = 0,
    landmark_bytes: float = LANDMARK_BYTES,
) -> RooflineBytes:
    """Bytes one decode step at ``length`` must read, dense vs ``schedule`` (for benchmarks to print)."""
    _, dense = step_flops_and_bytes(model, dense_schedule(), [length], batch, prompt_len)
    _, sparse = step_flops_and_bytes(model, schedule, [length], batch, prompt_len, landmark_bytes)
    scalar = lambda b: StepBytes(float(b.weights[0]), float(b.kv[0]), float(b.landmarks[0]))  # noqa: E731
    return RooflineBytes(scalar(dense), scalar(sparse))


__all__ = [
    "StepBytes", "RooflineBytes", "RolloutEstimate", "step_flops_and_bytes", "step_roofline_and_counts", "step_time_s",
    "prefill_time_s", "rollout_waves", "rollout_decode_roofline_and_counts",
    "decode_time_per_request_s", "rollout_estimate", "predicted_speedup", "roofline_bytes",
    "DEFAULT_DECODE_BATCH", "DEFAULT_SAMPLES", "LANDMARK_BYTES", "landmark_element_bytes",
]
