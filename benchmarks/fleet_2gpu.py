"""Two GPUs of one host: two ``sparrow-server serve --engine sglang`` servers behind sglang-router,
and SGLang's NCCL weight path from a stand-in trainer (issue 23). One pair of servers serves every
part (a tiny random Qwen3 with peaked outputs, ``attn_scale`` 2, so page selections matter).

Parts (``--parts``, in this order; each records its numbers in the report even when it fails, and a
failed part does not stop the next):

- ``router``: 256 rollouts over three schedules (the ``qwen3-1.7b-0.86`` preset, ``dense``, a fixed
  256-token budget) through the router, ``extra_key`` form (``SparrowClient.generate``): each rid one
  complete answer, the workers' access logs hold exactly 256 ``POST /generate`` (both > 0), each
  answer equals the same request's ``/rollout`` on a worker -- bit for bit (tokens, logprobs, top-2
  gaps) with deterministic inference, within the bf16 tolerance with ``--no-deterministic``; latency
  p50/p99 and tokens/s with two workers and with server 0 alone, same load.
- ``kill``: 256 rollouts through the router, worker 1's process group SIGKILLed after a third have
  finished: no request hangs (120 s each), each ends in a complete answer or an HTTP error with a
  body; worker 1 restarts on its port, the router marks it healthy, and it serves some of 32 more.
- ``nccl`` (GPU only): NCCL updates of server 0 from this process, checked against server 1 updated
  from disk: idle, then pause -> update -> continue under 8 streaming sparse rollouts.

Deterministic inference (default): the SGLang servers start with ``--enable-deterministic-inference``
(SGLang's batch-invariant kernels; the sparrow backend plans its sparse decode batch-invariantly too),
and the router part demands exact equality. ``--no-deterministic``: servers without it, the router part
with the bf16 tolerance (the report's ``agreement_rule`` says which).

Writes ``OUT/fleet_2gpu_<parts>.json`` and the server/router logs; exits 1 if a part failed.
``--engine reference`` runs the router and kill parts on CPU reference-engine servers
(``--small`` sizes): the dry run of the parts' logic (with the bf16 tolerance: the reference engine has
no deterministic mode).

Usage: python benchmarks/fleet_2gpu.py OUT [--parts router,kill,nccl] [--engine sglang|reference] [--small]
       [--no-deterministic]
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
# the servers are child processes: they need the working tree's sparrow_server too
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

from fleet_gpu import kill_part, nccl_part, router_part  # noqa: E402
from fleet_gpu.common import GPU_SIZES, NCCL_ENV, SMALL_SIZES, Fleet  # noqa: E402

PARTS = {"router": router_part.run, "kill": kill_part.run, "nccl": nccl_part.run}


def run_parts(fleet: Fleet, parts: tuple[str, ...], report: dict) -> list[str]:
    """Run each part into its own report entry; returns the parts that failed."""
    failed = []
    for name in parts:
        rec = report.setdefault(name, {})
        report["running"] = name
        t0 = time.monotonic()
        print(f"--- part {name}", flush=True)
        try:
            PARTS[name](fleet, rec)
            rec["ok"] = True
        except Exception as exc:  # recorded; the next part still runs
            traceback.print_exc()
            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:4000])
            failed.append(name)
        rec["part_s"] = round(time.monotonic() - t0, 1)
        print(f"--- part {name}: {'ok' if rec['ok'] else 'FAILED'} in {rec['part_s']} s", flush=True)
    report.pop("running", None)
    return failed


def write_report(out: Path, parts: tuple[str, ...], report: dict) -> Path:
    path = out / f"fleet_2gpu_{'_'.join(parts)}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    return path


def start_watchdog(deadline_s: float, out: Path, parts: tuple[str, ...], report: dict, fleet_box: list) -> threading.Event:
    """Past ``deadline_s``, write the report as it stands, SIGKILL the servers and exit 3: a part stuck
    (an NCCL broadcast nobody receives, say) must not take the report with it when the device call's
    own time limit kills this process. Set the returned event to call it off."""
    done = threading.Event()

    def watch() -> None:
        if done.wait(deadline_s):
            return
        report.update(ok=False, deadline_exceeded_s=deadline_s)
        for _ in range(3):  # the parts may be changing the report right now
            try:
                write_report(out, parts, report)
                break
            except RuntimeError:
                time.sleep(0.1)
        print(f"--- deadline of {deadline_s} s passed during part {report.get('running')}: report written, exiting",
              flush=True)
        for server in (fleet_box[0].servers if fleet_box else []):
            if server.proc is not None:
                os.killpg(server.proc.pid, signal.SIGKILL)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()
    return done


def main(out: Path, parts: tuple[str, ...], engine: str, small: bool, deadline_s: float,
         deterministic: bool = True) -> int:
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)} (known: {', '.join(PARTS)})")
    if engine == "sglang":
        os.environ.update(NCCL_ENV)  # the servers inherit it (Server copies os.environ)
    out.mkdir(parents=True, exist_ok=True)
    sizes = SMALL_SIZES if small else GPU_SIZES
    report: dict = {"engine": engine, "sizes": vars(sizes), "parts": list(parts)}
    failed, fleet, fleet_box = list(parts), None, []
    t0 = time.monotonic()
    watchdog = start_watchdog(deadline_s, out, parts, report, fleet_box)
    tmp = Path(tempfile.mkdtemp(prefix="fleet2gpu-"))  # checkpoints (~70 MB each) and state dirs
    try:
        fleet = Fleet.create(engine, sizes, out, tmp, deterministic=deterministic)
        report.update(deterministic=fleet.deterministic, agreement_rule=fleet.agreement_rule)
        fleet_box.append(fleet)
        report["servers"] = [s.base for s in fleet.servers]
        report["startup_s"] = fleet.start_all()
        failed = run_parts(fleet, parts, report)
    finally:
        if fleet is not None:
            fleet.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
        watchdog.set()
        report.update(ok=not failed, failed=failed, total_s=round(time.monotonic() - t0, 1))
        write_report(out, parts, report)
        print(json.dumps(report, indent=1, default=str, cls=_Brief))
    return 1 if failed else 0


class _Brief(json.JSONEncoder):
    """The log's copy of the report: long token lists shortened (the JSON file has them whole)."""

    def iterencode(self, o, _one_shot=False):
        return super().iterencode(_shorten(o), _one_shot)


def _shorten(o):
    if isinstance(o, dict):
        return {k: _shorten(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_shorten(v) for v in o[:12]] + ([f"... {len(o) - 12} more"] if len(o) > 12 else [])
    return o


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Two sparrow servers behind sglang-router, a worker killed, NCCL weight updates (issue 23).")
    ap.add_argument("out", type=Path)
    ap.add_argument("--parts", default="router,kill,nccl", help="comma-separated: router, kill, nccl")
    ap.add_argument("--engine", default="sglang", choices=("sglang", "reference"),
                    help="sglang: one server per GPU; reference: CPU servers (router and kill parts only)")
    ap.add_argument("--small", action="store_true", help="few short requests (default with --engine reference)")
    ap.add_argument("--deadline-s", type=float, default=330.0,
                    help="write the report and exit 3 after this many seconds (the device call's limit is ~6 min)")
    ap.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                    help="SGLang servers without --enable-deterministic-inference; the router part then compares "
                         "answers with the bf16 tolerance instead of demanding bit-identical ones")
    a = ap.parse_args()
    sys.exit(main(a.out, tuple(a.parts.split(",")), a.engine, a.small or a.engine == "reference", a.deadline_s,
                  a.deterministic))
