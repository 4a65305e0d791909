"""DistillSparse at GPU scale (issue 25, item 3): sparse rollouts, LoRA training and held-out tail acceptance
on SmolLM2-135M-Instruct real weights, in one device call, judged by the committed decision rule.

1. Rollouts under the tight schedule (a fixed budget, 1 sink + 2 recent pages, layers 0-1 dense; temperature
   1, ``ignore_eos``, sequences of ``--total-tokens``): on ``sparrow-server serve --engine sglang`` (the
   production path, ``--concurrency`` requests at a time), or in process on the reference engine
   (``--rollouts engine``, the CPU dry run). Held-out first: the 40 hand-written fidelity prompts x
   ``--heldout-samples``. Then training rollouts from seeded template prompts (``distill_prompts.py``, never a
   held-out prompt) in chunks until ``--gen-until-s`` (or ``--n-train-prompts`` are done). The server stops.
2. ``train_lora`` on ``--device`` (``--dtype`` float32 by default: the 135M model is small, and the acceptance
   measured must not carry bf16 rounding): LoRA rank 16 / alpha 16 on all linear layers, k3 loss on the
   sampled tokens, ``--epochs`` passes, stopped ``--eval-reserve-s`` before the deadline.
3. Exact per-token acceptance sum_v min(p_sparse, p_dense) on every held-out token under three arms: tight
   without adapter, tight with the adapter, the looser budget without adapter; per 512-token bin p5 with 95%
   intervals from a paired bootstrap over held-out prompts (``distill_report.py``), and the verdict of
   ``benchmarks/distill/decision_rule.json`` (``distill_rule.py``): pass / fail / insufficient.

Writes into WORK: ``distill_summary.{json,md}``, ``distill_tokens.npz``, ``rollouts-{heldout,train}.jsonl``,
``adapter/`` (PEFT + ``sparrow_adapter.json``), ``server.log``; ``--pack OUT`` copies what a device call brings
back (4 files: the summary pair, the token arrays, ``distill_logs.tar.xz`` with logs, rollouts and the
adapter's metadata; not its weights).

    python benchmarks/gpu_host/distill_gpu.py WORK --pack OUT [--model-dir DIR] [--deadline-s 480]
    # CPU dry run: --rollouts engine --device cpu --total-tokens 112 --tight-budget 64 --looser-budget 96 ...
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

import distill_pack  # noqa: E402  (stdlib only)
from distill_rule import RULE, RuleError, load_rule  # noqa: E402  (stdlib only: --help stays fast)
from run_common import (Clock, add_field_flags, add_model_dir, config_from_args, doc_parser, fixed_schedule,  # noqa: E402
                        logger, model_dir_or_error, run_and_pack)

PAGE = 16
MIN_BUDGET = 64  # 1 sink + 2 recent pages + at least 1 selected page
ROLLOUT_SOURCES = ("server", "engine")
ENGINES = ("sglang", "reference")
DTYPES = ("float32", "bfloat16")
LOSSES = ("k3", "topk_forward_kl")  # tv keeps a [G, V] dense target per rollout: ~0.4 GB each at 2K tokens


@dataclass(frozen=True)
class RunConfig:
    out: Path
    model_dir: Path
    rule: Path = RULE
    rollouts: str = "server"
    engine: str = "sglang"
    device: str = "cuda"
    dtype: str = "float32"
    tight_budget: int = 256
    looser_budget: int = 512
    total_tokens: int = 2048
    n_train_prompts: int = 2048
    samples_per_prompt: int = 1
    heldout_samples: int = 2
    n_heldout_prompts: int = 40
    concurrency: int = 64  # requests in flight; 64 with graphs up to 64 is what sglang_throughput.py ran on the GPU
    cuda_graph_max_bs: int = 64
    rank: int = 16
    alpha: float = 16.0
    lr: float = 2e-4
    batch: int = 8
    epochs: float = 2.0
    loss: str = "k3"
    seed: int = 0
    deadline_s: float = 480.0
    gen_until_s: float = 220.0
    eval_reserve_s: float = 90.0
    server_timeout_s: float = 240.0
    port: int = 31700
    threads: int = 0
    pack: Path | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("rollouts", ROLLOUT_SOURCES), ("engine", ENGINES), ("dtype", DTYPES), ("loss", LOSSES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} = {getattr(self, name)!r}: must be one of {list(allowed)}")
        for name in ("tight_budget", "looser_budget"):
            value = getattr(self, name)
            if value % PAGE or value < MIN_BUDGET:
                raise ValueError(f"{name} = {value}: whole {PAGE}-token pages, at least {MIN_BUDGET} (sink + 2 recent + 1)")
        if self.looser_budget <= self.tight_budget:
            raise ValueError(f"looser_budget = {self.looser_budget}: must exceed tight_budget = {self.tight_budget}")
        if self.total_tokens <= self.looser_budget + PAGE:
            raise ValueError(f"total_tokens = {self.total_tokens}: must exceed looser_budget + one page, "
                             f"or the looser schedule drops nothing")
        for name in ("n_train_prompts", "samples_per_prompt", "heldout_samples", "n_heldout_prompts", "concurrency",
                     "cuda_graph_max_bs", "rank", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")
        if not self.deadline_s > self.eval_reserve_s > 0 or not 0 < self.gen_until_s < self.deadline_s - self.eval_reserve_s:
            raise ValueError(f"gen_until_s = {self.gen_until_s}, eval_reserve_s = {self.eval_reserve_s}, deadline_s = "
                             f"{self.deadline_s}: need 0 < gen_until_s < deadline_s - eval_reserve_s and eval_reserve_s > 0")
        if self.epochs <= 0:
            raise ValueError(f"epochs = {self.epochs}: must be > 0")


log = logger("distill_gpu")


def schedules(config: RunConfig) -> tuple[Any, Any]:
    """(tight, looser): fixed budgets, the library's defaults otherwise (page 16, 1 sink, 2 recent, layers 0-1 dense)."""
    def fixed(name: str, budget: int) -> Any:
        return fixed_schedule(f"distill-{name}-{budget}", budget,
                              f"issue 25 DistillSparse GPU run: {name} fixed budget, {budget // PAGE} pages")
    return fixed("tight", config.tight_budget), fixed("looser", config.looser_budget)


def prompt_sets(config: RunConfig, tokenizer: Any) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(held-out, training) prompt ids, chat-templated."""
    from distill_prompts import heldout_prompts, training_prompts
    from sparrow_server.engine.chat_template import chat_template_ids, user_turn

    held_text = heldout_prompts()[: config.n_heldout_prompts]
    train_text = training_prompts(config.n_train_prompts, config.seed, exclude=set(held_text))
    ids = lambda text: tuple(int(t) for t in chat_template_ids(tokenizer, user_turn(text)))  # noqa: E731
    return [ids(t) for t in held_text], [ids(t) for t in train_text]


def sampling_for(config: RunConfig, prompts: Sequence[tuple[int, ...]]) -> Any:
    from sparrow_server.engine.base import SamplingParams

    longest = max(len(p) for p in prompts)
    if config.total_tokens - longest < 2:
        raise ValueError(f"total_tokens = {config.total_tokens}: the longest prompt has {longest} tokens")
    return SamplingParams(max_new_tokens=config.total_tokens - longest, temperature=1.0, seed=config.seed, ignore_eos=True)


def sample_all(config: RunConfig, clock: Clock, source: Any, held: list, train: list, schedule: Any) -> tuple[list, list, int]:
    """Held-out rollouts (all), then training rollouts chunk by chunk until ``gen_until_s`` (one chunk at least).

    Each chunk's seeds are offset (``_with_seed`` restarts at the base per call). Returns (held-out
    rollouts with their prompt index, training rollouts, training prompts used)."""
    from sparrow_server.distill.sources import generate_rollouts

    sampling = sampling_for(config, held + train)
    held_rollouts = generate_rollouts(source, held, schedule, sampling, config.heldout_samples)
    clusters = [i for i in range(len(held)) for _ in range(config.heldout_samples)]
    log(clock, f"held-out: {len(held_rollouts)} rollouts of {sampling.max_new_tokens} new tokens")
    chunk = max(1, config.concurrency // config.samples_per_prompt)
    out, used = [], 0
    while used < len(train) and (used == 0 or clock.elapsed() < config.gen_until_s):  # one chunk at least
        seeded = replace(sampling, seed=config.seed + 1_000_000 * (1 + used // chunk))
        out += generate_rollouts(source, train[used:used + chunk], schedule, seeded, config.samples_per_prompt)
        used = min(used + chunk, len(train))
        log(clock, f"training rollouts: {len(out)} from {used} prompts")
    if len(held_rollouts) != len(clusters):  # empty completions are dropped; none with ignore_eos
        raise RuntimeError(f"held-out: {len(held_rollouts)} rollouts for {len(clusters)} requests")
    return list(zip(held_rollouts, clusters)), out, used


def server_rollouts(config: RunConfig, clock: Clock, held: list, train: list, schedule: Any) -> tuple[list, list, int]:
    """``sample_all`` against ``sparrow-server serve`` on the model (stopped afterwards: training needs the GPU)."""
    import httpx

    from distill_server import start_server
    from sparrow_server.calibrate.sources import ServerRolloutSource
    from sparrow_server.client import SparrowClient

    server, url = start_server(config, clock)
    limits = httpx.Limits(max_connections=config.concurrency + 8, max_keepalive_connections=config.concurrency + 8)
    try:
        with SparrowClient(url, http=httpx.Client(base_url=url, timeout=900, limits=limits)) as client:
            return sample_all(config, clock, ServerRolloutSource(client, config.concurrency), held, train, schedule)
    finally:
        server.stop()
        log(clock, "server stopped")


def engine_rollouts(config: RunConfig, clock: Clock, model: Any, held: list, train: list, schedule: Any) -> tuple[list, list, int]:
    """``sample_all`` on an in-process reference engine over ``model`` (on ``--device``)."""
    import asyncio

    from sparrow_server.calibrate.sources import EngineRolloutSource
    from sparrow_server.engine.reference import ReferenceEngine

    engine = ReferenceEngine(model, None, "distill", page_size=schedule.page_size,
                             max_batch_size=min(config.concurrency, 64), kv_pool_tokens=config.total_tokens * min(config.concurrency, 64))
    try:
        return sample_all(config, clock, EngineRolloutSource(engine), held, train, schedule)
    finally:
        asyncio.run(engine.shutdown())


def load(config: RunConfig) -> Any:
    import torch

    from sparrow_server.models import load_model

    if config.threads:
        torch.set_num_threads(config.threads)
    return load_model(config.model_dir, device=config.device, dtype=getattr(torch, config.dtype))


def tokenizer(config: RunConfig) -> Any:
    """The converted model's tokenizer alone (saved next to its weights), without touching the GPU."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(config.model_dir))


def distill_config(config: RunConfig, n_train: int) -> Any:
    from sparrow_server.distill.config import DistillConfig

    steps = max(1, math.ceil(config.epochs * n_train / config.batch))
    return DistillConfig(rank=config.rank, alpha=config.alpha, lr=config.lr, batch=config.batch, steps=steps,
                         loss=config.loss, seed=config.seed, heldout_fraction=0.0)


def train(config: RunConfig, clock: Clock, rollouts: list, schedule: Any) -> tuple[Any, Any]:
    """A fresh model (the engine path switched the sampling one's attention), LoRA trained until the reserve."""
    from sparrow_server.distill import train_lora

    model = load(config).model
    settings = distill_config(config, len(rollouts))
    stop = lambda: clock.elapsed() > config.deadline_s - config.eval_reserve_s  # noqa: E731
    step_log = lambda msg: log(clock, msg) if not msg.startswith("step ") or _every(msg, 10) else None  # noqa: E731
    return train_lora(model, rollouts, schedule, settings, heldout=[], log=step_log, stop=stop)


def _every(msg: str, n: int) -> bool:
    """Log every n-th training step (``step k/N loss=...``) and the first."""
    k = int(msg.split()[1].split("/")[0])
    return k == 1 or k % n == 0


def evaluate(peft_model: Any, held: list, tight: Any, looser: Any) -> dict[str, list]:
    from distill_report import ADAPTED, LOOSER, TIGHT
    from sparrow_server.distill.evaluate import Arm, score_arms
    from sparrow_server.distill.train import ADAPTER_NAME

    arms = [Arm(TIGHT, tight), Arm(ADAPTED, tight, ADAPTER_NAME), Arm(LOOSER, looser)]
    return score_arms(peft_model, [r for r, _ in held], arms, temperature=1.0)


def run(config: RunConfig, clock: Clock, rule: Any) -> dict[str, Any]:
    from distill_report import pooled, write_report
    from sparrow_server.distill import dump_rollouts, save_adapter
    from sparrow_server.distill.artifact import report_to_dict

    tight, looser = schedules(config)
    loaded = load(config) if config.rollouts == "engine" else None  # the server loads its own copy
    held_ids, train_ids = prompt_sets(config, loaded.tokenizer if loaded else tokenizer(config))
    log(clock, f"prompts: {len(held_ids)} held-out, {len(train_ids)} training; tight {tight.id}, looser {looser.id}")
    if loaded is None:
        held, train_set, used = server_rollouts(config, clock, held_ids, train_ids, tight)
    else:
        held, train_set, used = engine_rollouts(config, clock, loaded.model, held_ids, train_ids, tight)
    dump_rollouts([r for r, _ in held], config.out / "rollouts-heldout.jsonl")
    dump_rollouts(train_set, config.out / "rollouts-train.jsonl")
    gen_s = clock.elapsed()
    if not train_set:
        raise RuntimeError(f"no training rollouts by gen_until_s = {config.gen_until_s} (elapsed {gen_s:.0f} s)")
    peft_model, report = train(config, clock, train_set, tight)
    train_s = clock.elapsed() - gen_s
    log(clock, f"trained {report.steps} steps on {report.n_train} rollouts ({report.n_train_tokens} tokens)")
    if report.steps == 0:
        log(clock, "WARNING: no training step ran before the reserve (the adapter is its zero initialisation)")
    save_adapter(peft_model, report, config.out / "adapter")
    log(clock, f"scoring {len(held)} held-out rollouts under 3 arms")
    acc = evaluate(peft_model, held, tight, looser)
    log(clock, "scored; bootstrap per bin")
    tokens = pooled(acc, [r.prompt_len for r, _ in held], [c for _, c in held])
    record = {"config": {f.name: str(getattr(config, f.name)) for f in fields(config)}, "training": report_to_dict(report),
              "n_train_prompts_used": used, "n_train_rollouts": len(train_set), "n_heldout_rollouts": len(held),
              "generate_s": round(gen_s, 1), "train_s": round(train_s, 1), "device_info": device_info(config),
              "matches_rule_written_for": written_for_matches(config, rule), "wall_s": round(clock.elapsed(), 1)}
    summary = write_report(config.out, tokens, rule, record)
    log(clock, f"verdict {summary['verdict']}: {summary['decision']['reasons']}")
    return summary


def device_info(config: RunConfig) -> dict[str, Any]:
    import torch

    if not config.device.startswith("cuda") or not torch.cuda.is_available():
        return {"device": config.device}
    return {"device": torch.cuda.get_device_name(), "max_memory_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def written_for_matches(config: RunConfig, rule: Any) -> bool:
    ours = {"tight_budget_tokens": config.tight_budget, "looser_budget_tokens": config.looser_budget,
            "total_tokens": config.total_tokens}
    return all(ours.get(k) == v for k, v in rule.written_for.items())


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    d = RunConfig(out=Path("."), model_dir=Path("."))
    p = doc_parser(__doc__)
    p.add_argument("out", type=Path, help="work folder (rollouts, adapter, report, logs)")
    p.add_argument("--pack", type=Path, default=None, help="copy what comes back here (4 files)")
    add_model_dir(p)
    p.add_argument("--rule", type=Path, default=d.rule, help="the decision rule (default: the committed one)")
    for name, choices in (("rollouts", ROLLOUT_SOURCES), ("engine", ENGINES), ("dtype", DTYPES), ("loss", LOSSES)):
        p.add_argument("--" + name, default=getattr(d, name), choices=choices)
    p.add_argument("--device", default=d.device)
    add_field_flags(p, d, skip=("out", "model_dir", "rule", "pack", "rollouts", "engine", "dtype", "loss", "device"))
    a = p.parse_args(argv)
    return config_from_args(p, RunConfig, a, model_dir_or_error(p, a.model_dir))


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        rule = load_rule(config.rule)  # before anything heavy: a bad rule must not cost a device call
    except RuleError as exc:
        print(f"error: --rule: {exc}", file=sys.stderr)
        return 2
    clock = Clock()
    summary = run_and_pack(config, lambda: run(config, clock, rule), distill_pack.pack)
    print(json.dumps({"verdict": summary["verdict"], "pooled": summary["pooled"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
