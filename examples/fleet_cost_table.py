"""Predicted rollout throughput of a fleet (the tables of docs/scaling.md), from the cost model.

These are **model predictions** (``sparrow_server.cost.rollout_estimate``, the function behind
``sparrow-server cost``), not measurements. For each GPU kind, Qwen3 size and generation length it
prints dense and sparse (the size's 0.86 preset) tokens/s per GPU, twice:

* ``roofline``: the CLI's defaults (decode batch 64, no per-step overhead);
* ``bounded``: the decode batch the GPU's memory can hold at the end of the generation
  (``MEM_FRACTION`` of the memory, minus bf16 weights, over KV bytes of prompt + generation;
  sparse decode stores the whole KV too, so the bound is the same for both) and the hardware
  preset's per-step costs fitted to measured SGLang decode steps and rollouts (docs/cost-model.md,
  "Fitted per-step costs").

Each row names the ``sparrow-server cost`` command that reproduces it. Then the fleet table:
servers are independent for rollouts (one GPU each, the router only forwards), so a fleet of N
GPUs is predicted at N times the per-GPU rate. Last, the bytes a weight update and a LoRA publish
move to a fleet (arithmetic on the model shapes).

    PYTHONPATH=. python examples/fleet_cost_table.py > /tmp/fleet_cost.md
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from sparrow_server.cost.hardware import resolve_hardware
from sparrow_server.cost.model_shape import resolve_model
from sparrow_server.cost.roofline import DEFAULT_DECODE_BATCH, rollout_estimate
from sparrow_server.sparsity.registry import ScheduleRegistry

MODELS = ("qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b")
GEN_LENS = (8192, 16384, 32768)
HARDWARE = ("h100", "h200")
GPU_MEMORY_BYTES = {"h100": 80e9, "h200": 141e9}  # datasheet capacities
MEM_FRACTION = 0.85  # weights + KV pool share of the memory (SGLang's mem_fraction_static is ~0.8-0.9)
WEIGHT_BYTES_PER_PARAM = 2  # bf16
PROMPT_LEN = 1024
SAMPLES = 8
FLEET_SIZES = (8, 64, 128)
THRESHOLD = "0.86"
LORA_RANK = 16  # DistillConfig's default rank, "all-linear" targets
DISTRIBUTION_SERVERS = 128


@dataclass(frozen=True)
class Row:
    hardware: str
    model: str
    gen_len: int
    batch: int
    fitted: bool  # the preset's fitted per-step costs (False: the pure roofline)
    dense: float
    sparse: float

    @property
    def speedup(self) -> float:
        return self.sparse / self.dense

    def command(self) -> str:
        field = "predicted_speedup" if self.fitted else "roofline_speedup"
        return (f"sparrow-server cost --model {self.model} --schedule {self.model}-{THRESHOLD} --prompt-len {PROMPT_LEN} "
                f"--gen-len {self.gen_len} --samples {SAMPLES} --batch {self.batch} --hardware {self.hardware} --json  # {field}")


def kv_bounded_batch(model_name: str, hardware: str, context: int) -> int:
    """Sequences of ``context`` tokens whose KV fits next to the weights (capped at the CLI default)."""
    model = resolve_model(model_name)
    free = GPU_MEMORY_BYTES[hardware] * MEM_FRACTION - model.params * WEIGHT_BYTES_PER_PARAM
    return max(1, min(DEFAULT_DECODE_BATCH, math.floor(free / (model.kv_bytes_per_token * context))))


def estimate(hardware: str, model_name: str, gen_len: int, batch: int, fitted: bool) -> Row:
    schedule = ScheduleRegistry.load().get(f"{model_name}-{THRESHOLD}")
    hw = resolve_hardware(hardware) if fitted else resolve_hardware(hardware).roofline()
    est = rollout_estimate(resolve_model(model_name), schedule, PROMPT_LEN, gen_len, SAMPLES, hw, batch)
    return Row(hardware, model_name, gen_len, batch, fitted, est.dense_tokens_per_s, est.sparse_tokens_per_s)


def rows(bounded: bool) -> list[Row]:
    out = []
    for hardware in HARDWARE:
        for model in MODELS:
            for gen_len in GEN_LENS:
                batch = kv_bounded_batch(model, hardware, PROMPT_LEN + gen_len) if bounded else DEFAULT_DECODE_BATCH
                out.append(estimate(hardware, model, gen_len, batch, fitted=bounded))
    return out


def per_gpu_table(title: str, table: list[Row]) -> str:
    lines = [f"### {title}", "", "| GPU | model | gen | batch | dense tok/s/GPU | sparse tok/s/GPU | speedup |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.hardware.upper()} | {r.model} | {r.gen_len // 1024}K | {r.batch} | {r.dense:,.0f} | "
              f"{r.sparse:,.0f} | {r.speedup:.2f}x |" for r in table]
    lines += ["", "Commands (one per row, same order):", "", "```"] + [r.command() for r in table] + ["```", ""]
    return "\n".join(lines)


def fleet_table(table: list[Row]) -> str:
    sizes = " | ".join(f"{n} GPUs dense / sparse" for n in FLEET_SIZES)
    lines = ["### Fleet rollout tokens/s (predicted, bounded batch; N x per-GPU)", "",
             f"| GPU | model | gen | {sizes} |", "|---|---|---|" + "---|" * len(FLEET_SIZES)]
    for r in table:
        cells = " | ".join(f"{n * r.dense / 1e3:,.0f}K / {n * r.sparse / 1e3:,.0f}K" for n in FLEET_SIZES)
        lines.append(f"| {r.hardware.upper()} | {r.model} | {r.gen_len // 1024}K | {cells} |")
    return "\n".join(lines) + "\n"


def lora_params(model_name: str, rank: int = LORA_RANK) -> int:
    """Parameters of a rank-``rank`` LoRA on every linear layer of the blocks (q, k, v, o, gate, up, down)."""
    m = resolve_model(model_name)
    h, q, kv, i = m.hidden_size, m.num_q_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.intermediate_size
    per_layer = rank * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    return per_layer * m.num_layers


def distribution_table() -> str:
    """Bytes a weight update and an adapter publish move to every server of a fleet."""
    n = DISTRIBUTION_SERVERS
    lines = [f"### What one update moves to {n} servers (bf16)", "",
             f"| model | checkpoint | x {n} servers | LoRA r={LORA_RANK} all-linear | x {n} servers | KV bytes/token |",
             "|---|---|---|---|---|---|"]
    for name in MODELS:
        m = resolve_model(name)
        ckpt, lora = m.params * WEIGHT_BYTES_PER_PARAM, lora_params(name) * WEIGHT_BYTES_PER_PARAM
        lines.append(f"| {name} | {ckpt / 1e9:.1f} GB | {n * ckpt / 1e12:.2f} TB | {lora / 1e6:.0f} MB | "
                     f"{n * lora / 1e9:.1f} GB | {m.kv_bytes_per_token / 1e3:.0f} KB |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    bounded = rows(bounded=True)
    print(per_gpu_table(f"Per GPU, roofline (batch {DEFAULT_DECODE_BATCH}, no step overhead)", rows(bounded=False)))
    print(per_gpu_table("Per GPU, memory-bounded batch, fitted per-step costs", bounded))
    print(fleet_table(bounded))
    print(distribution_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
