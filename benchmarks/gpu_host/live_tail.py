"""Live tail check (issue 25, item 1): the per-bin p5 the production engine's live monitor reports, against the
float32 oracle's exact p5 of every position of the same rollouts, in one device call.

1. ``sparrow-server serve --engine sglang`` on the converted SmolLM2 (``smollm2.py``'s settings, CUDA graphs up
   to ``--cuda-graph-max-bs``), with the verifier's exact subsample at ``--stride`` (``SPARROW_EXACT_STRIDE``) and
   room for the kept rows (``SPARROW_EXACT_MAX_MIB``); ``--verify-fraction 0`` (only the requests below verify).
2. Two fixed-budget schedules with ``--bin-tokens`` bins are registered: ``livetail-fixed-<budget>`` (the check)
   and ``livetail-fixed-<total>`` (the floor: a budget no rollout outgrows, so no page is ever dropped and its
   live values show only how the bf16 decode row differs from the verify prefill's row).
3. ``--rollouts`` + ``--floor-rollouts`` ``/rollout`` requests at once, each seeded: temperature 1, ``ignore_eos``,
   ``--total-tokens`` tokens, ``verify: true`` (the response waits for the dense pass; its ``meta`` carries the
   kept positions and their exact values, ``exact_subsample``).
4. ``/metrics``: ``sparrow_acceptance_p5`` per bin (the live estimate) and its interval. The server stops.
5. The oracle (``cross_engine.oracle_rollout``: the reference teacher-forced sparse forward and the dense forward,
   float32 on ``--device``) on the same tokens: exact acceptance of every position. It runs in a thread from the
   first answer on, beside the server's remaining verify prefills, check arm first, and takes no new rollout
   ``--oracle-reserve-s`` before the deadline.
6. Per bin: live p5, oracle p5 over every position, the difference and whether it is within ``--tolerance``; its
   split into live - oracle at the kept positions (the engine's rounding) and oracle at the kept positions -
   oracle over all (sampling); whether the live interval covers the oracle p5; per token, server vs oracle at
   the kept positions. Verdict (check arm): ``pass`` (every judged bin within), ``fail``, or ``insufficient``
   (a rollout not verified or not scored, a bin with enough kept tokens unpublished, no bin judged). Bins
   with fewer kept tokens than the monitor publishes at (``DEFAULT_MIN_TOKENS``) are listed, not judged.

On an engine that verifies every position exactly (the reference engine: the CPU dry run) there is no
subsample: the kept positions are all positions and the split is all rounding.

Writes into WORK: ``live_tail.json``, ``live_tail.md``, ``live_tail_tokens.npz``, ``rollouts.jsonl``,
``metrics.txt``, ``server.log``; ``--pack OUT`` copies what a device call brings back (4 files: the pair, the
tokens and ``live_tail_logs.tar.xz``).

    python benchmarks/gpu_host/live_tail.py WORK --pack OUT [--model-dir DIR] [--deadline-s 500]
    # CPU dry run: --engine reference --device cpu --total-tokens 160 --budget 64 --bin-tokens 64 --rollouts 8 ...
"""
from __future__ import annotations

import json
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

from live_tail_report import CHECK, FLOOR, analyse, fmt, live_series, markdown, save_tokens  # noqa: E402
from run_common import (Clock, add_field_flags, add_model_dir, config_from_args, doc_parser, engine_args,  # noqa: E402
                        fixed_schedule, logger, model_dir_or_error, pack_outputs, run_and_pack, serve_command)

PROMPTS = ROOT / "benchmarks" / "fidelity" / "prompts.jsonl"
PAGE = 16
MIN_BUDGET = 64  # 1 sink + 2 recent pages + at least 1 selected page
ENGINES = ("sglang", "reference")
PACKED = ("live_tail.json", "live_tail.md", "live_tail_tokens.npz")
IN_TAR = ("*.log", "rollouts.jsonl", "metrics.txt")


@dataclass(frozen=True)
class RunConfig:
    out: Path
    model_dir: Path
    engine: str = "sglang"
    device: str = "cuda"
    budget: int = 512
    bin_tokens: int = 512
    total_tokens: int = 8160
    rollouts: int = 56
    floor_rollouts: int = 8
    stride: int = 4
    exact_max_mib: int = 16384
    cuda_graph_max_bs: int = 64
    tolerance: float = 0.02
    seed: int = 0
    deadline_s: float = 500.0
    oracle_reserve_s: float = 20.0
    server_timeout_s: float = 240.0
    port: int = 31800
    threads: int = 0
    pack: Path | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine = {self.engine!r}: must be one of {list(ENGINES)}")
        if self.budget % PAGE or self.budget < MIN_BUDGET:
            raise ValueError(f"budget = {self.budget}: whole {PAGE}-token pages, at least {MIN_BUDGET} (sink + 2 recent + 1)")
        if self.total_tokens <= self.budget + PAGE:
            raise ValueError(f"total_tokens = {self.total_tokens}: must exceed budget + one page, or nothing is dropped")
        for name in ("bin_tokens", "rollouts", "stride", "cuda_graph_max_bs", "exact_max_mib"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")
        if self.floor_rollouts < 0:
            raise ValueError(f"floor_rollouts = {self.floor_rollouts}: must be >= 0")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance = {self.tolerance}: must be in (0, 1)")
        if not self.deadline_s > self.oracle_reserve_s > 0:
            raise ValueError(f"oracle_reserve_s = {self.oracle_reserve_s}, deadline_s = {self.deadline_s}: need "
                             "deadline_s > oracle_reserve_s > 0")

    @property
    def concurrency(self) -> int:
        return self.rollouts + self.floor_rollouts

    @property
    def floor_budget(self) -> int:
        """A budget no rollout outgrows (whole pages): nothing dropped."""
        return -(-self.total_tokens // PAGE) * PAGE


log = logger("live_tail")


def schedules(config: RunConfig) -> dict[str, Any]:
    """{arm: Schedule}: fixed budgets (page 16, 1 sink + 2 recent, layers 0-1 dense) with ``bin_tokens`` bins."""
    def fixed(budget: int, what: str) -> Any:
        return fixed_schedule(f"livetail-fixed-{budget}", budget, f"issue 25 live-tail check: {what}", config.bin_tokens)
    out = {CHECK: fixed(config.budget, "the checked fixed budget")}
    if config.floor_rollouts:
        out[FLOOR] = fixed(config.floor_budget, "no page dropped (the rounding floor)")
    return out


def prompt_ids(config: RunConfig) -> list[tuple[str, list[int]]]:
    """(id, chat-templated ids) of the fidelity prompts, with the converted model's tokenizer."""
    from transformers import AutoTokenizer

    from sparrow_server.engine.chat_template import chat_template_ids, user_turn

    tokenizer = AutoTokenizer.from_pretrained(str(config.model_dir))
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    return [(r["id"], [int(t) for t in chat_template_ids(tokenizer, user_turn(r["prompt"]))]) for r in rows]


def requests(config: RunConfig, prompts: list[tuple[str, list[int]]], names: dict[str, str]) -> list[dict[str, Any]]:
    """The rollouts to run: the check arm's over the prompts in order, the floor arm's from the other end."""
    out = []
    for arm, n in ((CHECK, config.rollouts), (FLOOR, config.floor_rollouts)):
        for i in range(n):
            pid, ids = prompts[i % len(prompts)] if arm == CHECK else prompts[-1 - i % len(prompts)]
            if config.total_tokens - len(ids) < 2:
                raise ValueError(f"total_tokens = {config.total_tokens}: prompt {pid} has {len(ids)} tokens")
            out.append({"arm": arm, "prompt_id": pid, "prompt_ids": ids, "schedule": names[arm],
                        "seed": config.seed + len(out)})
    return out


def server_command(config: RunConfig) -> tuple[list[str], dict[str, str]]:
    cmd = [*serve_command(config, config.port, config.out / "server-state"),
           "--verify-fraction", "0", "--max-batch-size", str(config.concurrency)]
    env = {"SPARROW_EXACT_STRIDE": str(config.stride), "SPARROW_EXACT_MAX_MIB": str(config.exact_max_mib)}
    return cmd + engine_args(config), env  # the reference engine (CPU dry run): exact at every position, no subsample


def run_rollouts(config: RunConfig, clock: Clock, url: str, todo: list[dict[str, Any]], timeout_s: float,
                 on_done: Any = None) -> tuple[list[dict], str]:
    """Every request at once; each answer (or its error) in a record, handed to ``on_done(index, record)`` as it
    comes back. Returns the records in request order and the server's /metrics text after the last one."""
    import httpx

    from sparrow_server.client import SparrowClient
    from sparrow_server.client.common import RetryPolicy

    limits = httpx.Limits(max_connections=config.concurrency + 8, max_keepalive_connections=config.concurrency + 8)
    http = httpx.Client(base_url=url, timeout=timeout_s, limits=limits)

    def one(req: dict[str, Any]) -> dict[str, Any]:
        rec = {k: req[k] for k in ("arm", "prompt_id", "prompt_ids", "schedule", "seed")}
        t0 = time.monotonic()
        try:
            res = client.rollout(input_ids=req["prompt_ids"], schedule=req["schedule"], verify=True, sampling_params={
                "max_new_tokens": config.total_tokens - len(req["prompt_ids"]), "temperature": 1.0, "ignore_eos": True,
                "seed": req["seed"]})
            rec.update(rid=res.rid, completion_ids=list(res.token_ids), meta=res.meta.raw)
        except Exception as exc:  # recorded: the verdict is then insufficient
            rec.update(error=f"{type(exc).__name__}: {exc}")
        rec["seconds"] = round(time.monotonic() - t0, 1)
        return rec

    with SparrowClient(url, http=http, retry=RetryPolicy(retries=0)) as client:
        for arm, sched in schedules(config).items():
            client.put_schedule(sched.name, sched.to_dict())
        with ThreadPoolExecutor(max_workers=config.concurrency) as pool:
            futures = {pool.submit(one, req): i for i, req in enumerate(todo)}
            out: list[dict] = [{} for _ in todo]
            for future in as_completed(futures):
                i = futures[future]
                out[i] = future.result()
                if on_done is not None:
                    on_done(i, out[i])
        metrics = client.metrics()
    log(clock, f"{sum('error' not in r for r in out)} of {len(out)} rollouts back, verified")
    return out, metrics


class OracleWorker(threading.Thread):
    """Scores verified rollouts with the float32 oracle as they come back (``put``), check arm first, while the
    server still verifies the others; stops taking new ones ``oracle_reserve_s`` before the deadline. The model
    loads when the thread starts (after the server is up: SGLang sizes its pools from the free memory at start).
    ``values``: rollout index -> [N] exact acceptance of every generated position."""

    _END = (9, 1 << 62, None)

    def __init__(self, config: RunConfig, clock: Clock, names: dict[str, Any]):
        super().__init__(name="live-tail-oracle", daemon=True)
        self.config, self.clock, self.names = config, clock, names
        self.queue: queue.PriorityQueue = queue.PriorityQueue()
        self.values: dict[int, list[float]] = {}
        self.skipped = 0
        self.error: str | None = None  # the model did not load: nothing is scored
        self.errors: dict[int, str] = {}  # rollout index -> why the oracle failed on it
        self.first_s = self.last_s = None

    def put(self, index: int, record: dict[str, Any]) -> None:
        if "error" not in record:
            self.queue.put((0 if record["arm"] == CHECK else 1, index, record))

    def finish(self) -> None:
        """No more rollouts: score what is queued (or stop at the reserve), then return."""
        self.queue.put(self._END)
        self.join()

    def run(self) -> None:
        try:
            import torch

            from cross_engine import oracle_rollout
            from sparrow_server.models import load_model
            from sparrow_server.monitor.scoring import HFScorer

            if self.config.threads:
                torch.set_num_threads(self.config.threads)
            model = load_model(self.config.model_dir, device=self.config.device, dtype=torch.float32).model
            scorer = HFScorer(model)
        except Exception as exc:  # every rollout then stays unscored: the verdict says so
            self.error = f"{type(exc).__name__}: {exc}"
            log(self.clock, f"oracle failed to load: {self.error}")
            while self.queue.get() is not self._END:
                pass
            return
        while True:
            item = self.queue.get()
            if item is self._END:
                break
            _, index, rec = item
            if self.clock.elapsed() > self.config.deadline_s - self.config.oracle_reserve_s:
                self.skipped += 1
                continue
            self.first_s = self.first_s if self.first_s is not None else self.clock.elapsed()
            try:
                exact, _ = oracle_rollout(model, rec["prompt_ids"], rec["completion_ids"], self.names[rec["arm"]], scorer)
            except Exception as exc:  # this rollout stays unscored (the verdict says so); the others go on
                self.errors[index] = f"{type(exc).__name__}: {exc}"
                log(self.clock, f"oracle failed on rollout {index}: {self.errors[index]}")
                continue
            self.values[index] = exact.tolist()
            self.last_s = self.clock.elapsed()
            if len(self.values) % 8 == 0:
                log(self.clock, f"oracle: {len(self.values)} rollouts scored")
        log(self.clock, f"oracle: {len(self.values)} rollouts scored" +
            (f", {self.skipped} not (the reserve before the deadline)" if self.skipped else ""))


def device_info(config: RunConfig) -> str:
    import torch

    if not config.device.startswith("cuda") or not torch.cuda.is_available():
        return f"device {config.device}"
    return f"{torch.cuda.get_device_name()}"


def run(config: RunConfig, clock: Clock) -> dict[str, Any]:
    from grpo_gpu import Proc, wait_healthy

    names = schedules(config)
    prompts = prompt_ids(config)
    todo = requests(config, prompts, {arm: s.name for arm, s in names.items()})
    log(clock, f"{len(todo)} rollouts ({config.rollouts} check under {names[CHECK].name}"
               + (f", {config.floor_rollouts} floor under {names[FLOOR].name}" if FLOOR in names else "") + ")")
    cmd, env = server_command(config)
    url = f"http://127.0.0.1:{config.port}"
    server = Proc(cmd, config.out / "server.log", env)
    oracle = OracleWorker(config, clock, names)
    timings: dict[str, float] = {}
    try:
        timings["server_start_s"] = wait_healthy(server, url, config.server_timeout_s)
        log(clock, f"server healthy after {timings['server_start_s']} s")
        oracle.start()  # scores each rollout as it comes back, beside the server's verify prefills
        t0 = clock.elapsed()
        budget_s = config.deadline_s - clock.elapsed() - config.oracle_reserve_s - 30
        records, metrics = run_rollouts(config, clock, url, todo, timeout_s=max(budget_s, 30), on_done=oracle.put)
        timings["rollouts_and_verification_s"] = round(clock.elapsed() - t0, 1)
    finally:
        server.stop()
        log(clock, "server stopped")
    (config.out / "metrics.txt").write_text(metrics)
    (config.out / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    t0 = clock.elapsed()
    oracle.finish()
    timings["oracle_after_server_s"] = round(clock.elapsed() - t0, 1)
    timings["oracle_first_to_last_s"] = (round(oracle.last_s - oracle.first_s, 1) if oracle.first_s is not None
                                         and oracle.last_s is not None else None)
    for index, values in oracle.values.items():
        records[index]["oracle"] = values
    arms = analyse(records, live_series(metrics), config.bin_tokens, config.tolerance)
    for arm in arms.values():  # unscored rollouts already make an arm insufficient; say why
        if oracle.error:
            arm["notes"].append(f"the oracle did not load: {oracle.error}")
        arm["notes"] += [f"the oracle failed on rollout {i}: {e}" for i, e in oracle.errors.items()
                         if records[i]["schedule"] == arm["schedule"]]
    save_tokens(config.out / "live_tail_tokens.npz", records)
    timings["wall_s"] = round(clock.elapsed(), 1)
    summary = {"verdict": arms[CHECK]["verdict"], "arms": arms, "device": device_info(config), "timings": timings,
               "config": {f.name: (str(v) if isinstance(v := getattr(config, f.name), Path) else v) for f in fields(config)},
               "schedules": {arm: s.to_dict() for arm, s in names.items()}}
    (config.out / "live_tail.json").write_text(json.dumps(summary, indent=1) + "\n")
    (config.out / "live_tail.md").write_text(markdown(summary))
    log(clock, f"verdict {summary['verdict']}: max |diff| {fmt(arms[CHECK]['max_abs_diff'])} "
               f"(rounding {fmt(arms[CHECK]['max_abs_rounding'])}, sampling {fmt(arms[CHECK]['max_abs_sampling'])})")
    return summary


def pack(work: Path, dest: Path) -> list[Path]:
    """What a device call brings back (4 files; host.sh's OUT takes at most 8)."""
    return pack_outputs(work, dest, PACKED, IN_TAR, "live_tail_logs.tar.xz")


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    d = RunConfig(out=Path("."), model_dir=Path("."))
    p = doc_parser(__doc__)
    p.add_argument("out", type=Path, help="work folder (rollouts, metrics, report, logs)")
    p.add_argument("--pack", type=Path, default=None, help="copy what comes back here (4 files)")
    add_model_dir(p)
    p.add_argument("--engine", default=d.engine, choices=ENGINES)
    p.add_argument("--device", default=d.device)
    add_field_flags(p, d, skip=("out", "model_dir", "pack", "engine", "device"))
    a = p.parse_args(argv)
    return config_from_args(p, RunConfig, a, model_dir_or_error(p, a.model_dir))


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    clock = Clock()
    summary = run_and_pack(config, lambda: run(config, clock), pack)
    check = summary["arms"][CHECK]
    print(json.dumps({"verdict": summary["verdict"], "max_abs_diff": check["max_abs_diff"],
                      "failing_bins": check["failing_bins"], "reasons": check["reasons"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
