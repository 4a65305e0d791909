"""What the fleet parts share: sizes, schedules, the servers, the router settings, rollouts, counting.

Two engines run the same parts: ``sglang`` (``sparrow-server serve --engine sglang``, one per GPU,
the issue-23 run) and ``reference`` (``serve --engine reference`` on CPU, small sizes: the dry run
that checks the parts' logic without a GPU).

``Fleet.deterministic`` (SGLang servers by default; ``fleet_2gpu.py --no-deterministic`` turns it off): the
servers run with ``--enable-deterministic-inference`` (batch-invariant GEMMs and attention, the sparse plan
included), and a worker's answer must equal the same request's direct answer bit for bit
(``AGREEMENT_RULES``). The reference engine has no such mode (its float32 CPU decode differs in the last
bits between batch sizes: ~1e-6 nats in the dry run), so its fleets compare with the bf16 tolerance.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

import sglang_server as S
from fleet_router import RouterSettings, free_port
from sparrow_server.client import RetryPolicy, SparrowClient
from sparrow_server.client.types import SparrowError
from sparrow_server.stats.greedy_agreement import run_from_outputs

KEY = "fleet-2gpu-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# NCCL between the servers' processes and the trainer's on these VMs: no cuMem / P2P IPC (the first
# try failed with "unhandled cuda error"); host shared memory works. NVLink multicast stays off (KINDS.md).
NCCL_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_P2P_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_DEBUG": "WARN"}
SPARSE = "qwen3-1.7b-0.86"  # a shipped preset: 512 tokens of KV below 2000 tokens of length
DENSE = "dense"


@dataclass(frozen=True)
class Sizes:
    prompt_len: int
    new_tokens: int
    requests: int  # per load run (router part: twice, kill part: once)
    concurrency: int  # client requests in flight
    distinct_prompts: int  # x 3 schedules = the distinct requests, each also sent straight to a worker
    fixed_budget: int  # tokens of KV of the fixed-budget schedule: below prompt_len, so it is sparse
    after_kill_requests: int
    client_timeout_s: float  # per request: a request past it counts as hung
    stream_new_tokens: int = 400
    streams: int = 8

    @property
    def fixed_schedule(self) -> str:
        return f"fleet-budget-{self.fixed_budget}"

    @property
    def schedules(self) -> tuple[str, ...]:
        return (SPARSE, DENSE, self.fixed_schedule)


GPU_SIZES = Sizes(prompt_len=1500, new_tokens=48, requests=256, concurrency=32, distinct_prompts=32,
                  fixed_budget=256, after_kill_requests=32, client_timeout_s=120.0)
# The CPU dry run: 2 shared cores, so few and short requests (the preset is dense at this length;
# the fixed budget is not).
SMALL_SIZES = Sizes(prompt_len=96, new_tokens=12, requests=12, concurrency=4, distinct_prompts=2,
                    fixed_budget=64, after_kill_requests=4, client_timeout_s=60.0)

# SGLang flags of the GPU servers (tiny model: a third of the memory, graphs up to the batch size, so every
# decode batch runs a graph: SGLang's deterministic FlashInfer plan splits long rows eagerly, not in graphs).
GPU_ARGS = ["--max-batch-size", "16", "--mem-fraction-static", "0.3", "--cuda-graph-max-bs", "16",
            "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache"]
DETERMINISTIC_ARGS = ["--enable-deterministic-inference"]  # SGLang's; the sparrow backend follows it
# How the router part compares a worker's answer with the same request sent straight to a worker.
AGREEMENT_RULES = {
    True: "exact: tokens, logprobs and top-2 gaps bit-identical (deterministic inference)",
    False: "bf16 tolerance (greedy_agreement; no deterministic inference: batch composition moves bf16 "
           "rounding, and under sparse attention page selections with it)",
}
CPU_ARGS = ["--device", "cpu", "--threads", "1", "--kv-pool-tokens", "8192", "--max-batch-size", "8"]

# Router for the fleet parts (docs/fleet.md, "The 2-GPU fleet run"):
# - health timeout 5 s: SGLang's /health is its /health_generate and never answers under 1 s;
# - interval 2 s and 2 failures to drop a worker: one slow check of a busy worker does not take it
#   out of rotation; a killed one (connection refused) is out within ~4-6 s;
# - 5 retries, 200 ms doubling (0.2 + 0.4 + 0.8 + 1.6 + 3.2 s): a request cut by the kill is
#   re-sent for longer than the dead worker stays in rotation, so a retry that lands on it again
#   still has later ones after it has been dropped;
# - circuit breaker off, as deploy/ runs it: it would keep the restarted worker out for 60 s.
FLEET_ROUTER = RouterSettings(policy="round_robin", health_check_interval_s=2, health_check_timeout_s=5,
                              health_failure_threshold=2, health_success_threshold=1, retry_max_retries=5,
                              retry_initial_backoff_ms=200, retry_backoff_multiplier=2.0, circuit_breaker=False,
                              startup_timeout_s=120.0)


class ReferenceServer(S.Server):
    """``sparrow-server serve --engine reference`` with ``Server``'s start/stop (own process group)."""

    def __init__(self, model_dir: Path, args: list[str], log_path: Path, port: int):
        super().__init__(model_dir, args, log_path, port=port)
        self.cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "reference",
                    "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *args]


@dataclass
class Fleet:
    """Two servers (weights A) and what the parts need to reach, restart and compare them."""

    engine: str
    sizes: Sizes
    out: Path
    tmp: Path
    weights_a: Path
    servers: list[S.Server]
    deterministic: bool = True

    @property
    def agreement_rule(self) -> str:
        return AGREEMENT_RULES[self.deterministic]

    @classmethod
    def create(cls, engine: str, sizes: Sizes, out: Path, tmp: Path, deterministic: bool = True) -> "Fleet":
        """``deterministic``: asked for; only SGLang servers have the mode."""
        weights_a = S.write_tiny_checkpoint(tmp / "weights-a", seed=0, lm_head_std=0.5, attn_scale=2.0)
        fleet = cls(engine, sizes, out, tmp, weights_a, [], deterministic and engine == "sglang")
        ports = [31400, 31401] if engine == "sglang" else [free_port(), free_port()]
        for i, port in enumerate(ports):
            write_fixed_schedule(fleet.state_dir(i), sizes)
            fleet.servers.append(fleet.new_server(i, port, out / f"server-{i}.log"))
        return fleet

    def state_dir(self, i: int) -> Path:
        return self.tmp / f"state-{i}"

    def new_server(self, i: int, port: int, log_path: Path) -> S.Server:
        args = ["--api-key", KEY, "--state-dir", str(self.state_dir(i))]
        if self.engine == "sglang":
            sglang_args = GPU_ARGS + (DETERMINISTIC_ARGS if self.deterministic else [])
            return S.Server(self.weights_a, args + sglang_args, log_path, port=port,
                            env={"CUDA_VISIBLE_DEVICES": str(i)}, sparrow=True)
        return ReferenceServer(self.weights_a, args + CPU_ARGS, log_path, port)

    def start_all(self) -> list[float]:
        with ThreadPoolExecutor(len(self.servers)) as pool:
            return [round(t, 1) for t in pool.map(lambda s: s.start(timeout_s=400), self.servers)]

    def restart(self, i: int, log_name: str) -> float:
        """A fresh process for server ``i`` on its port and state dir (a new log); seconds to healthy."""
        old = self.servers[i]
        self.servers[i] = self.new_server(i, old.port, self.out / log_name)
        return self.servers[i].start(timeout_s=400)

    def stop_all(self) -> None:
        for server in self.servers:
            server.stop()


def write_fixed_schedule(state_dir: Path, sizes: Sizes) -> Path:
    """The fixed-budget schedule, saved where the server loads registered schedules at start (the
    SGLang schedulers read their registry once, so a schedule PUT at run time would not reach them)."""
    from sparrow_server.sparsity.schedule import dump_schedule, schedule_from_dict

    schedule = schedule_from_dict({"name": sizes.fixed_schedule, "budgets_tokens": [sizes.fixed_budget],
                                   "description": "fleet_2gpu: one fixed KV budget at every length"})
    path = state_dir / "schedules" / f"{schedule.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_schedule(schedule))
    return path


def kill_group(server: S.Server) -> None:
    """SIGKILL the server's whole process group (SGLang's scheduler and detokenizer included)."""
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    server.proc = None


def prompts(n: int, length: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 4000) for _ in range(length)] for _ in range(n)]


def sampling(new_tokens: int) -> dict:
    return {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}


def rollout(base: str, prompt: list[int], schedule: str, new_tokens: int, top_logprobs: int = 0) -> dict:
    """One greedy ``/rollout`` straight to a server."""
    body = {"input_ids": prompt, "schedule": schedule, "sampling_params": sampling(new_tokens),
            "top_logprobs": top_logprobs}
    r = httpx.post(base + "/rollout", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def post(base: str, path: str, body: dict, timeout: float = 600) -> dict:
    """An admin call; raises with the answer on anything but 200. Some of SGLang's admin routes answer
    plain text: that comes back as ``{"text": ...}``."""
    r = httpx.post(base + path, json=body, headers=AUTH, timeout=timeout)
    if r.status_code != 200:
        raise RuntimeError(f"{path} -> {r.status_code}: {r.text}")
    try:
        return r.json()
    except ValueError:
        return {"text": r.text}


def generate_lines(log_path: Path, offset: int = 0) -> int:
    """``POST /generate`` requests a server logged (its HTTP access log) after byte ``offset``."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return 0
    return sum(1 for line in text.splitlines() if '"POST /generate HTTP' in line)


def router_retries(router) -> float:
    """``smg_worker_retries_total`` summed: requests the router re-sent to another worker."""
    total = 0.0
    for line in router.metrics_text().splitlines():
        if line.startswith("smg_worker_retries_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass(frozen=True)
class Request:
    """One client request of a load run: which prompt, which schedule, its rid."""

    index: int
    prompt: int
    schedule: str
    rid: str


def load_requests(sizes: Sizes, tag: str, count: int | None = None) -> list[Request]:
    """``count`` requests cycling over every (prompt, schedule) pair; rids unique per ``tag``."""
    pairs = [(p, s) for p in range(sizes.distinct_prompts) for s in sizes.schedules]
    return [Request(i, *pairs[i % len(pairs)], f"{tag}-{i}") for i in range(count or sizes.requests)]


def send_all(url: str, requests: list[Request], ps: list[list[int]], sizes: Sizes,
             on_done=None) -> tuple[list[dict], float]:
    """Send every request through ``SparrowClient.generate`` (schedule in ``extra_key``), ``concurrency``
    at a time, with no client retry: what comes back is the router's answer. Returns one outcome per
    request (in order) and the wall time."""
    client = SparrowClient(url, timeout=sizes.client_timeout_s, retry=RetryPolicy(retries=0))

    def one(req: Request) -> dict:
        # logprobs and the top two: an answer is compared with the tolerance bf16 explains (greedy_agreement)
        payload = {"input_ids": ps[req.prompt], "rid": req.rid, "sampling_params": sampling(sizes.new_tokens),
                   "return_logprob": True, "top_logprobs_num": 2}
        t0 = time.monotonic()
        outcome = {"rid": req.rid, "schedule": req.schedule, "prompt": req.prompt}
        try:
            answer = client.generate(payload, schedule=req.schedule)
            meta = answer.get("meta_info") or {}
            outcome.update(status=200, output_ids=answer.get("output_ids"), id=meta.get("id"),
                           ran_schedule=(meta.get("sparrow") or {}).get("schedule"), run=run_from_outputs([answer]))
        except SparrowError as exc:
            outcome.update(status=exc.status, error=str(exc.body if exc.body is not None else exc)[:500])
        except httpx.TimeoutException as exc:
            outcome.update(status="timeout", error=f"{type(exc).__name__}: {exc}"[:500])
        except httpx.HTTPError as exc:
            outcome.update(status="connection", error=f"{type(exc).__name__}: {exc}"[:500])
        outcome["latency_s"] = time.monotonic() - t0
        if on_done is not None:
            on_done(outcome)
        return outcome

    t0 = time.monotonic()
    with client, ThreadPoolExecutor(sizes.concurrency) as pool:
        outcomes = list(pool.map(one, requests))
    return outcomes, time.monotonic() - t0


def complete(outcome: dict, sizes: Sizes) -> bool:
    """A 200 for this request's own rid with every asked-for token."""
    return (outcome["status"] == 200 and len(outcome.get("output_ids") or ()) == sizes.new_tokens
            and outcome.get("id") in (None, outcome["rid"]))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 256 requests is the 254th smallest)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def load_summary(outcomes: list[dict], wall_s: float, sizes: Sizes) -> dict:
    """Latency p50/p99 of the completed requests and output tokens/s over the run's wall time."""
    done = [o for o in outcomes if complete(o, sizes)]
    latencies = [o["latency_s"] for o in done] or [float("nan")]
    tokens = sum(len(o["output_ids"]) for o in done)
    return {"requests": len(outcomes), "completed": len(done), "wall_s": round(wall_s, 3),
            "latency_p50_s": round(percentile(latencies, 50), 4), "latency_p99_s": round(percentile(latencies, 99), 4),
            "output_tokens": tokens, "output_tokens_per_s": round(tokens / wall_s, 1) if wall_s > 0 else None,
            "concurrency": sizes.concurrency}
