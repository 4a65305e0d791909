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
from pathlib import Path
from typing import Any

from sparrow_server.adapter_meta.metadata import METADATA_FILE, METADATA_FORMAT_VERSION, PEFT_CONFIG_FILE, AdapterArtifactError

from .train import DistillReport


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
