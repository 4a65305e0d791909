"""The DistillSparse artifact: a PEFT adapter directory plus ``sparrow_adapter.json``.

``sparrow_adapter.json`` records what a server and a reader need to trust the adapter: the
base-model fingerprint it was trained on, the schedule it was trained for, the LoRA shape, the
training settings and loss curve, and held-out acceptance before and after.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .train import DistillReport

METADATA_FILE = "sparrow_adapter.json"
METADATA_FORMAT_VERSION = 1
PEFT_CONFIG_FILE = "adapter_config.json"


class AdapterArtifactError(ValueError):
    """A missing or malformed adapter directory; the message names the path and the problem."""


@dataclass(frozen=True)
class AdapterMetadata:
    """What ``read_adapter_metadata`` returns (from ``adapter_config.json`` + ``sparrow_adapter.json``)."""

    path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_fingerprint: str | None  # None for a plain PEFT directory without sparrow metadata
    schedule_id: str | None
    extra: dict


def report_to_dict(report: DistillReport) -> dict[str, Any]:
    return {
        "format_version": METADATA_FORMAT_VERSION,
        "kind": "distill-sparse",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_fingerprint": report.base_fingerprint,
        "schedule_id": report.schedule_id,
        "rank": report.config.rank,
        "alpha": report.config.alpha,
        "target_modules": list(report.target_modules),
        "config": report.config.to_dict(),
        "trainable_parameters": report.trainable_parameters,
        "n_train": report.n_train,
        "n_heldout": report.n_heldout,
        "n_train_tokens": report.n_train_tokens,
        "steps": report.steps,
        "loss_curve": list(report.loss_curve),
        "heldout_acceptance_before": report.before.to_dict() if report.before else None,
        "heldout_acceptance_after": report.after.to_dict() if report.after else None,
        "seconds": report.seconds,
        **report.extra,
    }


def save_adapter(peft_model: Any, report: DistillReport, out_dir: str | Path) -> Path:
    """Write the PEFT adapter and its metadata to ``out_dir`` (created; must not hold another adapter)."""
    out = Path(out_dir)
    if (out / PEFT_CONFIG_FILE).exists():
        raise AdapterArtifactError(f"--out {str(out)!r}: already holds an adapter; adapters are immutable, pick a new directory")
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out))
    _write_json_atomic(out / METADATA_FILE, report_to_dict(report))
    return out


def _write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def read_adapter_metadata(path: str | Path) -> AdapterMetadata:
    """Read and check an adapter directory (PEFT LoRA config, plus sparrow metadata if present)."""
    root = Path(path)
    if not root.is_dir():
        raise AdapterArtifactError(f"{str(root)!r}: not a directory")
    peft_cfg = _read_json(root / PEFT_CONFIG_FILE)
    if peft_cfg.get("peft_type") != "LORA":
        raise AdapterArtifactError(f"{str(root)!r}: peft_type = {peft_cfg.get('peft_type')!r}, only LORA adapters are served")
    if not any((root / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        raise AdapterArtifactError(f"{str(root)!r}: no adapter_model.safetensors or adapter_model.bin")
    rank = peft_cfg.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterArtifactError(f"{str(root)!r}: adapter_config.json r = {rank!r} is not a positive integer")
    targets = peft_cfg.get("target_modules")
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))
    meta = _read_json(root / METADATA_FILE) if (root / METADATA_FILE).exists() else {}
    return AdapterMetadata(
        path=str(root), rank=rank, alpha=float(peft_cfg.get("lora_alpha", rank)), target_modules=targets,
        base_fingerprint=meta.get("base_fingerprint"), schedule_id=meta.get("schedule_id"), extra=meta,
    )


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdapterArtifactError(f"{str(path)!r}: missing") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterArtifactError(f"{str(path)!r}: unreadable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise AdapterArtifactError(f"{str(path)!r}: must hold a JSON object")
    return data
