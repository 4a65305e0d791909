"""Fit the hardware presets' per-step costs to the committed SGLang measurements, and check the fit.

For each preset (GPU), the measurements of one code state (``FIT_SOURCES``: the benchmark JSONs, each
naming its device) become points of ``sparrow_server.cost.step_fit``: a decode point is one step at the
middle of its generated tokens (``batch / tok_s`` seconds, what the server logs); a rollout is its wall
time, modelled as the waves SGLang admits (``rollout_waves``: as many requests as the KV pool holds at
full length, up to ``--max-running-requests``), each a prefill plus a lockstep decode of every length.
The terms fitted per preset are those with the smallest leave-one-out error (``select_terms``). The
report gives the error of every term set, each point's error in the fit and left out of it
(leave-one-out), and the error on the rollouts of a fit to the decode points alone.

    PYTHONPATH=. python benchmarks/fit_step_costs.py > benchmarks/results/cost_fit.md
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparrow_server.cost.hardware import HARDWARE_PRESETS, Hardware  # noqa: E402
from sparrow_server.cost.model_shape import MODEL_PRESETS  # noqa: E402
from sparrow_server.cost.roofline import prefill_time_s, step_roofline_and_counts, step_time_s  # noqa: E402
from sparrow_server.cost.step_fit import (  # noqa: E402
    STEP_COST_TERMS, FitPoint, fit_step_costs, leave_one_out, predict, select_terms,
)
from sparrow_server.sparsity.registry import ScheduleRegistry  # noqa: E402
from sparrow_server.sparsity.schedule import dense_schedule  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# The measurements of one code state per preset (benchmarks/results/<call>/sglang_throughput.json).
# H100: the fused radix-select kernel (calls 3, 4); H200: the issue-13 kernels (call 14; call 15 ran the
# same commit, dense half of rollout A).
FIT_SOURCES = {"h100": ("gpu_call3", "gpu_call4"), "h200": ("gpu_call14", "gpu_call15")}
# Same GPU and code state, other models, not fitted: predicted with the fit as a check (Qwen3-4B and -8B,
# 36 layers, decode at a 16896-token server).
HELD_OUT = {"h100": ("gpu_call5", "gpu_call9"), "h200": ()}
DEVICES = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
# The H100 runs predate the JSON's max_running_requests field; their flags were --max-running-requests 32
# (benchmarks/results/sglang_README.md and the server logs).
DEFAULT_MAX_RUNNING = 32
# SGLang's decode log line: running requests, KV tokens they hold, output tokens/s since the previous line
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+).*?gen throughput \(token/s\): ([\d.]+)")
BACKEND_SERVER = {"dense": "flashinfer", "sparse": "sparrow"}


@dataclass(frozen=True)
class Workload:
    """One measured run of one backend."""

    source: str  # "<call>: <model> <workload> ..."
    backend: str  # dense | sparse
    model: str
    schedule: str
    kind: str  # decode_ctx | rollout
    prompt_len: int
    gen_len: int
    batch: int  # decode batch, or rollout requests
    tok_s: float
    kv_pool_tokens: int
    max_running: int


def rollout_waves(requests: int, tokens_per_request: int, kv_pool_tokens: int, max_running: int) -> list[int]:
    """Batch sizes SGLang runs a rollout of equal requests in: each wave admits what the pool holds at full
    length (``kv_pool_tokens // tokens_per_request``), up to ``max_running``; the next starts after it."""
    per_wave = min(max_running, kv_pool_tokens // tokens_per_request)
    if per_wave < 1:
        raise ValueError(f"tokens_per_request = {tokens_per_request}: larger than the KV pool ({kv_pool_tokens})")
    full, rest = divmod(requests, per_wave)
    return [per_wave] * full + ([rest] if rest else [])


def load_workloads(call: str, results: Path = RESULTS) -> list[Workload]:
    data = json.loads((results / call / "sglang_throughput.json").read_text())
    max_running = data.get("max_running_requests", DEFAULT_MAX_RUNNING)
    out = []
    for run in data["runs"]:
        for backend, field in (("dense", "dense_tok_s"), ("sparse", "sparse_tok_s")):
            if run[field] is None:
                continue
            server = data["servers"][f"{run['model']}/{BACKEND_SERVER[backend]}"]
            label = (f"{run['context'] // 1024}K x {run['batch']}" if run["workload"] == "decode_ctx"
                     else f"{run['batch']} x ({run['prompt_len'] // 1024}K + {run['gen_len'] // 1024}K)")
            out.append(Workload(f"{call}: {run['model']} {run['workload']} {label}", backend, run["model"],
                                run["schedule"], run["workload"], run["prompt_len"], run["gen_len"], run["batch"],
                                run[field], server["max_total_num_tokens"], max_running))
    return out


def fit_point(w: Workload, hardware: Hardware) -> FitPoint:
    model = MODEL_PRESETS[w.model]
    schedule = dense_schedule() if w.backend == "dense" else ScheduleRegistry().get(w.schedule)
    name = f"{w.source} {w.backend}"
    if w.kind == "decode_ctx":
        roof, counts = step_roofline_and_counts(model, schedule, [w.prompt_len + w.gen_len // 2], w.batch, hardware)
        return FitPoint(name, w.batch / w.tok_s, float(roof[0]), counts[0])
    lengths = w.prompt_len + np.arange(1, w.gen_len + 1)
    roof_total, counts_total = 0.0, np.zeros(len(STEP_COST_TERMS))
    for batch in rollout_waves(w.batch, w.prompt_len + w.gen_len, w.kv_pool_tokens, w.max_running):
        roof, counts = step_roofline_and_counts(model, schedule, lengths, batch, hardware, w.prompt_len)
        roof_total += float(roof.sum()) + batch * prefill_time_s(model, w.prompt_len, hardware)
        counts_total += counts.sum(axis=0)
    return FitPoint(name, w.batch * w.gen_len / w.tok_s, roof_total, counts_total)


def server_log(call: str, model: str, backend: str, results: Path = RESULTS) -> str | None:
    """The committed server log of one backend of a call (a plain file or a member of a .tar.xz), or None."""
    name = f"server-{model}-{BACKEND_SERVER[backend]}.log"
    for path in sorted((results / call).glob(name + "*")):
        return path.read_text(errors="replace")
    for archive in sorted((results / call).glob("*.tar.xz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if Path(member.name).name == name:
                    return tar.extractfile(member).read().decode(errors="replace")
    return None


def rollout_step_errors(w: Workload, hardware: Hardware, log: str) -> dict[int, np.ndarray]:
    """Per wave batch: (mean length, predicted / measured step - 1) of each server-log line of the rollout.

    A line's step time is ``batch / tok_s`` (its throughput covers the steps since the previous line) at
    the mean length ``#token / batch``. Lines are the rollout's when their batch is one of its waves' and
    their length lies in (prompt, prompt + gen]; a wave's first line also covers its prefill and is skipped."""
    model = MODEL_PRESETS[w.model]
    schedule = dense_schedule() if w.backend == "dense" else ScheduleRegistry().get(w.schedule)
    waves = set(rollout_waves(w.batch, w.prompt_len + w.gen_len, w.kv_pool_tokens, w.max_running))
    out: dict[int, list] = {}
    previous = None
    for running, tokens, tok_s in ((int(a), int(b), float(c)) for a, b, c in DECODE_LINE.findall(log)):
        length = tokens // running
        first = previous is None or previous[0] != running or tokens <= previous[1]
        previous = (running, tokens)
        if first or running not in waves or not w.prompt_len < length <= w.prompt_len + w.gen_len:
            continue
        predicted = float(step_time_s(model, schedule, [length], running, hardware, w.prompt_len)[0])
        out.setdefault(running, []).append((length, predicted * tok_s / running - 1))
    return {b: np.array(rows) for b, rows in out.items()}


def log_check(preset: str, results: Path = RESULTS) -> list[tuple[str, int, np.ndarray]]:
    """(rollout, wave batch, [N, 2] (length, error)) for every committed rollout log of the preset."""
    hardware = HARDWARE_PRESETS[preset]
    out = []
    for call in FIT_SOURCES[preset]:
        for w in load_workloads(call, results):
            log = server_log(call, w.model, w.backend, results) if w.kind == "rollout" else None
            if log is not None:
                out += [(f"{w.source} {w.backend}", b, e) for b, e in rollout_step_errors(w, hardware, log).items()]
    return out


def preset_points(preset: str, results: Path = RESULTS, held_out: bool = False) -> list[FitPoint]:
    """The preset's fit points (or, with ``held_out``, its held-out check points)."""
    hardware = HARDWARE_PRESETS[preset].roofline()
    points = []
    for call in (HELD_OUT if held_out else FIT_SOURCES)[preset]:
        device = json.loads((results / call / "sglang_throughput.json").read_text())["device"]
        if device != DEVICES[preset]:
            raise ValueError(f"{call}: device {device!r} is not the {preset} preset's {DEVICES[preset]!r}")
        points += [fit_point(w, hardware) for w in load_workloads(call, results)]
    return points


def fitted_hardware(preset: str, results: Path = RESULTS) -> tuple[Hardware, tuple[str, ...]]:
    """The preset's ceilings with the per-step costs fitted to its measurements, and the terms fitted."""
    points = preset_points(preset, results)
    terms = select_terms(points)
    coefficients = fit_step_costs(points, terms)
    return HARDWARE_PRESETS[preset].roofline().with_overrides(**dict(zip(STEP_COST_TERMS, coefficients))), terms


def _short(terms: tuple[str, ...]) -> str:
    return " + ".join(t.removesuffix("_s") for t in terms)


def report(preset: str, results: Path = RESULTS) -> str:
    points = preset_points(preset, results)
    fitted, terms = fitted_hardware(preset, results)
    coefficients = fitted.step_costs
    loo = leave_one_out(points, terms)
    decode = [p for p in points if " decode_ctx " in p.name]
    from_decode = fit_step_costs(decode, terms)
    preset_hw = HARDWARE_PRESETS[preset]
    lines = [f"## {preset}: {', '.join(FIT_SOURCES[preset])} ({DEVICES[preset]})", "",
             "Term sets (leave-one-out error over all points; the smallest is fitted):", "",
             "| terms | in-fit max | left-out max | left-out RMS |", "|---|---|---|---|"]
    for k in range(len(STEP_COST_TERMS)):
        for extra in itertools.combinations(STEP_COST_TERMS[1:], k):
            ts = ("step_overhead_s", *extra)
            fit = fit_step_costs(points, ts)
            err_in = max(abs(predict(p, fit) / p.measured_s - 1) for p in points)
            err_out = np.abs(leave_one_out(points, ts))
            mark = "**" if ts == terms else ""
            lines.append(f"| {mark}{_short(ts)}{mark} | {err_in:.1%} | {err_out.max():.1%} | "
                         f"{np.sqrt(np.mean(err_out ** 2)):.1%} |")
    lines += ["", "| term | fitted | in the preset |", "|---|---|---|"]
    lines += [f"| `{t}` | {c * 1e6:.4g} µs | {getattr(preset_hw, t) * 1e6:.4g} µs |"
              for t, c in zip(STEP_COST_TERMS, coefficients)]
    lines += ["", "Per point (seconds: a decode step, or a rollout's wall time; errors are predicted / measured - 1; "
              "'decode fit' is the fit to the decode points alone):", "",
              "| point | measured s | roofline s | fitted s | error | left out | decode fit |", "|---|---|---|---|---|---|---|"]
    for p, e in zip(points, loo):
        fit = predict(p, coefficients)
        dec = predict(p, from_decode) / p.measured_s - 1
        lines.append(f"| {p.name} | {p.measured_s:.5g} | {p.roofline_s:.5g} | {fit:.5g} | "
                     f"{fit / p.measured_s - 1:+.1%} | {e:+.1%} | {dec:+.1%} |")
    lines += ["", "Within the rollouts: each server-log line (its throughput over the last 40 steps) against the "
              "preset's step at the line's mean length; median error over each quarter of the lengths:", "",
              "| rollout | wave batch | lines | lengths | median error | 1st | 2nd | 3rd | 4th quarter |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, batch, rows in log_check(preset, results):
        lengths, errors = rows[:, 0], rows[:, 1]
        quarters = np.array_split(errors[np.argsort(lengths, kind="stable")], 4)
        lines.append(f"| {name} | {batch} | {len(rows)} | {lengths.min():.0f}-{lengths.max():.0f} | "
                     f"{np.median(errors):+.1%} | " + " | ".join(f"{np.median(q):+.1%}" for q in quarters) + " |")
    held = preset_points(preset, results, held_out=True)
    if held:
        lines += ["", "Held out (same GPU and kernels, other models; not in the fit):", "",
                  "| point | measured s | roofline s | predicted s | error |", "|---|---|---|---|---|"]
        for p in held:
            pred = predict(p, coefficients)
            lines.append(f"| {p.name} | {p.measured_s:.5g} | {p.roofline_s:.5g} | {pred:.5g} | "
                         f"{pred / p.measured_s - 1:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(FIT_SOURCES))
    args = ap.parse_args(argv)
    print("# Per-step costs fitted to the committed SGLang measurements\n\nGenerated by "
          "`PYTHONPATH=. python benchmarks/fit_step_costs.py`; docs/cost-model.md explains the terms and reads the "
          "errors.\n")
    for preset in args.presets.split(","):
        print(report(preset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
