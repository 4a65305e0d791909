"""Fit the hardware presets' per-step costs to the committed SGLang measurements, and check the fit.

For each preset (GPU), the measurements of one code state (``FIT_SOURCES``: the benchmark JSONs, each
naming its device) become points of ``sparrow_server.cost.step_fit``: a decode point is one step at the
middle of its generated tokens (``batch / tok_s`` seconds, what the server logs); a rollout is its wall
time, modelled as ``sparrow-server cost`` models it (``roofline.rollout_decode_roofline_and_counts``: the
waves SGLang admits, as many requests as the KV pool holds at full length, up to
``--max-running-requests``, each a prefill per request plus a lockstep decode of every length). Each point
is on its server's ``--context-length`` (the JSON's, or the committed server log's ``server_args``).
The terms fitted per preset are those with the smallest leave-one-out error (``select_terms``). The
report gives the error of every term set, each point's error in the fit and left out of it
(leave-one-out), the error on the rollouts of a fit to the decode points alone, and per rollout what each
term predicts next to what the server log measured.

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
from sparrow_server.cost.roofline import (  # noqa: E402
    prefill_time_s, rollout_decode_roofline_and_counts, rollout_waves, step_roofline_and_counts, step_time_s,
)
from sparrow_server.cost.step_fit import (  # noqa: E402
    STEP_COST_TERMS, FitPoint, fit_step_costs, leave_one_out, predict, select_terms,
)
from sparrow_server.sparsity.registry import ScheduleRegistry  # noqa: E402
from sparrow_server.sparsity.schedule import Schedule, dense_schedule, load_schedule  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SCHEDULE_FILES = Path(__file__).resolve().parent / "schedules"  # benchmark schedules served with --schedule-file
# The measurements of one code state per preset (benchmarks/results/<call>/sglang_throughput.json).
# H100: the fused radix-select kernel (calls 3, 4). H200: the code after issue 24 (per-request dense layers; the
# `even` selection in calls 10-22, `fine_hist64` in call 23, `short8_hist40_wide` in call 24, which no term tells
# apart): decode 32K x 16 and x 32 with the 0.86 preset and with no dense layer (speed/call10), rollouts A and B
# (speed/call20, dense and sparse on the two cards of one host at once, as every rollout since), rollout B at the
# 33 requests the pool holds (call21, call24), rollout A of Qwen3-8B (call22), of Qwen3-1.7B and -4B (call23) and
# of Qwen3-1.7B (call24). The issue-13 calls 14-15 the H200 preset was fitted to before are held out: their
# sparse kernels are older than the rollouts', which are the code `sparrow-server cost` describes.
FIT_SOURCES = {"h100": ("gpu_call3", "gpu_call4"),
               "h200": ("speed/call10/preset", "speed/call10/ceiling", "speed/call20/rolloutA", "speed/call20/rolloutB",
                        "speed/call21/rolloutB_33", "speed/call22/rolloutA_8b", "speed/call23/rolloutA",
                        "speed/call23/rolloutA_4b", "speed/call24/rolloutA", "speed/call24/rolloutB_33")}
# Not fitted, predicted with the fit as a check; HELD_OUT_WHAT says what each is (cost_fit.md prints it above the
# held-out table), so the list is described once.
HELD_OUT = {"h100": ("gpu_call5", "gpu_call9"), "h200": ("gpu_call14", "gpu_call15", "speed/call25/decode32k",
                                                        "speed/call26/decode_profiles/decode32k",
                                                        "speed/call27/kernel_bench_decode/decode32k_packed",
                                                        "speed/call27/rolloutA_default_pool/out",
                                                        "speed/call28/rolloutA/out",
                                                        "speed/call29/rolloutB_33/out",
                                                        "speed/call29/rolloutA_4b/out",
                                                        "speed/call30/rolloutA_8b/out")}
HELD_OUT_WHAT = {"h100": ("same GPU and kernels, other models",),
                 "h200": ("same GPU, the issue-13 code: the sparse kernels before issue 24, one card at a time",
                          "speed/call25/decode32k, speed/call26/decode_profiles/decode32k, "
                          "speed/call27/kernel_bench_decode/decode32k_packed: decode with the fused "
                          "selections of calls 25, 26 and 27, measured after the fit",
                          "speed/call27/rolloutA_default_pool/out: rollout A in waves at the default pool, "
                          "call 27's code",
                          "speed/call28/rolloutA/out: rollout A at the default (fused_packed_narrow), the pool "
                          "holding it at once",
                          "speed/call29/rolloutB_33/out, speed/call29/rolloutA_4b/out: rollout B at 33 requests "
                          "and Qwen3-4B rollout A (in waves) at the default, measured after the fit",
                          "speed/call30/rolloutA_8b/out: Qwen3-8B rollout A (in waves) at the default, measured "
                          "after the fit")}
# Same GPU, other kernels (not fitted): their rollouts are in the per-rollout table, to show what the preset does
# not describe (gpu_call2: the selection before the fused radix-select kernel of gpu_call3/4; gpu_call15: the
# issue-13 code, held out above; speed/call21/rolloutA_4b: Qwen3-4B's sparse layers on FlashInfer's CUDA-core
# decode at GQA group 4, at half the dense kernel's bandwidth, replaced by the tensor-core decode of call 23).
EARLIER_KERNELS = {"h100": ("gpu_call2",), "h200": ("gpu_call15", "speed/call21/rolloutA_4b")}
NOT_FITTED_LABEL = {**{c: "earlier kernel" for v in EARLIER_KERNELS.values() for c in v},
                    "gpu_call15": "issue-13 code, held out",
                    "speed/call21/rolloutA_4b": "issue-24 code, CUDA-core sparse decode at GQA group 4"}
DEVICES = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
# The H100 runs predate the JSON's max_running_requests field; their flags were --max-running-requests 32
# (benchmarks/results/sglang_README.md and the server logs).
DEFAULT_MAX_RUNNING = 32
# SGLang's decode log line: running requests, KV tokens they hold, output tokens/s since the previous line
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+).*?gen throughput \(token/s\): ([\d.]+)")
SERVER_ARG = r"\b{}=(\d+)"  # an integer field of the server_args line of an SGLang log
BACKEND_SERVER = {"dense": "flashinfer", "sparse": "sparrow"}
# What one unit of each term's count is (STEP_COST_TERMS order; cost/step_fit.py says why each term exists)
TERM_PER = ("step", "request and step", "sparse layer in a step that selects", "request and sparse layer in a step "
            "that selects", "scored page, request and sparse layer", "layer and step", "TFLOP of the linear layers",
            "GB of KV read on CUDA-core decode x GB of KV held")


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
    context_length: int  # the server's --context-length


def server_arg(log: str | None, name: str) -> int | None:
    """An integer field of the ``server_args`` an SGLang log prints at start, or None."""
    found = re.search(SERVER_ARG.format(name), log or "")
    return int(found.group(1)) if found else None


def load_workloads(call: str, results: Path = RESULTS) -> list[Workload]:
    data = json.loads((results / call / "sglang_throughput.json").read_text())
    max_running = data.get("max_running_requests", DEFAULT_MAX_RUNNING)
    out = []
    for run in data["runs"]:
        for backend, field in (("dense", "dense_tok_s"), ("sparse", "sparse_tok_s")):
            if run[field] is None:
                continue
            server = data["servers"][f"{run['model']}/{BACKEND_SERVER[backend]}"]
            # the JSONs record --context-length from gpu_call12 on; before, the server log's server_args has it
            context = (run.get("context_length") or data.get("context_length")
                       or server_arg(server_log(call, run["model"], backend, results), "context_length"))
            if context is None:
                raise ValueError(f"{call}: no --context-length for {run['model']} {backend} (JSON or server log)")
            label = (f"{run['context'] // 1024}K x {run['batch']}" if run["workload"] == "decode_ctx"
                     else f"{run['batch']} x ({run['prompt_len'] // 1024}K + {run['gen_len'] // 1024}K)")
            out.append(Workload(f"{call}: {run['model']} {run['workload']} {label}", backend, run["model"],
                                run["schedule"], run["workload"], run["prompt_len"], run["gen_len"], run["batch"],
                                run[field], server["max_total_num_tokens"], max_running, context))
    return out


def workload_schedule(w: Workload) -> Schedule:
    """The schedule the workload's server ran: dense, a registered preset, or a benchmark schedule file."""
    if w.backend == "dense":
        return dense_schedule()
    path = SCHEDULE_FILES / f"{w.schedule}.json"
    return load_schedule(path) if path.exists() else ScheduleRegistry().get(w.schedule)


def fit_point(w: Workload, hardware: Hardware) -> FitPoint:
    model = MODEL_PRESETS[w.model]
    schedule = workload_schedule(w)
    name = f"{w.source} {w.backend}"
    if w.kind == "decode_ctx":
        roof, counts = step_roofline_and_counts(model, schedule, [w.prompt_len + w.gen_len // 2], w.batch, hardware)
        return FitPoint(name, w.batch / w.tok_s, float(roof[0]), counts[0])
    roof, counts, _ = rollout_decode_roofline_and_counts(model, schedule, w.prompt_len, w.gen_len, w.batch, hardware,
                                                         w.kv_pool_tokens, w.max_running)
    roof += w.batch * prefill_time_s(model, w.prompt_len, hardware)  # one prefill per request (no shared prompt)
    return FitPoint(name, w.batch * w.gen_len / w.tok_s, roof, counts)


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


def rollout_log_lines(w: Workload, log: str) -> list[tuple[int, int, float]]:
    """(running requests, mean length, tokens/s) of each server-log decode line of the rollout.

    A line's throughput covers the steps since the previous line; its mean length is ``#token / running``.
    Lines are the rollout's when their batch is one of its waves' and their length lies in
    (prompt, prompt + gen]; a wave's first line also covers the idle time and prefill before it and is skipped."""
    waves = set(rollout_waves(w.batch, w.prompt_len + w.gen_len, w.kv_pool_tokens, w.max_running))
    out, previous = [], None
    for running, tokens, tok_s in ((int(a), int(b), float(c)) for a, b, c in DECODE_LINE.findall(log)):
        length = tokens // running
        first = previous is None or previous[0] != running or tokens <= previous[1]
        previous = (running, tokens)
        if not first and running in waves and w.prompt_len < length <= w.prompt_len + w.gen_len:
            out.append((running, length, tok_s))
    return out


def log_decode_s(w: Workload, log: str) -> float:
    """Seconds the rollout's server-log lines cover: ``decode_log_interval`` steps of ``running / tok_s`` each."""
    interval = server_arg(log, "decode_log_interval")
    if interval is None:
        raise ValueError(f"{w.source}: the server log has no decode_log_interval")
    return sum(interval * running / tok_s for running, _, tok_s in rollout_log_lines(w, log))


def rollout_step_errors(w: Workload, hardware: Hardware, log: str) -> dict[int, np.ndarray]:
    """Per wave batch: (mean length, predicted / measured step - 1) of each server-log line of the rollout
    (``rollout_log_lines``); a line's measured step is ``running / tok_s``."""
    model = MODEL_PRESETS[w.model]
    schedule = workload_schedule(w)
    out: dict[int, list] = {}
    for running, length, tok_s in rollout_log_lines(w, log):
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


def preset_workloads(preset: str, results: Path = RESULTS, held_out: bool = False,
                     calls: tuple[str, ...] | None = None) -> list[tuple[Workload, FitPoint]]:
    """The preset's fit workloads and their points (or, with ``held_out``, its held-out checks; or those of
    ``calls``), each call checked to have run on the preset's GPU."""
    hardware = HARDWARE_PRESETS[preset].roofline()
    out = []
    for call in calls if calls is not None else (HELD_OUT if held_out else FIT_SOURCES)[preset]:
        device = json.loads((results / call / "sglang_throughput.json").read_text())["device"]
        if device != DEVICES[preset]:
            raise ValueError(f"{call}: device {device!r} is not the {preset} preset's {DEVICES[preset]!r}")
        out += [(w, fit_point(w, hardware)) for w in load_workloads(call, results)]
    return out


def preset_points(preset: str, results: Path = RESULTS, held_out: bool = False) -> list[FitPoint]:
    """The preset's fit points (or, with ``held_out``, its held-out check points)."""
    return [p for _, p in preset_workloads(preset, results, held_out)]


def reported_calls(preset: str) -> tuple[str, ...]:
    """The calls whose rollouts the per-rollout table shows: fitted, then those of other kernels."""
    return FIT_SOURCES[preset] + EARLIER_KERNELS[preset]


def rollout_breakdown(preset: str, loo: dict[str, float], results: Path = RESULTS) -> list[str]:
    """Rows of the per-rollout table: each committed rollout on the preset's GPU (fitted, or of earlier
    other kernels) with the seconds its server log's lines cover, and the seconds each part of the model predicts."""
    hardware = HARDWARE_PRESETS[preset]
    kept = [i for i, t in enumerate(STEP_COST_TERMS) if getattr(hardware, t)]
    lines = ["| rollout | waves | measured | log lines | prefill | roofline decode | "
             + " | ".join(STEP_COST_TERMS[i].removesuffix("_s") for i in kept) + " | predicted | error | left out |",
             "|---" * (9 + len(kept)) + "|"]
    for w, p in preset_workloads(preset, results, calls=reported_calls(preset)):
        if w.kind != "rollout":
            continue
        call = w.source.split(":")[0]
        log = server_log(call, w.model, w.backend, results)
        prefill = w.batch * prefill_time_s(MODEL_PRESETS[w.model], w.prompt_len, hardware)
        waves = rollout_waves(w.batch, w.prompt_len + w.gen_len, w.kv_pool_tokens, w.max_running)
        predicted = predict(p, hardware.step_costs)
        lines.append(
            f"| {p.name}{f' ({NOT_FITTED_LABEL[call]}, not fitted)' if call in NOT_FITTED_LABEL else ''} | "
            f"{' + '.join(map(str, waves))} | {p.measured_s:.1f} | "
            f"{log_decode_s(w, log) if log else float('nan'):.1f} | {prefill:.2f} | {p.roofline_s - prefill:.1f} | "
            + " | ".join(f"{p.counts[i] * hardware.step_costs[i]:.1f}" for i in kept)
            + f" | {predicted:.1f} | {predicted / p.measured_s - 1:+.1%} | "
            + (f"{loo[p.name]:+.1%}" if p.name in loo else "-") + " |")
    return lines


CONTEXT_TERM = "sparse_context_page_s"  # the candidate term of context_term_check, not in STEP_COST_TERMS


def context_term_check(preset: str, results: Path = RESULTS) -> list[str]:
    """The fit with one more candidate term, per page of the server's ``--context-length`` (Pcap) per request
    and sparse layer in a step that selects (the counts of ``sparse_layer_request_s`` times Pcap): lines of
    the report. The presets do not carry it (docs/cost-model.md, "Rollouts")."""
    names = STEP_COST_TERMS + (CONTEXT_TERM,)
    per_request_layer = STEP_COST_TERMS.index("sparse_layer_request_s")

    def with_context(pairs):
        return [FitPoint(p.name, p.measured_s, p.roofline_s,
                         np.append(p.counts, p.counts[per_request_layer] * -(-w.context_length // 16)))
                for w, p in pairs]

    fit_pairs = preset_workloads(preset, results)
    contexts = sorted({w.context_length for w, _ in fit_pairs})
    if len(contexts) == 1:
        return [f"Every fitted point ran at `--context-length` {contexts[0]}: a cost per page of the server's context "
                "is a cost per request and sparse layer there, and the data cannot tell it apart."]
    held_pairs = preset_workloads(preset, results, held_out=True)
    points, held = with_context(fit_pairs), with_context(held_pairs)
    terms = select_terms(points, names=names)
    coefficients = fit_step_costs(points, terms, names)
    loo = leave_one_out(points, terms, names)
    preset_costs = HARDWARE_PRESETS[preset].step_costs
    preset_loo = leave_one_out([p for _, p in fit_pairs], select_terms([p for _, p in fit_pairs]))
    lines = [f"Fitted points at `--context-length` {', '.join(map(str, contexts))}. With `{CONTEXT_TERM}` as a "
             f"candidate the smallest left-out error keeps {_short(terms)} ("
             + ", ".join(_seconds(coefficients[names.index(t)]) for t in terms)
             + "). Rollouts and held-out points, errors predicted / measured - 1:", "",
             "| point | --context-length | preset | left out | with the term | left out |", "|---|---|---|---|---|---|"]
    for (w, p), e0, q, e1 in zip(fit_pairs, preset_loo, points, loo):
        if w.kind == "rollout":
            lines.append(f"| {p.name} | {w.context_length} | {predict(p, preset_costs) / p.measured_s - 1:+.1%} | "
                         f"{e0:+.1%} | {predict(q, coefficients) / q.measured_s - 1:+.1%} | {e1:+.1%} |")
    for (w, p), q in zip(held_pairs, held):
        lines.append(f"| {p.name} (held out) | {w.context_length} | {predict(p, preset_costs) / p.measured_s - 1:+.1%} "
                     f"| - | {predict(q, coefficients) / q.measured_s - 1:+.1%} | - |")
    return lines


def _seconds(c: float) -> str:
    return f"{c * 1e9:.3g} ns" if 0 < c < 1e-7 else f"{c * 1e6:.4g} µs"


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
    lines += ["", "| term | per | fitted | in the preset |", "|---|---|---|---|"]
    lines += [f"| `{t}` | {per} | {c * 1e6:.4g} µs | {getattr(preset_hw, t) * 1e6:.4g} µs |"
              for t, per, c in zip(STEP_COST_TERMS, TERM_PER, coefficients, strict=True)]
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
    lines += ["", "Per rollout (seconds): the measured wall time; the decode the server log's lines cover "
              "(`decode_log_interval` steps each, every wave's first line left out: the rest of the wall time is "
              "prefill, those first steps and HTTP); what the preset predicts, split into the prefill (one per "
              "request), the roofline of the decode steps of every wave, and each fitted term:", ""]
    lines += rollout_breakdown(preset, {p.name: e for p, e in zip(points, loo)}, results)
    lines += ["", "A cost per page of the server's `--context-length` (Pcap), per request and sparse layer in a step "
              "that selects, as one more candidate term (not in the preset):", ""]
    lines += context_term_check(preset, results)
    held = preset_points(preset, results, held_out=True)
    if held:
        lines += ["", "Held out (not in the fit: " + "; ".join(HELD_OUT_WHAT[preset]) + "):", "",
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
          "`PYTHONPATH=. python benchmarks/fit_step_costs.py > benchmarks/results/cost_fit.md`; docs/cost-model.md explains the terms and reads the "
          "errors.\n")
    for preset in args.presets.split(","):
        print(report(preset))
    return 0


if __name__ == "__main__":
    sys.exit(main())
