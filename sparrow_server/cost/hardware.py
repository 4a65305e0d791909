"""Accelerator ceilings for the roofline: dense bf16 matmul FLOP/s and HBM bytes/s."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sparrow_server.cost.step_fit import STEP_COST_TERMS


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense bf16 matrix FLOP/s
    mem_bytes_per_s: float  # HBM bandwidth, bytes/s
    source: str = ""
    # Fitted per-step costs added to the roofline (cost/step_fit.py says what each multiplies); all 0 = the
    # pure roofline.
    step_overhead_s: float = 0.0  # per decode step
    request_step_s: float = 0.0  # per request and step
    sparse_layer_step_s: float = 0.0  # per sparse layer in a step that selects pages
    sparse_layer_request_s: float = 0.0  # per request and sparse layer in a step that selects pages
    sparse_page_s: float = 0.0  # per candidate page scored, per request and sparse layer
    layer_step_s: float = 0.0  # per layer and step
    matmul_tflop_s: float = 0.0  # per TFLOP of the linear layers
    cuda_core_kv_s: float = 0.0  # per GB of KV read on the CUDA-core decode, per GB of KV the batch holds

    def __post_init__(self) -> None:
        for field_name in ("peak_flops", "mem_bytes_per_s"):
            value = getattr(self, field_name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"hardware field {field_name!r} = {value!r}: must be > 0")
        for field_name in STEP_COST_TERMS:
            value = getattr(self, field_name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"hardware field {field_name!r} = {value!r}: must be >= 0")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.peak_flops / self.mem_bytes_per_s

    @property
    def step_costs(self) -> np.ndarray:
        """The fitted per-step costs in ``STEP_COST_TERMS`` order: [len(STEP_COST_TERMS)] seconds."""
        return np.array([getattr(self, t) for t in STEP_COST_TERMS], dtype=np.float64)

    @property
    def is_roofline(self) -> bool:
        return not self.step_costs.any()

    def roofline(self) -> "Hardware":
        """The same ceilings with no fitted per-step costs: the pure byte/FLOP roofline."""
        if self.is_roofline:
            return self
        return replace(self, **dict.fromkeys(STEP_COST_TERMS, 0.0), source=f"{self.source}; pure roofline")

    def with_overrides(
        self, peak_flops: float | None = None, mem_bytes_per_s: float | None = None, **step_costs: float | None,
    ) -> "Hardware":
        unknown = set(step_costs) - set(STEP_COST_TERMS)
        if unknown:
            raise ValueError(f"hardware overrides: unknown {sorted(unknown)} (known: {STEP_COST_TERMS})")
        given = {k: v for k, v in (("peak_flops", peak_flops), ("mem_bytes_per_s", mem_bytes_per_s),
                                   *step_costs.items()) if v is not None}
        if not given:
            return self
        return replace(self, **given, source=f"{self.source}; overridden: {', '.join(given)}")


# Defaults are MEASURED on this project's lent hosts (recorded in the device library's KINDS.md, not
# re-measured by this module): an 8192^3 bf16 torch.matmul on random data, and a device-to-device
# copy counting bytes read + written. Vendor SXM datasheet figures, for comparison only (SPEC):
# H100 989 TFLOP/s dense bf16, 3.35 TB/s; H200 989 TFLOP/s, 4.8 TB/s. The per-step costs are the
# non-negative least-squares fit (cost/step_fit.py) of roofline + costs to every committed SGLang decode
# step and rollout of one code state on that GPU, with the terms whose leave-one-out error is smallest:
# `PYTHONPATH=. python benchmarks/fit_step_costs.py` prints the fit, per-point errors and leave-one-out
# errors (committed as benchmarks/results/cost_fit.md); tests/core/test_step_fit.py checks these values
# are that fit and reproduce every point.
HARDWARE_PRESETS: dict[str, Hardware] = {
    "h100": Hardware(
        "h100", peak_flops=798e12, mem_bytes_per_s=3.0e12,
        step_overhead_s=932e-6, request_step_s=21.5e-6, sparse_layer_step_s=40.2e-6,
        source="measured on the lent H100 80GB HBM3 (2026-11-13): 798 TFLOP/s bf16 matmul, ~3.0 TB/s copy; "
               "per-step costs fitted to SGLang decode 8K/16K/32K x 16 and rollouts 32 x (1K + 8K), "
               "32 x (1K + 16K), Qwen3-1.7B, fused radix-select kernel (benchmarks/results/gpu_call3, gpu_call4 "
               "sglang_throughput.json)",
    ),
    "h200": Hardware(
        "h200", peak_flops=788e12, mem_bytes_per_s=4.3e12,
        request_step_s=8.00e-6, sparse_layer_step_s=16.8e-6, sparse_page_s=0.281e-9, layer_step_s=42.5e-6,
        matmul_tflop_s=2.16e-3, cuda_core_kv_s=0.157e-6,
        source="measured on the lent H200 (2026-10-28, 2026-11-04): 769-798 TFLOP/s bf16 matmul, ~4.3 TB/s copy; "
               "per-step costs fitted to SGLang decode 32K x 16 and x 32 and the rollouts 64 x (1K + 16K), "
               "16 and 33 x (1K + 32K), Qwen3-1.7B, and 64 x (1K + 16K) of Qwen3-4B and -8B, the code after issue 24 "
               "(benchmarks/results/speed/call10, call20-call24 sglang_throughput.json)",
    ),
}
SPEC_HARDWARE: dict[str, Hardware] = {
    "h100-spec": Hardware("h100-spec", peak_flops=989e12, mem_bytes_per_s=3.35e12, source="H100 SXM datasheet"),
    "h200-spec": Hardware("h200-spec", peak_flops=989e12, mem_bytes_per_s=4.8e12, source="H200 SXM datasheet"),
}
DEFAULT_HARDWARE = "h200"  # the paper's hardware


def resolve_hardware(name: str) -> Hardware:
    key = name.strip().lower()
    table = {**HARDWARE_PRESETS, **SPEC_HARDWARE}
    if key not in table:
        raise ValueError(f"hardware = {name!r}: unknown (known: {', '.join(table)})")
    return table[key]


__all__ = ["Hardware", "HARDWARE_PRESETS", "SPEC_HARDWARE", "DEFAULT_HARDWARE", "resolve_hardware"]
