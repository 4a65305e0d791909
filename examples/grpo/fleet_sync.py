"""What the trainer tells the servers directly (never through the router, which forwards neither
``PUT /schedules`` nor the weight routes): the demo schedule, the new policy weights after each step,
and (optionally) a DistillSparse adapter.

The weights go one of two ways: ``DiskSync`` saves a checkpoint and has every server load it
(``/update_weights_from_disk``: trainer and servers share a file system); ``BroadcastSync`` sends the
policy's parameters from the trainer's memory over a process group (SGLang's
``/update_weights_from_distributed``, ``sparrow_server.client.weight_broadcast``: gloo, or NCCL from the
trainer's GPU to the servers').
"""
from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from sparrow_server.client import SparrowError, update_weights
from sparrow_server.client.weight_broadcast import BroadcastConfig, WeightBroadcaster
from sparrow_server.distill.publish import DEFAULT_ALIAS, publish
from sparrow_server.sparsity.schedule import Schedule, schedule_from_dict

from .sampling import Sample, http_client

# A deliberately tight toy schedule: 3 pages of 16 tokens (1 sink + 1 selected + 1 recent) at every
# length, layers 0-1 dense. A ~45-token chat prompt plus 32 new tokens then decodes mostly sparse,
# the way a 32K rollout under a calibrated schedule does.
DEMO_SCHEDULE_NAME = "grpo-demo-48"
DEMO_SCHEDULE: dict[str, Any] = {
    "budgets_tokens": [48], "sink_pages": 1, "recent_pages": 1, "dense_layers": [0, 1],
    "description": "examples/grpo_loop.py toy schedule: 48 KV tokens per sparse layer",
}
CHECKPOINT_PREFIX = "policy-step-"


def ensure_schedule(urls: Sequence[str], name: str, api_key: str | None = None) -> Schedule:
    """Register the demo schedule where it is missing; any other name must exist on every server."""
    found = None
    for url in urls:
        with http_client(url, api_key) as client:
            try:
                found = client.get_schedule(name)
            except SparrowError as exc:
                if exc.status != 404 or name != DEMO_SCHEDULE_NAME:
                    raise ValueError(f"--schedule {name!r} on {url}: {exc}") from exc
                found = client.put_schedule(name, DEMO_SCHEDULE)
    return schedule_from_dict(found)


def save_checkpoint(model: Any, root: Path, step: int) -> Path:
    """``save_pretrained`` into ``root/policy-step-<step>`` (written aside, then renamed into place)."""
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{CHECKPOINT_PREFIX}{step}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}."))
    model.save_pretrained(tmp)
    tmp.rename(target)
    return target


def prune_checkpoints(root: Path, keep: Path) -> None:
    """Remove every policy checkpoint but ``keep`` (the servers have loaded it into memory)."""
    for path in root.glob(f"{CHECKPOINT_PREFIX}*"):
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)


def push_weights(urls: Sequence[str], checkpoint: Path, step: int, api_key: str | None = None) -> dict[str, Any]:
    """Every server loads ``checkpoint`` (in-flight rollouts finish first) as weight version ``step``."""
    return update_weights(list(urls), str(checkpoint.resolve()), weight_version=str(step), api_key=api_key)


class DiskSync:
    """Save the policy, every server loads it, older checkpoints go."""

    def __init__(self, urls: Sequence[str], root: Path, api_key: str | None = None):
        self.urls, self.root, self.api_key = list(urls), root, api_key

    def push(self, model: Any, version: int) -> None:
        checkpoint = save_checkpoint(model, self.root, version)
        push_weights(self.urls, checkpoint, version, self.api_key)
        prune_checkpoints(self.root, keep=checkpoint)

    def close(self) -> None:
        pass


def policy_tensors(model: Any) -> dict[str, Any]:
    """The policy's parameters by checkpoint name (``model.layers.0.self_attn.q_proj.weight``...). A tied
    output layer appears once, as the embedding (``named_parameters`` drops the alias), which is what
    SGLang's Llama and the reference engine expect."""
    return dict(model.named_parameters())


class BroadcastSync:
    """The policy's parameters from the trainer's memory to every server, each step, over one process
    group opened at the start (``WeightBroadcaster``)."""

    def __init__(self, urls: Sequence[str], config: BroadcastConfig):
        self.broadcaster = WeightBroadcaster(list(urls), config)
        self.broadcaster.open()

    def push(self, model: Any, version: int) -> None:
        self.broadcaster.update(policy_tensors(model), weight_version=str(version))

    def close(self) -> None:
        self.broadcaster.close()


def distill_adapter(policy: Any, samples: Sequence[Sample], schedule: Schedule, out: Path, steps: int) -> tuple[Path, Any]:
    """DistillSparse on this step's rollouts: a LoRA on a copy of the policy so that the sparse actor
    under ``schedule`` matches the dense policy (``sparrow_server.distill``). Returns (dir, report)."""
    from sparrow_server.distill import DistillConfig, Rollout, save_adapter, train_lora

    rollouts = [Rollout(s.prompt_ids + s.token_ids, len(s.prompt_ids)) for s in samples if s.token_ids]
    config = DistillConfig(steps=steps, batch=min(4, len(rollouts)), heldout_fraction=0.25)
    peft_model, report = train_lora(copy.deepcopy(policy), rollouts, schedule, config)
    return save_adapter(peft_model, report, out), report


def publish_adapter(urls: Sequence[str], name: str, path: Path, api_key: str | None = None) -> str:
    """Load ``path`` under the immutable ``name`` on every server, point ``distill-latest`` at it and
    unload the version it pointed at before, once drained (``sparrow_server.distill.publish``; at a
    step boundary nothing is in flight). ``path`` must lie under each server's ``--adapter-root``.
    Returns the alias to send with rollouts."""
    publish(list(urls), name, str(path.resolve()), DEFAULT_ALIAS, api_key)
    return DEFAULT_ALIAS
