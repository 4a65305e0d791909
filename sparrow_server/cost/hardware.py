"""Accelerator ceilings for the roofline: dense bf16 matmul FLOP/s and HBM bytes/s."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense bf16 matrix FLOP/s
    mem_bytes_per_s: float  # HBM bandwidth, bytes/s
    source: str = ""
    # Fixed time added to every decode step (kernel launches, sampling, scheduling); 0 = pure roofline.
    step_overhead_s: float = 0.0
    # Time the sparse path adds per request and sparse layer in a decode step that selects pages (selection
    # beyond its landmark bytes, sparse decode below copy bandwidth); 0 = pure roofline.
    sparse_layer_request_s: float = 0.0

    def __post_init__(self) -> None:
        for field_name in ("peak_flops", "mem_bytes_per_s"):
            value = getattr(self, field_name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"hardware field {field_name!r} = {value!r}: must be > 0")
        for field_name in ("step_overhead_s", "sparse_layer_request_s"):
            value = getattr(self, field_name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"hardware field {field_name!r} = {value!r}: must be >= 0")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound."""
        return self.peak_flops / self.mem_bytes_per_s

    @property
    def is_roofline(self) -> bool:
        return self.step_overhead_s == 0 and self.sparse_layer_request_s == 0

    def roofline(self) -> "Hardware":
        """The same ceilings with no fitted per-step costs: the pure byte/FLOP roofline."""
        if self.is_roofline:
            return self
        return replace(self, step_overhead_s=0.0, sparse_layer_request_s=0.0, source=f"{self.source}; pure roofline")

    def with_overrides(
        self, peak_flops: float | None = None, mem_bytes_per_s: float | None = None, step_overhead_s: float | None = None,
        sparse_layer_request_s: float | None = None,
    ) -> "Hardware":
        given = {k: v for k, v in (("peak_flops", peak_flops), ("mem_bytes_per_s", mem_bytes_per_s),
                                   ("step_overhead_s", step_overhead_s),
                                   ("sparse_layer_request_s", sparse_layer_request_s)) if v is not None}
        if not given:
            return self
        return replace(self, **given, source=f"{self.source}; overridden: {', '.join(given)}")


# Defaults are MEASURED on this project's lent hosts (recorded in the device library's KINDS.md, not
# re-measured by this module): an 8192^3 bf16 torch.matmul on random data, and a device-to-device
# copy counting bytes read + written. Vendor SXM datasheet figures, for comparison only (SPEC):
# H100 989 TFLOP/s dense bf16, 3.35 TB/s; H200 989 TFLOP/s, 4.8 TB/s. The per-step costs are least-squares
# fits of step = step_overhead_s + bytes / mem_bytes_per_s (+ sparse_layer_request_s x batch x sparse layers
# for the sparse server) to the measured server decode steps (tests/core/test_cost_model.py checks the fit reproduces them).
HARDWARE_PRESETS: dict[str, Hardware] = {
    "h100": Hardware(
        "h100", peak_flops=798e12, mem_bytes_per_s=3.0e12, step_overhead_s=1.23e-3, sparse_layer_request_s=2.68e-6,
        source="measured on the lent H100 80GB HBM3 (2026-11-13): 798 TFLOP/s bf16 matmul, ~3.0 TB/s copy; "
               "per-step costs fitted to SGLang decode 8K/16K/32K x 16, Qwen3-1.7B (benchmarks/results/gpu_call3)",
    ),
    "h200": Hardware(
        "h200", peak_flops=788e12, mem_bytes_per_s=4.3e12, step_overhead_s=1.55e-3, sparse_layer_request_s=1.98e-6,
        source="measured on the lent H200 (2026-10-28, 2026-11-04): 769-798 TFLOP/s bf16 matmul, ~4.3 TB/s copy; "
               "per-step costs fitted to SGLang decode 16K x 16, 32K x 16, 32K x 28, Qwen3-1.7B "
               "(benchmarks/results/gpu_call14)",
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
