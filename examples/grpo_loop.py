"""A small but real GRPO loop against Sparrow servers (or a router in front of them).

Each step: sample ``n`` completions per prompt with a sparse schedule, score them with a
verifiable reward (exact match on toy additions), compute group-normalised advantages, the
trainer's own dense logprobs of the sampled tokens (full attention, no adapter), the truncated
importance weights ``min(exp(dense - sparse), C)`` and the sampled-token acceptance estimate, take
one policy-gradient step on the local copy of the model, save it, and load it on every server
(``/update_weights_from_disk``) so that the next step samples from the new policy. Optionally a
DistillSparse LoRA is trained every K steps and published to the servers.

With ``--weight-sync distributed`` the policy's parameters go from the trainer's memory to every server
over a process group instead (SGLang's ``/update_weights_from_distributed``, opened once at the start):
``--sync-backend gloo`` on CPUs, ``nccl`` from the trainer's GPU (``--device cuda:0``) to servers on
other GPUs (disaggregated, as slime runs it; ``benchmarks/gpu_host/grpo_gpu.py`` runs it on two GPUs).

    sparrow-server serve --port 30000 &                     # embedded SmolLM2-135M-Instruct, CPU
    PYTHONPATH=. python examples/grpo_loop.py --server http://127.0.0.1:30000 --steps 3

Through a router (data plane ``/generate`` via the router, control plane to each server):

    python examples/grpo_loop.py --via-router http://router:30000 \\
        --server http://rollout-0:30000 --server http://rollout-1:30000 --schedule qwen3-8b-0.86 \\
        --model /models/Qwen3-8B

The client sends the schedule in ``extra_key`` too, the field the router keeps; the log's
``schedule`` column says which schedule served the samples. See examples/README.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

if not __package__:  # run as a script: make the sibling ``grpo`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo.fleet_sync import (  # noqa: E402
    DEMO_SCHEDULE_NAME, BroadcastSync, DiskSync, distill_adapter, ensure_schedule, publish_adapter,
)
from grpo.objective import (  # noqa: E402
    DEFAULT_TIS_CAP, ObjectiveSettings, acceptance, group_advantages, importance_weights, policy_update,
)
from grpo.sampling import GenerateSampler, RolloutSampler, Sample, SamplingSettings  # noqa: E402
from grpo.tasks import Problem, arithmetic_problems, exact_match_reward, prompt_ids  # noqa: E402

SEED_STRIDE = 1_000_003  # per-step offset of the sampling seeds
WEIGHT_SYNCS = ("disk", "distributed")
SYNC_BACKENDS = ("gloo", "nccl")
DEFAULT_MASTER_PORT = 29650


@dataclass(frozen=True)
class LoopConfig:
    servers: tuple[str, ...]  # every server: schedules, weight updates, adapters (and /rollout without a router)
    via_router: str | None = None  # send /generate here instead of /rollout to the servers
    schedule: str = DEMO_SCHEDULE_NAME
    model: str | None = None  # the servers' base model (HF dir or .gguf); None = the embedded SmolLM2
    steps: int = 3
    prompts_per_step: int = 4
    samples_per_prompt: int = 4
    max_new_tokens: int = 32
    context_examples: int = 0  # worked additions before each question (long prompts: budgets drop pages)
    temperature: float = 1.0
    lr: float = 1e-6
    tis_cap: float = DEFAULT_TIS_CAP
    seed: int = 0
    out_dir: str = "grpo-run"
    threads: int = 1  # torch threads of the trainer
    api_key: str | None = None
    distill_every: int = 0  # 0: no DistillSparse
    distill_steps: int = 4
    publish: bool = False
    adapter_dir: str | None = None  # where adapters are written (under the servers' --adapter-root); default <out_dir>/adapters
    sync_initial: bool = False  # push the trainer's starting weights first (version "0")
    device: str = "cpu"  # the trainer's: dense logprobs, the policy update (and NCCL's sending side)
    weight_sync: str = "disk"  # disk: save + /update_weights_from_disk; distributed: a process group
    sync_backend: str = "gloo"
    master_address: str = "127.0.0.1"  # the trainer's address as the servers reach it (distributed)
    master_port: int = DEFAULT_MASTER_PORT

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("servers: give at least one --server URL (weight updates go to every server)")
        for name in ("steps", "prompts_per_step", "max_new_tokens", "threads", "distill_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")
        if self.samples_per_prompt < 2:
            raise ValueError(f"samples_per_prompt = {self.samples_per_prompt}: GRPO needs >= 2 per group")
        if not self.temperature > 0:
            raise ValueError(f"temperature = {self.temperature}: must be > 0 (logprobs are at temperature T)")
        if self.distill_every < 0:
            raise ValueError(f"distill_every = {self.distill_every}: must be >= 0")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"weight_sync = {self.weight_sync!r}: must be one of {', '.join(WEIGHT_SYNCS)}")
        if self.sync_backend not in SYNC_BACKENDS:
            raise ValueError(f"sync_backend = {self.sync_backend!r}: must be one of {', '.join(SYNC_BACKENDS)}")
        if self.weight_sync == "distributed" and self.sync_backend == "nccl" and not self.device.startswith("cuda"):
            raise ValueError(f"device = {self.device!r}: NCCL sends from a GPU; give --device cuda:N")


@dataclass(frozen=True)
class StepLog:
    step: int
    reward_mean: float
    correct: int
    samples: int
    tis_mean: float
    tis_max: float
    tis_capped_frac: float
    acceptance_est: float
    completion_tokens: int
    rollout_s: float
    rollout_tokens_per_s: float
    train_s: float
    sync_s: float
    loss: float
    grad_norm: float
    sampled_weight_versions: tuple[str, ...]
    pushed_weight_version: str
    schedules_served: tuple[str, ...]
    kv_budget_tokens_mean: float | None
    adapter: str | None = None
    distill_s: float = 0.0
    example: str = ""  # the first prompt's question and first completion


    def line(self) -> str:
        return (f"step {self.step} | reward {self.reward_mean:.3f} ({self.correct}/{self.samples}) | "
                f"TIS mean {self.tis_mean:.3f} max {self.tis_max:.3f} capped {self.tis_capped_frac:.1%} | "
                f"accept {self.acceptance_est:.3f} | {self.completion_tokens} tok / {self.rollout_s:.1f} s = "
                f"{self.rollout_tokens_per_s:.1f} tok/s | train {self.train_s:.1f} s | sync {self.sync_s:.1f} s | "
                f"sampled w={','.join(self.sampled_weight_versions)} -> pushed w={self.pushed_weight_version} | "
                f"schedule {','.join(self.schedules_served)} (kv {self.kv_budget_tokens_mean or 0:.0f})"
                + (f" | distill {self.distill_s:.1f} s" if self.distill_s else "")
                + (f" | adapter {self.adapter}" if self.adapter else "") + f"\n  e.g. {self.example}")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def make_weight_sync(config: LoopConfig, out: Path) -> DiskSync | BroadcastSync:
    if config.weight_sync == "disk":
        return DiskSync(config.servers, out / "checkpoints", config.api_key)
    from sparrow_server.client.weight_broadcast import BroadcastConfig

    device = config.device if config.sync_backend == "nccl" else None
    return BroadcastSync(config.servers, BroadcastConfig(
        master_port=config.master_port, master_address=config.master_address, backend=config.sync_backend,
        device=device, api_key=config.api_key))


def make_sampler(config: LoopConfig):
    if config.via_router:
        return GenerateSampler(config.via_router, config.schedule, config.api_key)
    return RolloutSampler(config.servers, config.schedule, config.api_key)


class GRPOLoop:
    """The loop's state: the trainable dense policy, its optimizer, the sampler and the task."""

    def __init__(self, config: LoopConfig, model: Any, tokenizer: Any,
                 reward: Callable[[str, Problem], float] = exact_match_reward):
        self.config = config
        self.model, self.tokenizer, self.reward = model.eval(), tokenizer, reward
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
        self.objective = ObjectiveSettings(temperature=config.temperature, tis_cap=config.tis_cap)
        self.schedule = ensure_schedule(config.servers, config.schedule, config.api_key)
        self.sampler = make_sampler(config)
        self.problems = arithmetic_problems(config.steps * config.prompts_per_step, config.seed,
                                            context_examples=config.context_examples)
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.adapters = Path(config.adapter_dir) if config.adapter_dir else self.out / "adapters"
        self.weights = make_weight_sync(config, self.out)

    def close(self) -> None:
        self.sampler.close()
        self.weights.close()

    def completions(self, samples: Sequence[Sample]) -> list[str]:
        return [self.tokenizer.decode(list(s.token_ids), skip_special_tokens=True) for s in samples]

    def rewards(self, problems: Sequence[Problem], samples: Sequence[Sample], texts: Sequence[str]) -> torch.Tensor:
        """[P, n] rewards; ``samples`` are grouped by prompt, in prompt order."""
        n = self.config.samples_per_prompt
        assert len(samples) == len(problems) * n, "every prompt must have n samples"
        values = [self.reward(text, problems[s.prompt_index]) for s, text in zip(samples, texts)]
        return torch.tensor(values, dtype=torch.float64).reshape(len(problems), n)

    def step(self, step: int) -> StepLog:
        c = self.config
        problems = self.problems[(step - 1) * c.prompts_per_step: step * c.prompts_per_step]
        prompts = [prompt_ids(self.tokenizer, p) for p in problems]
        settings = SamplingSettings(c.samples_per_prompt, c.max_new_tokens, c.temperature, c.seed + step * SEED_STRIDE)
        t0 = time.monotonic()
        samples = self.sampler.sample(prompts, settings)
        t1 = time.monotonic()
        texts = self.completions(samples)
        rewards = self.rewards(problems, samples, texts)
        advantages = group_advantages(rewards).flatten().tolist()
        update = policy_update(self.model, self.optimizer, samples, advantages, self.objective)
        t2 = time.monotonic()
        adapter_dir, distill_s = self._maybe_distill(step, samples)
        t3 = time.monotonic()
        self.push(step)
        adapter = self._maybe_publish(adapter_dir)
        t4 = time.monotonic()
        example = f"{problems[0].question!r} -> {texts[0]!r} (reward {float(rewards[0, 0]):g})"
        return self._log(step, samples, rewards, update, t1 - t0, t2 - t1, t4 - t3, distill_s, adapter, example)

    def push(self, version: int) -> None:
        """Every server serves the policy as weight version ``version`` (from disk or over the group)."""
        self.weights.push(self.model, version)

    def _maybe_distill(self, step: int, samples: Sequence[Sample]) -> tuple[Path | None, float]:
        c = self.config
        if not c.distill_every or step % c.distill_every:
            return None, 0.0
        start = time.monotonic()
        path, report = distill_adapter(self.model, samples, self.schedule, self.adapters / f"distill-step-{step}",
                                       c.distill_steps)
        if report.before and report.after:
            print(f"  distill: held-out p5 acceptance {report.before.p5:.3f} -> {report.after.p5:.3f} ({path})")
        return path, time.monotonic() - start

    def _maybe_publish(self, adapter_dir: Path | None) -> str | None:
        if adapter_dir is None or not self.config.publish:
            return self.sampler.adapter
        self.sampler.adapter = publish_adapter(self.config.servers, adapter_dir.name, adapter_dir, self.config.api_key)
        return self.sampler.adapter

    def _log(self, step, samples, rewards, update, rollout_s, train_s, sync_s, distill_s, adapter, example) -> StepLog:
        dense = [torch.tensor(d, dtype=torch.float64) for d in update.dense_logprobs]
        tis = torch.cat([importance_weights(d, s, self.config.tis_cap) for d, s in zip(dense, samples)])
        acc = torch.cat([acceptance(d, s) for d, s in zip(dense, samples)])
        budgets = [s.kv_budget_tokens_mean for s in samples if s.kv_budget_tokens_mean is not None]
        return StepLog(
            step=step, reward_mean=float(rewards.mean()), correct=int((rewards > 0).sum()), samples=len(samples),
            tis_mean=float(tis.mean()), tis_max=float(tis.max()),
            tis_capped_frac=float((tis >= self.config.tis_cap).double().mean()), acceptance_est=float(acc.mean()),
            completion_tokens=update.tokens, rollout_s=rollout_s, rollout_tokens_per_s=update.tokens / rollout_s,
            train_s=train_s, sync_s=sync_s, loss=update.loss, grad_norm=update.grad_norm,
            sampled_weight_versions=tuple(sorted({s.weight_version for s in samples})), pushed_weight_version=str(step),
            schedules_served=tuple(sorted({s.schedule for s in samples})),
            kv_budget_tokens_mean=_mean(budgets) if budgets else None, adapter=adapter, distill_s=distill_s,
            example=example,
        )


def run_loop(config: LoopConfig, model: Any = None, tokenizer: Any = None,
             reward: Callable[[str, Problem], float] = exact_match_reward,
             echo: Callable[[str], None] = print) -> list[StepLog]:
    """Run ``config.steps`` steps; the per-step logs are also appended to ``<out_dir>/steps.jsonl``."""
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    if model is None:
        from sparrow_server.models import load_model

        loaded = load_model(config.model, device=config.device)
        model, tokenizer = loaded.model, tokenizer or loaded.tokenizer
    model = model.to(config.device)
    if tokenizer is None:
        raise ValueError("tokenizer: the model directory has none; pass one")
    loop = GRPOLoop(config, model, tokenizer, reward)
    if config.sync_initial:
        loop.push(0)
    logs = []
    try:
        with open(loop.out / "steps.jsonl", "a") as jsonl:
            for step in range(1, config.steps + 1):
                logs.append(loop.step(step))
                echo(logs[-1].line())
                jsonl.write(json.dumps(asdict(logs[-1])) + "\n")
                jsonl.flush()
    finally:
        loop.close()
    return logs


def parse_args(argv: Sequence[str] | None = None) -> LoopConfig:
    d = LoopConfig(servers=("-",))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", action="append", required=True, help="a server URL (repeat for a fleet)")
    p.add_argument("--via-router", default=None, help="router URL: sample through its /generate")
    p.add_argument("--schedule", default=d.schedule, help=f"schedule name (default {d.schedule}, registered if missing)")
    p.add_argument("--model", default=None, help="the servers' base model (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    p.add_argument("--samples-per-prompt", "-n", type=int, default=d.samples_per_prompt)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--context-examples", type=int, default=d.context_examples,
                   help="worked additions before each question (~14 tokens each): prompts long enough for a budget to bite")
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--tis-cap", type=float, default=d.tis_cap, help="C in min(exp(dense - sparse), C)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out-dir", default=d.out_dir, help="checkpoints, adapters and steps.jsonl")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads of the trainer")
    p.add_argument("--api-key", default=None, help="admin token of the servers (weight updates, schedules)")
    p.add_argument("--distill-every", type=int, default=0, help="train a DistillSparse LoRA every K steps")
    p.add_argument("--distill-steps", type=int, default=d.distill_steps, help="optimizer steps per distillation")
    p.add_argument("--publish", action="store_true", help="load the adapter on the servers and sample with it")
    p.add_argument("--adapter-dir", default=None,
                   help="where adapters are written: a folder under the servers' --adapter-root (default OUT_DIR/adapters)")
    p.add_argument("--sync-initial", action="store_true", help="push the trainer's starting weights before step 1")
    p.add_argument("--device", default=d.device, help="the trainer's torch device (cuda:0 on a GPU host)")
    p.add_argument("--weight-sync", choices=WEIGHT_SYNCS, default=d.weight_sync,
                   help="disk: save + /update_weights_from_disk; distributed: broadcast over a process group")
    p.add_argument("--sync-backend", choices=SYNC_BACKENDS, default=d.sync_backend, help="the group's backend")
    p.add_argument("--master-address", default=d.master_address, help="the trainer's address as the servers reach it")
    p.add_argument("--master-port", type=int, default=d.master_port, help="the group's TCPStore port (trainer side)")
    a = p.parse_args(argv)
    return LoopConfig(
        servers=tuple(a.server), via_router=a.via_router, schedule=a.schedule, model=a.model, steps=a.steps,
        prompts_per_step=a.prompts_per_step, samples_per_prompt=a.samples_per_prompt, max_new_tokens=a.max_new_tokens,
        context_examples=a.context_examples, temperature=a.temperature, lr=a.lr, tis_cap=a.tis_cap, seed=a.seed, out_dir=a.out_dir, threads=a.threads,
        api_key=a.api_key, distill_every=a.distill_every, distill_steps=a.distill_steps, publish=a.publish,
        adapter_dir=a.adapter_dir, sync_initial=a.sync_initial, device=a.device, weight_sync=a.weight_sync,
        sync_backend=a.sync_backend, master_address=a.master_address, master_port=a.master_port,
    )


def main(argv: Sequence[str] | None = None) -> int:
    start = time.monotonic()
    try:
        config = parse_args(argv)
    except ValueError as exc:
        print(f"grpo_loop: {exc}", file=sys.stderr)
        return 2
    logs = run_loop(config)
    tokens = sum(x.completion_tokens for x in logs)
    print(f"done: {len(logs)} steps, {tokens} completion tokens, {time.monotonic() - start:.1f} s in all "
          f"(log: {Path(config.out_dir) / 'steps.jsonl'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
