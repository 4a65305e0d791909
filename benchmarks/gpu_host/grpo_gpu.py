"""examples/grpo_loop.py on two GPUs (issue 23, item 3): three rollout policies side by side, same seed.

Three ``sparrow-server serve --engine sglang`` servers share GPU 1 (one per arm, each on SmolLM2-135M-Instruct
real weights, the converted GGUF ``host.sh`` stage 3 leaves in ``/tmp/w16/model_dir``); three trainers share
GPU 0 (``examples/grpo_loop.py --device cuda:0 --weight-sync distributed --sync-backend nccl``: each pushes
its policy's parameters to its own server over NCCL every step). Arms:

- ``dense``: every layer attends its whole KV.
- ``calibrated``: the committed SmolLM2 schedule (``benchmarks/results/fidelity/calibrated_schedule.json``,
  searched on CPU for p5 acceptance >= 0.89 with 64-token bins; there is no GPU-calibrated one: gpu_call16's
  call 4 did not run). Its budgets (64, 128, 192, 192, 256, 256 tokens by total length) keep every page
  below 192 tokens, so on the bare questions (42-44 tokens) it would keep everything. Each question
  therefore follows ``--context-examples`` 48 worked additions (prompts of 470-488 tokens, SmolLM2's
  tokenizer): with up to 128 new tokens the sequence is 30-38 pages and the arm keeps 16 of them.
  Whether the schedule holds its tail at these lengths (it was searched up to 384 tokens) the run's
  sampled-token acceptance estimate shows.
- ``aggressive``: a fixed budget of 48 tokens = 3 pages (1 sink + 1 selected + 1 recent; layers 0-1 dense
  like the calibrated one): 3 of 30-38 pages.

Each arm writes ``WORK/<arm>/steps.jsonl`` and ``trainer.log``; at the end ``WORK/grpo_summary.json`` and
``WORK/grpo_steps.png`` (``grpo_report.py``). ``--pack OUT`` then copies what a device call brings back (at
most 8 files): the summary, the plot, ``steps-<arm>.jsonl`` per arm and ``grpo_logs.tar.xz`` (trainer and
server logs). A watchdog stops the trainers at ``--deadline-s`` (the report then covers the steps done). NCCL between the two GPUs goes over host shared
memory (``NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 NCCL_NVLS_ENABLE=0``, docs/fleet.md), in every process.

    python benchmarks/gpu_host/grpo_gpu.py WORK --pack OUT [--model-dir DIR] [--steps 100]
    # CPU dry run (reference engine, gloo, tiny sizes): --engine reference --steps 2 ...
"""
from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

import httpx  # noqa: E402

import grpo_report  # noqa: E402
import smollm2  # noqa: E402
from run_common import add_model_dir, doc_parser, model_dir_or_error, run_and_pack, serve_command  # noqa: E402

NCCL_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "WARN"}
CALIBRATED = ROOT / "benchmarks" / "results" / "fidelity" / "calibrated_schedule.json"
ARMS = ("dense", "calibrated", "aggressive")
# SmolLM2's study settings (smollm2.py), but three servers on one card: a small static share each and a
# capped KV pool, because SGLang sizes its pool from the memory free when it starts and three servers start
# at once (a cap keeps one server's pool from eating the headroom another measured).
SERVER_OVERRIDES = {"--mem-fraction-static": "0.2"}
SERVER_EXTRA = ["--max-total-tokens", "65536", "--context-length", "2048"]


@dataclass(frozen=True)
class RunConfig:
    out: Path
    model_dir: Path
    engine: str = "sglang"
    steps: int = 100
    prompts_per_step: int = 4
    samples_per_prompt: int = 8
    max_new_tokens: int = 128
    context_examples: int = 48  # worked additions before each question: prompts of ~480 tokens
    lr: float = 5e-6
    seed: int = 0
    aggressive_budget: int = 48
    calibrated: Path = CALIBRATED
    server_gpu: int = 1
    trainer_gpu: int = 0
    base_port: int = 31600
    master_port: int = 29660
    deadline_s: float = 470.0
    server_timeout_s: float = 300.0
    pack: Path | None = None

    def __post_init__(self) -> None:
        if self.engine not in ("sglang", "reference"):
            raise ValueError(f"engine = {self.engine!r}: sglang (GPU) or reference (CPU dry run)")
        if self.aggressive_budget % 16 or self.aggressive_budget < 32:
            raise ValueError(f"aggressive_budget = {self.aggressive_budget}: whole 16-token pages, at least 2")
        for name in ("steps", "prompts_per_step", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")

    @property
    def gpu(self) -> bool:
        return self.engine == "sglang"


def schedules(config: RunConfig) -> dict[str, dict[str, Any] | None]:
    """The schedule each arm's server registers (None: the built-in ``dense``)."""
    calibrated = json.loads(config.calibrated.read_text())
    pages = config.aggressive_budget // 16
    return {
        "dense": None,
        "calibrated": {k: v for k, v in calibrated.items() if k != "name"},
        "aggressive": {"budgets_tokens": [config.aggressive_budget], "sink_pages": 1, "recent_pages": 1,
                       "dense_layers": [0, 1], "description": f"issue 23 GRPO: over-aggressive fixed budget, {pages} pages"},
    }


def schedule_name(arm: str) -> str:
    return "dense" if arm == "dense" else f"grpo-{arm}"


def server_args(config: RunConfig) -> list[str]:
    if not config.gpu:
        return ["--device", "cpu", "--threads", "1", "--kv-pool-tokens", "8192"]
    args = list(smollm2.SERVER_ARGS)
    for flag, value in SERVER_OVERRIDES.items():
        args[args.index(flag) + 1] = value
    return ["--", *args, *SERVER_EXTRA]


class Proc:
    """A child in its own process group (stopped as a group), logging to ``log``."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str]):
        self.cmd, self.log = cmd, log
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                         start_new_session=True, cwd=ROOT)

    def stop(self, sig: int = signal.SIGTERM, wait_s: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=wait_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_server(config: RunConfig, arm: str, port: int) -> Proc:
    env = {**NCCL_ENV, "CUDA_VISIBLE_DEVICES": str(config.server_gpu)} if config.gpu else {}
    cmd = [*serve_command(config, port, config.out / arm / "state"), *server_args(config)]
    return Proc(cmd, config.out / f"server-{arm}.log", env)


def wait_healthy(server: Proc, url: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.tail()}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5)
            return round(time.monotonic() - t0, 1)
        except Exception:
            time.sleep(2)
    raise TimeoutError(f"server not healthy after {timeout_s} s:\n{server.tail()}")


def trainer_cmd(config: RunConfig, arm: str, url: str, index: int) -> list[str]:
    backend, device = ("nccl", f"cuda:{config.trainer_gpu}") if config.gpu else ("gloo", "cpu")
    return [sys.executable, str(ROOT / "examples" / "grpo_loop.py"), "--server", url, "--schedule", schedule_name(arm),
            "--model", str(config.model_dir), "--steps", str(config.steps),
            "--prompts-per-step", str(config.prompts_per_step), "--samples-per-prompt", str(config.samples_per_prompt),
            "--max-new-tokens", str(config.max_new_tokens), "--context-examples", str(config.context_examples),
            "--lr", str(config.lr), "--seed", str(config.seed),
            "--out-dir", str(config.out / arm), "--device", device, "--weight-sync", "distributed",
            "--sync-backend", backend, "--master-port", str(config.master_port + index), "--sync-initial"]


def trainer_pythonpath() -> str:
    """This checkout first, then the caller's path (on the GPU host: the kit in /tmp/site)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def register(url: str, name: str, body: dict[str, Any] | None) -> None:
    if body is not None:
        httpx.put(f"{url}/schedules/{name}", json=body, timeout=60).raise_for_status()


def wait_trainers(trainers: dict[str, Proc], deadline: float) -> dict[str, Any]:
    """Each trainer's exit code, or ``"stopped at the deadline"`` (SIGINT first: it closes its group)."""
    while time.monotonic() < deadline and any(t.proc.poll() is None for t in trainers.values()):
        time.sleep(1)
    outcome = {}
    for arm, t in trainers.items():
        if t.proc.poll() is None:
            t.stop(signal.SIGINT, wait_s=15)
            outcome[arm] = "stopped at the deadline"
        else:
            outcome[arm] = t.proc.returncode
    return outcome


def run(config: RunConfig) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + config.deadline_s
    for arm in ARMS:
        (config.out / arm).mkdir(parents=True, exist_ok=True)
    urls = {arm: f"http://127.0.0.1:{config.base_port + i}" for i, arm in enumerate(ARMS)}
    servers = {arm: start_server(config, arm, config.base_port + i) for i, arm in enumerate(ARMS)}
    record: dict[str, Any] = {"config": {k: str(v) for k, v in asdict(config).items()}, "arms": list(ARMS)}
    try:
        with ThreadPoolExecutor(len(ARMS)) as pool:
            record["server_start_s"] = dict(zip(ARMS, pool.map(
                lambda a: wait_healthy(servers[a], urls[a], config.server_timeout_s), ARMS)))
        print(f"[grpo_gpu +{time.monotonic() - started:.0f}s] servers healthy: {record['server_start_s']}", flush=True)
        for arm, body in schedules(config).items():
            register(urls[arm], schedule_name(arm), body)
        env = {**(NCCL_ENV if config.gpu else {}), "PYTHONPATH": trainer_pythonpath(), "PYTHONUNBUFFERED": "1"}
        trainers = {arm: Proc(trainer_cmd(config, arm, urls[arm], i), config.out / arm / "trainer.log", env)
                    for i, arm in enumerate(ARMS)}
        record["trainers"] = wait_trainers(trainers, deadline)
    finally:
        for server in servers.values():
            server.stop()
    record["wall_s"] = round(time.monotonic() - started, 1)
    return grpo_report.write_report(config.out, ARMS, extra={"run": record})


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    d = RunConfig(out=Path("."), model_dir=Path("."))
    p = doc_parser(__doc__)
    p.add_argument("out", type=Path, help="work folder (steps, logs, servers' state)")
    p.add_argument("--pack", type=Path, default=None, help="copy the results here in at most 8 files")
    add_model_dir(p)
    p.add_argument("--engine", default=d.engine, choices=("sglang", "reference"))
    for name in ("steps", "prompts_per_step", "samples_per_prompt", "max_new_tokens", "context_examples", "seed", "aggressive_budget",
                 "server_gpu", "trainer_gpu", "base_port", "master_port"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("lr", "deadline_s", "server_timeout_s"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    p.add_argument("--calibrated", type=Path, default=d.calibrated, help="the calibrated arm's schedule file")
    a = p.parse_args(argv)
    model_dir = model_dir_or_error(p, a.model_dir)
    fields = {k: v for k, v in vars(a).items() if k not in ("out", "model_dir", "pack")}
    return RunConfig(out=a.out, model_dir=model_dir, pack=a.pack, **fields)


def pack(work: Path, dest: Path) -> list[Path]:
    """What a device call brings back (at most 8 files, 2 folders deep): 6 files."""
    dest.mkdir(parents=True, exist_ok=True)
    files = [p for p in (work / "grpo_summary.json", work / "grpo_steps.png") if p.is_file()]
    out = [Path(shutil.copy(p, dest / p.name)) for p in files]
    for arm in ARMS:
        if (work / arm / "steps.jsonl").is_file():
            out.append(Path(shutil.copy(work / arm / "steps.jsonl", dest / f"steps-{arm}.jsonl")))
    with tarfile.open(dest / "grpo_logs.tar.xz", "w:xz") as tar:
        for log in sorted([*work.glob("*.log"), *work.glob("*/trainer.log")]):
            tar.add(log, arcname=str(log.relative_to(work)))
    return [*out, dest / "grpo_logs.tar.xz"]


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    summary = run_and_pack(config, lambda: run(config), pack)
    print(json.dumps({"run": summary["run"], "arms": summary["arms"]}, indent=1))
    finished = all(s.get("steps") == config.steps for s in summary["arms"].values())
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
