"""The fitted per-step costs of a decode step: which counts they multiply, and their least-squares fit.

A decode step of ``batch`` requests costs its roofline (``roofline.py``: weights + KV + landmark bytes at
the hardware's bandwidth, or FLOPs) plus terms that scale with what the profiles show a step doing beyond
its bytes (``benchmarks/results/gpu_call11`` and ``gpu_call13``, ``decode_profile.md``: ~14 kernels per
layer and an LM-head/sampling tail for both backends, two more kernels per sparse layer), and with what
the rollouts' server logs show of the attention's bandwidth (docs/cost-model.md, "Fitted per-step costs"):

==========================  =====================================================================
``step_overhead_s``         per step (launches, LM head, sampling, scheduling), both backends
``request_step_s``          per request and step (per-request work and activations), both backends
``sparse_layer_step_s``     per sparse layer in a step that selects (the selection kernels' launch
                            and fixed work, whatever the batch)
``sparse_layer_request_s``  per request and sparse layer in a step that selects (top-k + index
                            write of one row, sparse decode below copy bandwidth)
``sparse_page_s``           per candidate page scored, per request and sparse layer, beyond its
                            landmark bytes (the score kernel's work follows the request's pages)
``layer_step_s``            per layer and step, both backends (each layer's ~14 kernels: a model
                            with more layers pays more per step at the same bytes)
``matmul_tflop_s``          per TFLOP of the linear layers (2 x matmul_params per request): their
                            compute adds to the weight stream instead of hiding under it
``cuda_core_kv_s``          per GB of KV and landmarks read on FlashInfer's CUDA-core decode (a GQA
                            group below 4), per GB of KV the batch holds: that kernel's bandwidth
                            falls as the batch's KV grows; the tensor-core decode's does not
==========================  =====================================================================

Every term is a count (``step_cost_counts``) times a coefficient, so a measured time that sums steps
(a rollout) is linear in the coefficients too. ``fit_step_costs`` solves the non-negative least-squares
problem on relative errors exactly (every subset of free terms: at most 2^8 small solves).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

STEP_COST_TERMS = ("step_overhead_s", "request_step_s", "sparse_layer_step_s", "sparse_layer_request_s",
                   "sparse_page_s", "layer_step_s", "matmul_tflop_s", "cuda_core_kv_s")
# cuda_core_kv_s counts GB x GB and matmul_tflop_s TFLOP: in bytes x bytes (~1e20) or FLOPs (~1e11) their
# columns would lie ~20 orders from the others and fall below lstsq's rcond
GB, TFLOP = 1e9, 1e12


def step_cost_counts(batch: int, n_layers: int, n_sparse_layers: int, selecting: np.ndarray, scored_pages: np.ndarray,
                     matmul_flops: np.ndarray, cuda_core_kv_read_bytes: np.ndarray, kv_held_bytes: np.ndarray
                     ) -> np.ndarray:
    """What each term of ``STEP_COST_TERMS`` multiplies, per step: [S] -> [S, len(STEP_COST_TERMS)].

    selecting: [S] bool, the step scores landmarks; scored_pages: [S] candidate pages one request's sparse
    layer scores (all ``batch`` requests at the same length); matmul_flops: [S] the linear layers' FLOPs of
    the batch; cuda_core_kv_read_bytes: [S] KV and landmark bytes the batch's attention reads on the CUDA-core
    decode (0 where it decodes on tensor cores); kv_held_bytes: [S] KV bytes the batch holds."""
    selecting = np.asarray(selecting, dtype=np.float64)
    ones = np.ones_like(selecting)
    sparse_layers = n_sparse_layers * selecting
    f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    return np.stack([ones, batch * ones, sparse_layers, batch * sparse_layers,
                     batch * n_sparse_layers * f64(scored_pages), n_layers * ones, f64(matmul_flops) / TFLOP,
                     f64(cuda_core_kv_read_bytes) / GB * f64(kv_held_bytes) / GB], axis=-1)


@dataclass(frozen=True)
class FitPoint:
    """One measurement: ``measured_s`` = ``roofline_s`` + ``counts`` . coefficients (``counts`` summed over
    the steps the measurement covers)."""

    name: str
    measured_s: float
    roofline_s: float
    counts: np.ndarray  # [len(STEP_COST_TERMS)]


def predict(point: FitPoint, coefficients: np.ndarray) -> float:
    return float(point.roofline_s + point.counts @ coefficients)


def fit_step_costs(points: list[FitPoint], terms: tuple[str, ...], names: tuple[str, ...] = STEP_COST_TERMS
                   ) -> np.ndarray:
    """Coefficients >= 0 (zero for terms not in ``terms``) minimising sum over points of the squared
    relative error (predicted / measured - 1): [len(names)]. ``names`` names the columns of the points'
    ``counts`` (``STEP_COST_TERMS``, or those plus a candidate term an analysis adds).

    Exact non-negative least squares: the optimum is the unconstrained least-squares solution on some
    subset of the terms (the others held at 0) that is non-negative; every subset is tried."""
    unknown = set(terms) - set(names)
    if unknown:
        raise ValueError(f"terms: unknown {sorted(unknown)} (known: {names})")
    if not points:
        raise ValueError("points: need at least one measurement")
    cols = [names.index(t) for t in terms]
    a = np.stack([p.counts[cols] / p.measured_s for p in points])  # [P, K]
    b = np.array([1.0 - p.roofline_s / p.measured_s for p in points])  # [P]
    best, best_err = np.zeros(len(cols)), float(b @ b)
    for k in range(1, len(cols) + 1):
        for subset in itertools.combinations(range(len(cols)), k):
            sub = list(subset)
            x, *_ = np.linalg.lstsq(a[:, sub], b, rcond=None)
            if np.any(x < 0):
                continue
            full = np.zeros(len(cols))
            full[sub] = x
            err = float(np.sum((a @ full - b) ** 2))
            if err < best_err - 1e-15:
                best, best_err = full, err
    out = np.zeros(len(names))
    out[cols] = best
    return out


def leave_one_out(points: list[FitPoint], terms: tuple[str, ...], names: tuple[str, ...] = STEP_COST_TERMS
                  ) -> list[float]:
    """Relative error (predicted / measured - 1) of each point under the fit of all the others."""
    errors = []
    for i, p in enumerate(points):
        coefficients = fit_step_costs(points[:i] + points[i + 1:], terms, names)
        errors.append(predict(p, coefficients) / p.measured_s - 1)
    return errors


def select_terms(points: list[FitPoint], required: tuple[str, ...] = ("step_overhead_s",),
                 names: tuple[str, ...] = STEP_COST_TERMS) -> tuple[str, ...]:
    """The set of terms (``required`` plus any others of ``names``) whose fit has the smallest root-mean-square
    leave-one-out error on ``points``; among equal errors the one with fewer terms. With a handful of
    points a term the data cannot pin down makes the left-out predictions worse, so it is dropped."""
    optional = [t for t in names if t not in required]
    best, best_rms = tuple(required), np.inf
    for k in range(len(optional) + 1):
        for extra in itertools.combinations(optional, k):
            terms = tuple(t for t in names if t in required or t in extra)
            rms = float(np.sqrt(np.mean(np.square(leave_one_out(points, terms, names)))))
            if rms < best_rms - 1e-12:
                best, best_rms = terms, rms
    return best


__all__ = ["STEP_COST_TERMS", "step_cost_counts", "FitPoint", "predict", "fit_step_costs", "leave_one_out",
           "select_terms"]
