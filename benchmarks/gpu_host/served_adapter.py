"""The DistillSparse adapter served (issue 25, item 3): does the adapter that ``distill_gpu.py`` (``host.sh 6``)
trained let the tight budget hold, live, on the production engine, the tail the looser budget holds without it,
and would the autopilot then pick the tighter budget? One device call, after stage 6 on the same warm host.

1. ``sparrow-server serve --engine sglang`` on the converted SmolLM2 with LoRA enabled (the adapter's target
   modules and rank) and exact acceptance at the kept positions of verified requests (``SPARROW_EXACT_STRIDE``);
   ``--verify-fraction 0`` (only these requests verify). The adapter is loaded with ``POST /adapters``.
2. Three arms on fixed-budget schedules (1 sink + 2 recent pages, layers 0-1 dense, as the distill run):
   the tight budget without and with the adapter, and the next-larger (looser) budget without it (``--grid-budgets``:
   more budgets without it, between the two, so that the report can say where the autopilot would settle without the
   adapter; one arm each, the same rollouts per arm: ``--heldout-samples 1`` keeps the call's length). The held-out
   prompts of the distill run (the 40 fidelity prompts) x its samples, each arm with the same seeds, temperature
   1, ``ignore_eos``, sequences of ``--total-tokens``, ``verify: true``, all in flight ``--concurrency`` at a time,
   the arms interleaved (a run cut by its deadline leaves the arms even). Each arm samples its own tokens: the
   adapter arm is scored on the adapted actor's rollouts, as it would serve (the distill report's in-process
   scoring used the un-adapted actor's tokens).
3. Per token: the exact acceptance at the kept positions from each response's ``meta.exact_subsample``; an
   engine that verifies every position exactly (the reference engine: the CPU dry run) puts no per-token values
   in ``meta``, so they come from the server's ``GET /autopilot/evidence``, joined on the rollout's ``rid``. The
   tokens attended per step from the response's ``kv_budget_tokens``.
4. The report (``served_report.py``): per length bin (the decision rule's bins) and arm, p5 with a 95%
   prompt-bootstrap interval and attended tokens per step; per target, the product's autopilot controller on
   each arm's measured tail, and whether it picks a tighter budget with the adapter than without. Targets: the
   looser arm's lowest p5 over the qualifying bins, rounded down (what the looser budget holds without the
   adapter), plus ``--targets``.

``--deadline-s``: no rollout is waited for past ``deadline - reserve``; the report covers what came back.
Writes into WORK: ``served_adapter.{json,md}``, ``rollouts.jsonl``, ``server.log``; ``--pack OUT`` copies what a
device call brings back (3 files: the pair and ``served_adapter_logs.tar.xz``).

    python benchmarks/gpu_host/served_adapter.py WORK --adapter /tmp/w16/distill/adapter --pack OUT \\
        [--distill-summary /tmp/w16/distill/distill_summary.json] [--model-dir DIR] [--deadline-s 470]
    # CPU dry run: --engine reference --device cpu --total-tokens 160 --tight-budget 64 --looser-budget 96 ...
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FuturesTimeout, as_completed
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

from distill_rule import RULE, load_rule  # noqa: E402  (stdlib only: --help stays fast)
from run_common import (Clock, add_field_flags, add_model_dir, config_from_args, doc_parser, engine_args,  # noqa: E402
                        fixed_schedule, logger, model_dir_or_error, pack_outputs, run_and_pack, serve_command)

PAGE = 16
MIN_BUDGET = 64  # 1 sink + 2 recent pages + at least 1 selected page
ENGINES = ("sglang", "reference")
AUTOPILOT_MIN_TOKENS = 512  # the autopilot's DEFAULT_MIN_TOKENS (a test checks they agree; numpy stays unimported)
PACKED = ("served_adapter.json", "served_adapter.md")
IN_TAR = ("*.log", "rollouts.jsonl")
# What the distill run's summary fixes (``distill_summary.json``, ``run.config``): the same prompts, lengths, budgets.
FROM_DISTILL = ("tight_budget", "looser_budget", "total_tokens", "n_heldout_prompts", "heldout_samples", "seed")


@dataclass(frozen=True)
class RunConfig:
    out: Path
    model_dir: Path
    adapter: Path
    rule: Path = RULE
    distill_summary: Path | None = None
    engine: str = "sglang"
    device: str = "cuda"
    adapter_name: str = "distill-served"
    tight_budget: int = 256
    looser_budget: int = 512
    total_tokens: int = 2048
    n_heldout_prompts: int = 40
    heldout_samples: int = 2
    seed: int = 0
    stride: int = 4
    exact_max_mib: int = 16384
    concurrency: int = 64  # requests in flight; graphs up to 64, as the distill run's server
    cuda_graph_max_bs: int = 64
    targets: str = ""  # more autopilot targets, comma-separated (the automatic one is always there)
    # more budgets without the adapter, comma-separated (e.g. 320,384,448): where between tight and looser the
    # autopilot would settle without the adapter, so a gain that closes part of the gap shows as tokens saved
    grid_budgets: str = ""
    autopilot_min_tokens: int = AUTOPILOT_MIN_TOKENS
    deadline_s: float = 470.0
    reserve_s: float = 30.0
    server_timeout_s: float = 240.0
    port: int = 31900
    threads: int = 0
    pack: Path | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine = {self.engine!r}: must be one of {list(ENGINES)}")
        for name in ("tight_budget", "looser_budget"):
            if getattr(self, name) % PAGE or getattr(self, name) < MIN_BUDGET:
                raise ValueError(f"{name} = {getattr(self, name)}: whole {PAGE}-token pages, at least {MIN_BUDGET}")
        if self.looser_budget <= self.tight_budget:
            raise ValueError(f"looser_budget = {self.looser_budget}: must exceed tight_budget = {self.tight_budget}")
        if self.total_tokens <= self.looser_budget + PAGE:
            raise ValueError(f"total_tokens = {self.total_tokens}: must exceed looser_budget + one page")
        for name in ("n_heldout_prompts", "heldout_samples", "stride", "exact_max_mib", "concurrency",
                     "cuda_graph_max_bs", "autopilot_min_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")
        if not self.deadline_s > self.reserve_s > 0:
            raise ValueError(f"reserve_s = {self.reserve_s}, deadline_s = {self.deadline_s}: need deadline_s > reserve_s > 0")
        for t in self.target_list:
            if not 0 < t < 1:
                raise ValueError(f"targets = {self.targets!r}: each must be in (0, 1)")
        for b in self.grid_list:
            if b % PAGE or b < MIN_BUDGET or b in (self.tight_budget, self.looser_budget) or b > self.total_tokens - PAGE:
                raise ValueError(f"grid_budgets = {self.grid_budgets!r}: each whole {PAGE}-token pages, at least "
                                 f"{MIN_BUDGET}, under total_tokens, neither the tight nor the looser budget")

    @property
    def target_list(self) -> list[float]:
        return [float(t) for t in self.targets.split(",") if t.strip()]

    @property
    def grid_list(self) -> list[int]:
        try:
            return sorted({int(b) for b in self.grid_budgets.split(",") if b.strip()})
        except ValueError:
            raise ValueError(f"grid_budgets = {self.grid_budgets!r}: comma-separated token counts") from None

    @property
    def budgets(self) -> list[int]:
        return sorted({self.tight_budget, self.looser_budget, *self.grid_list})

    def arms(self) -> dict[str, dict[str, Any]]:
        """{arm: {"budget", "adapter"}}: the tight budget without and with the adapter, the looser without, and
        each grid budget without."""
        return {f"tight-{self.tight_budget}": {"budget": self.tight_budget, "adapter": None},
                f"tight-{self.tight_budget}+adapter": {"budget": self.tight_budget, "adapter": self.adapter_name},
                f"looser-{self.looser_budget}": {"budget": self.looser_budget, "adapter": None},
                **{f"grid-{b}": {"budget": b, "adapter": None} for b in self.grid_list}}


log = logger("served_adapter")


def schedule_for(budget: int, bin_tokens: int) -> Any:
    """A fixed budget with the library's defaults (page 16, 1 sink, 2 recent, layers 0-1 dense), as the distill
    run's schedules; ``bin_tokens``: the report's bins, so the server's monitor bins the same way."""
    return fixed_schedule(f"served-fixed-{budget}", budget, f"issue 25 served DistillSparse check: fixed {budget // PAGE} pages",
                          bin_tokens)


def heldout_ids(config: RunConfig) -> list[list[int]]:
    """The distill run's held-out prompts (``distill_prompts.heldout_prompts``), chat-templated as it does."""
    from transformers import AutoTokenizer

    from distill_prompts import heldout_prompts
    from sparrow_server.engine.chat_template import chat_template_ids, user_turn

    tokenizer = AutoTokenizer.from_pretrained(str(config.model_dir))
    return [[int(t) for t in chat_template_ids(tokenizer, user_turn(text))]
            for text in heldout_prompts()[: config.n_heldout_prompts]]


def requests(config: RunConfig, prompts: list[list[int]], schedules: dict[int, str]) -> list[dict[str, Any]]:
    """Every (prompt, sample) in every arm, arms interleaved; one seed per (prompt, sample), the same in each arm."""
    new = config.total_tokens - max(len(p) for p in prompts)  # one length for all, as the distill run's sampling
    if new < 2:
        raise ValueError(f"total_tokens = {config.total_tokens}: the longest prompt has {max(len(p) for p in prompts)} tokens")
    out = []
    for i, (p, s) in enumerate((p, s) for p in range(len(prompts)) for s in range(config.heldout_samples)):
        for arm, spec in config.arms().items():
            out.append({"arm": arm, "prompt": p, "sample": s, "seed": config.seed + i, "budget": spec["budget"],
                        "schedule": schedules[spec["budget"]], "adapter": spec["adapter"], "prompt_ids": prompts[p],
                        "prompt_len": len(prompts[p]), "max_new_tokens": new})
    return out


def adapter_info(path: Path) -> dict[str, Any]:
    from sparrow_server.adapter_meta.metadata import read_adapter_metadata

    meta = read_adapter_metadata(path)
    return {"path": str(path), "rank": meta.rank, "alpha": meta.alpha, "target_modules": list(meta.target_modules),
            "schedule_id": meta.schedule_id, "base_fingerprint": meta.base_fingerprint,
            "steps": meta.extra.get("steps"), "n_train_tokens": meta.extra.get("n_train_tokens")}


def server_command(config: RunConfig, adapter: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    cmd = [*serve_command(config, config.port, config.out / "server-state"),
           "--verify-fraction", "0", "--max-batch-size", str(config.concurrency),
           "--adapter-root", str(config.adapter.resolve().parent), "--max-lora-rank", str(adapter["rank"])]
    env = {"SPARROW_EXACT_STRIDE": str(config.stride), "SPARROW_EXACT_MAX_MIB": str(config.exact_max_mib)}
    if config.engine == "reference":  # the CPU dry run: peft adapters, exact at every position
        return cmd + engine_args(config), env
    targets = adapter["target_modules"]  # SGLang's pool holds these modules' LoRA weights ("all" for all-linear)
    targets = ["all"] if targets in (["all-linear"], ["all"]) else targets
    return cmd + [*engine_args(config), "--enable-lora", "--lora-target-modules", *targets], env


def run_requests(config: RunConfig, clock: Clock, client: Any, todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """All requests, ``concurrency`` at a time; none waited for past ``deadline - reserve`` (those get an error)."""
    stop_at = config.deadline_s - config.reserve_s

    def one(req: dict[str, Any]) -> dict[str, Any]:
        rec = {k: v for k, v in req.items() if k != "max_new_tokens"}
        if clock.elapsed() > stop_at:
            return {**rec, "error": "not started before the deadline"}
        try:
            res = client.rollout(input_ids=req["prompt_ids"], schedule=req["schedule"], adapter=req["adapter"], verify=True,
                                 sampling_params={"max_new_tokens": req["max_new_tokens"], "temperature": 1.0,
                                                  "ignore_eos": True, "seed": req["seed"]})
            rec.update(rid=res.rid, completion_ids=list(res.token_ids), kv_budget_tokens=list(res.kv_budget_tokens),
                       meta=res.meta.raw)
            if "acceptance_error" in res.meta.raw:
                rec["error"] = f"verification: {res.meta.raw['acceptance_error']}"
        except Exception as exc:  # recorded: the report counts what came back
            rec["error"] = f"{type(exc).__name__}: {exc}"
        return rec

    out: list[dict[str, Any] | None] = [None] * len(todo)
    pool = ThreadPoolExecutor(max_workers=config.concurrency)
    futures = {pool.submit(one, req): i for i, req in enumerate(todo)}
    try:
        for n, future in enumerate(as_completed(futures, timeout=max(stop_at - clock.elapsed(), 1.0)), 1):
            out[futures[future]] = future.result()
            if n % 24 == 0:
                log(clock, f"{n} of {len(todo)} rollouts back")
    except FuturesTimeout:
        log(clock, f"deadline: {sum(r is None for r in out)} rollouts not back, left out")
    pool.shutdown(wait=False, cancel_futures=True)  # the server stops next: what still runs fails at once
    return [r if r is not None else {**{k: v for k, v in req.items() if k != "max_new_tokens"},
                                     "error": "not back before the deadline"} for r, req in zip(out, todo)]


def attach_values(records: list[dict[str, Any]], evidence: list[dict[str, Any]]) -> None:
    """Each answered record's kept positions and exact values: from ``meta.exact_subsample``, else (an engine that
    verified every position exactly) from the server's evidence record of the same ``rid``."""
    by_rid = {e.get("rid"): e for e in evidence if e.get("kind") == "exact"}
    for r in records:
        if r.get("error"):
            continue
        sub = (r.get("meta") or {}).get("exact_subsample")
        if sub is not None:
            r.update(kept_positions=list(sub["positions"]), kept_values=list(sub["acceptance"]),
                     missing_kept=len(sub.get("missing", [])), source="meta")
        elif r["rid"] in by_rid and r["meta"].get("acceptance_kind") == "exact":
            e = by_rid[r["rid"]]
            r.update(kept_positions=[b - r["prompt_len"] for b in e["basis_lengths"]], kept_values=list(e["acceptance"]),
                     missing_kept=0, source="evidence")


def all_evidence(client: Any) -> list[dict[str, Any]]:
    """Every record of ``GET /autopilot/evidence`` (it pages by ``after``)."""
    records, after = [], 0
    while True:
        page = client.http.get("/autopilot/evidence", params={"after": after}).json()
        records += page["records"]
        if not page["records"] or page["next"] <= after:
            return records
        after = page["next"]


def run(config: RunConfig, clock: Clock) -> dict[str, Any]:
    import httpx

    from grpo_gpu import Proc, wait_healthy
    from served_report import analyse, markdown
    from sparrow_server.client import SparrowClient
    from sparrow_server.client.common import RetryPolicy

    rule = load_rule(config.rule)
    adapter = adapter_info(config.adapter)
    sched = {b: schedule_for(b, rule.bin_tokens) for b in config.budgets}
    cmd, env = server_command(config, adapter)
    url = f"http://127.0.0.1:{config.port}"
    spawned = clock.elapsed()
    server = Proc(cmd, config.out / "server.log", env)  # first: the prompts are tokenised while it starts
    timings: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=config.concurrency + 8, max_keepalive_connections=config.concurrency + 8)
    http = httpx.Client(base_url=url, timeout=max(config.deadline_s - config.reserve_s - clock.elapsed(), 30), limits=limits)
    try:
        todo = requests(config, heldout_ids(config), {b: s.name for b, s in sched.items()})
        log(clock, f"{len(todo)} rollouts: {config.n_heldout_prompts} prompts x {config.heldout_samples} x arms {list(config.arms())}")
        wait_healthy(server, url, min(config.server_timeout_s, config.deadline_s - config.reserve_s - clock.elapsed()))
        timings["server_start_s"] = round(clock.elapsed() - spawned, 1)
        log(clock, f"server healthy after {timings['server_start_s']} s")
        with SparrowClient(url, http=http, retry=RetryPolicy(retries=0)) as client:
            t0 = time.monotonic()
            r = client.http.post("/adapters", json={"name": config.adapter_name, "path": str(config.adapter.resolve())})
            if r.status_code != 200:
                raise RuntimeError(f"POST /adapters answered {r.status_code}: {r.text[:500]}")
            timings["adapter_load_s"] = round(time.monotonic() - t0, 1)
            for s in sched.values():
                client.put_schedule(s.name, s.to_dict())
            t0 = clock.elapsed()
            records = run_requests(config, clock, client, todo)
            timings["rollouts_s"] = round(clock.elapsed() - t0, 1)
            evidence = all_evidence(client) if any("exact_subsample" not in (r.get("meta") or {}) for r in records
                                                   if not r.get("error")) else []
    finally:
        server.stop()
        log(clock, "server stopped")
    attach_values(records, evidence)
    (config.out / "rollouts.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "kv_budget_tokens"})
                                                       + "\n" for r in records))
    report = analyse(records, config.arms(), f"looser-{config.looser_budget}", bin_tokens=rule.bin_tokens,
                     min_bin_start=rule.min_bin_start_tokens, quantile=rule.quantile, confidence=rule.confidence,
                     n_boot=rule.n_boot, targets=config.target_list, min_tokens=config.autopilot_min_tokens,
                     page_size=PAGE, reserved_pages=sched[config.tight_budget].reserved_pages, seed=config.seed)
    timings["wall_s"] = round(clock.elapsed(), 1)
    first = report["autopilot"][0] if report["autopilot"] else None
    headline = (f"autopilot at target {first['target']:.2f}: tighter with the adapter **{first['tighter_with_adapter']}**"
                if first else "no target (the looser arm has no qualifying bin with enough kept tokens)")
    summary = {"headline": headline, "report": report, "adapter": adapter, "device": device_info(config),
               "timings": timings, "rule": rule.name, "distill": distill_record(config.distill_summary),
               "schedules": {b: s.to_dict() for b, s in sched.items()},
               "config": {f.name: (str(v) if isinstance(v := getattr(config, f.name), Path) else v) for f in fields(config)}
               | {"bin_tokens": rule.bin_tokens, "quantile": rule.quantile, "confidence": rule.confidence}}
    (config.out / "served_adapter.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    (config.out / "served_adapter.md").write_text(markdown(summary))
    log(clock, headline.replace("**", ""))
    return summary


def distill_record(path: Path | None) -> dict[str, Any] | None:
    """The distill run's in-process result (float32 PEFT on the un-adapted actor's tokens), for comparison."""
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    return {"path": str(path), "verdict": data.get("verdict"), "pooled": data.get("pooled")}


def device_info(config: RunConfig) -> str:
    import torch

    return torch.cuda.get_device_name() if config.device.startswith("cuda") and torch.cuda.is_available() else config.device


def pack(work: Path, dest: Path) -> list[Path]:
    """What a device call brings back (3 files; host.sh's OUT takes at most 8)."""
    return pack_outputs(work, dest, PACKED, IN_TAR, "served_adapter_logs.tar.xz")


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    d = RunConfig(out=Path("."), model_dir=Path("."), adapter=Path("."))
    p = doc_parser(__doc__)
    p.add_argument("out", type=Path, help="work folder (rollouts, report, server log)")
    p.add_argument("--adapter", type=Path, required=True, help="the PEFT adapter directory (stage 6: $W/distill/adapter)")
    p.add_argument("--pack", type=Path, default=None, help="copy what comes back here (3 files)")
    add_model_dir(p)
    p.add_argument("--rule", type=Path, default=d.rule, help="the distill decision rule (its bins and bootstrap)")
    p.add_argument("--distill-summary", type=Path, default=None,
                   help=f"the distill run's distill_summary.json: its {', '.join(FROM_DISTILL)} become the defaults")
    p.add_argument("--engine", default=d.engine, choices=ENGINES)
    p.add_argument("--device", default=d.device)
    add_field_flags(p, d, skip=("out", "model_dir", "adapter", "rule", "distill_summary", "pack", "engine", "device"))
    known, _ = p.parse_known_args(argv)
    if known.distill_summary is not None and known.distill_summary.is_file():  # explicit flags still win
        run_config = json.loads(known.distill_summary.read_text()).get("run", {}).get("config", {})
        p.set_defaults(**{k: int(run_config[k]) for k in FROM_DISTILL if k in run_config})
    a = p.parse_args(argv)
    model_dir = model_dir_or_error(p, a.model_dir)
    if not (a.adapter / "adapter_config.json").is_file():
        p.error(f"--adapter {a.adapter}: no adapter_config.json there (run host.sh stage 6 first on this warm host)")
    return config_from_args(p, RunConfig, a, model_dir)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    clock = Clock()
    summary = run_and_pack(config, lambda: run(config, clock), pack)
    print(json.dumps({"headline": summary["headline"], "arms": {a: {k: v[k] for k in ("answered", "requested", "kept_tokens")}
                                                                 for a, v in summary["report"]["arms"].items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
