"""An adapter directory as a server reads it: a PEFT LoRA directory (``adapter_config.json`` plus
weights), optionally with ``sparrow_adapter.json`` (written by ``distill``: base-model fingerprint,
schedule, training record)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
