"""How far the H200 cost preset is from the runs measured after its fit, and what float8 landmarks change.

The preset (``fit_step_costs.FIT_SOURCES``: the issue-24 runs of calls 10-24) against later runs of faster selections
(``LATER_RUNS``): its error on each, then a refit with them beside the fitted runs (kernel versions no term tells
apart) and the errors that leaves; and the predicted decode step at 32K with float8 landmarks against bfloat16
(``sparrow-server cost --landmark-dtype``), next to the gain call 43 measured on one H200.

    PYTHONPATH=. python benchmarks/cost_drift.py > benchmarks/results/cost_drift.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fit_step_costs as fsc  # noqa: E402

from sparrow_server.cost.hardware import HARDWARE_PRESETS  # noqa: E402
from sparrow_server.cost.model_shape import MODEL_PRESETS  # noqa: E402
from sparrow_server.cost.roofline import landmark_element_bytes, rollout_estimate, step_time_s  # noqa: E402
from sparrow_server.cost.step_fit import (  # noqa: E402
    STEP_COST_TERMS, fit_step_costs, leave_one_out, predict, select_terms,
)
from sparrow_server.sparsity.registry import ScheduleRegistry  # noqa: E402

PRESET = "h200"
# Runs after the fit, on faster selections: rollouts at calls 28-33's defaults and call 45's (its sparse half; the
# dense half's JSON was lost with its host), decode at call 39's and call 44's; call 47's halves of rollout A and
# decode at 32K x 34 (two invocations on one card) and its decode at 32K x 16; call 48's halves of Qwen3-4B rollout A
# (two invocations on one card); call 49's served selections at Qwen3-1.7B's 32K (the default, fused_pages_narrow),
# its rollout A's sparse half with fused_pages_narrow, and Qwen3-4B's and 8B's decodes (dense, each selection).
LATER_RUNS = ("speed/call28/rolloutA/out", "speed/call29/rolloutB_33/out", "speed/call29/rolloutA_4b/out",
              "speed/call30/rolloutA_8b/out", "speed/call33/rolloutA/rolloutA", "speed/call39/decode32k/decode32k",
              "speed/call44/nocompile_decode32k/decode32k_nocompile",
              "speed/call45/3_dense_clocks_sparse_rollout/rolloutA_sparse", "speed/call46/1_decode32k_capture/decode32k",
              "speed/call47/1_dense_half/dense", "speed/call47/2_sparse_half_profiles/sparse",
              "speed/call47/3_dense_profiles_decode16/decode32k_b16", "speed/call48/2_4b_sparse_half_profile/sparse",
              "speed/call48/3_4b_dense_half/dense", "speed/call49/1_pages_bench_served/sparse_fused_kvstore_narrow",
              "speed/call49/1_pages_bench_served/sparse_fused_pages_narrow",
              "speed/call49/1_pages_bench_served/rolloutA_sparse_pages", "speed/call49/3_4b_served_pages_ab/dense",
              "speed/call49/3_4b_served_pages_ab/sparse_fused_pages_narrow",
              "speed/call49/3_4b_served_pages_ab/sparse_fused_kvstore_narrow", "speed/call49/4_8b_decode/dense",
              "speed/call49/4_8b_decode/sparse", "speed/call49/5_8b_pages_ab/sparse_kvstore")
# Call 43 on one H200: the dense server, the sparse one with float8 landmarks, then the sparse one with bfloat16.
FLOAT8_RUNS = {"float8_e4m3fn": "speed/call43/float8_served/decode32k_fp8",
               "bfloat16": "speed/call43/float8_served/decode32k_bf16"}
# Call 45 on one H200: the sparse half of rollout A, bfloat16 landmarks, then float8.
FLOAT8_ROLLOUTS = {"float8_e4m3fn": "speed/call45/4_sparse_rollout_fp8/rolloutA_sparse_fp8",
                   "bfloat16": "speed/call45/3_dense_clocks_sparse_rollout/rolloutA_sparse"}


def _error_rows(points, costs) -> list[str]:
    return [f"| {p.name} | {p.measured_s:.5g} | {predict(p, costs):.5g} | {predict(p, costs) / p.measured_s - 1:+.1%} |"
            for p in points]


def drift() -> list[str]:
    later = [p for _, p in fsc.preset_workloads(PRESET, calls=LATER_RUNS)]
    preset_costs = HARDWARE_PRESETS[PRESET].step_costs
    points = fsc.preset_points(PRESET) + later
    terms = select_terms(points)
    refit = fit_step_costs(points, terms)
    errors = [abs(predict(p, refit) / p.measured_s - 1) for p in points]
    head = ["| point | measured s | predicted s | error |", "|---|---|---|---|"]
    return (["## The preset on the runs after its fit", ""] + head + _error_rows(later, preset_costs)
            + ["", f"## Refitted with them (terms {' + '.join(t.removesuffix('_s') for t in terms)}; not the preset)",
               "", f"Worst point {max(errors):.1%} of {len(points)}; worst left out "
               f"{max(abs(e) for e in leave_one_out(points, terms)):.1%}. Coefficients: "
               + ", ".join(f"{n} {v * 1e6:.4g} µs" for n, v in zip(STEP_COST_TERMS, refit) if v) + ".", ""]
            + head + _error_rows(later, refit))


def _runs(call: str) -> list[dict]:
    return json.loads((fsc.RESULTS / call / "sglang_throughput.json").read_text())["runs"]


def _measured_sparse_tok_s(call: str) -> dict[int, float]:
    runs = _runs(call)
    return {r["batch"]: r["sparse_tok_s"] for r in runs if r["workload"] == "decode_ctx" and r["context"] == 32768}


def float8_gain() -> list[str]:
    model, hardware = MODEL_PRESETS["qwen3-1.7b"], HARDWARE_PRESETS[PRESET]
    schedule = ScheduleRegistry.load().get("qwen3-1.7b-0.86")
    measured = {d: _measured_sparse_tok_s(call) for d, call in FLOAT8_RUNS.items()}
    lines = ["## Float8 landmarks: one decode step at 32K + 128 tokens", "",
             "| batch | predicted bfloat16 µs | predicted float8 µs | predicted gain | measured gain (call 43) |",
             "|---|---|---|---|---|"]
    for batch in sorted(measured["bfloat16"]):
        step = {d: float(step_time_s(model, schedule, [32_768 + 128], batch, hardware, 32_768,
                                     landmark_element_bytes(d, model.head_dim))[0]) for d in FLOAT8_RUNS}
        gain = measured["float8_e4m3fn"][batch] / measured["bfloat16"][batch] - 1
        lines.append(f"| {batch} | {step['bfloat16'] * 1e6:.1f} | {step['float8_e4m3fn'] * 1e6:.1f} | "
                     f"{step['bfloat16'] / step['float8_e4m3fn'] - 1:+.1%} | {gain:+.1%} |")
    return lines


def _sparse_rollout(call: str) -> dict:
    (run,) = [r for r in _runs(call) if r["workload"] == "rollout"]
    return run


def float8_rollout_gain() -> list[str]:
    model, hardware = MODEL_PRESETS["qwen3-1.7b"], HARDWARE_PRESETS[PRESET]
    schedule = ScheduleRegistry.load().get("qwen3-1.7b-0.86")
    runs = {d: _sparse_rollout(call) for d, call in FLOAT8_ROLLOUTS.items()}
    run = runs["bfloat16"]
    decode = {d: rollout_estimate(model, schedule, run["prompt_len"], run["gen_len"], hardware=hardware,
                                  batch=run["batch"], landmark_dtype=d).sparse_decode_s for d in runs}
    walls = {d: r["sparse_detail"]["wall_s"] for d, r in runs.items()}
    return ["## Float8 landmarks: the sparse half of rollout A", "",
            f"{run['batch']} x ({run['prompt_len']} + {run['gen_len']}) tokens, the pool holding it at once.", "",
            "| | bfloat16 | float8 | gain |", "|---|---|---|---|",
            f"| predicted decode s a request | {decode['bfloat16']:.4g} | {decode['float8_e4m3fn']:.4g} | "
            f"{decode['bfloat16'] / decode['float8_e4m3fn'] - 1:+.1%} |",
            f"| measured wall s (call 45, one H200) | {walls['bfloat16']} | {walls['float8_e4m3fn']} | "
            f"{walls['bfloat16'] / walls['float8_e4m3fn'] - 1:+.1%} |"]


def main() -> int:
    print("# The H200 cost preset against later runs; float8 landmarks\n\nGenerated by `PYTHONPATH=. python "
          "benchmarks/cost_drift.py > benchmarks/results/cost_drift.md`; docs/cost-model.md reads it.\n")
    print("\n".join(drift() + [""] + float8_gain() + [""] + float8_rollout_gain()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
