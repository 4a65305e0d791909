"""Checkpoint preflight: will a new HF checkpoint fit the serving model in place?

Reads only ``config.json`` and the JSON headers of the ``*.safetensors`` files (no tensor data),
so it costs milliseconds even for large models. The SGLang engine calls it before forwarding an
update: SGLang 0.5.17 loads ``/update_weights_from_disk`` into the live parameters, so a checkpoint
of another shape fails half-way (its rollback re-reads the new path); refusing it up front keeps
the old weights serving. The reference engine does the same check on the loaded model instead
(``reference.weight_update.architecture_mismatch``).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparrow_server.engine.weights import WeightLoadError
from sparrow_server.models import user_path

# Config keys that do not change what the weights compute (bookkeeping, attention kernel choice).
IGNORED_CONFIG_KEYS = frozenset({
    "_name_or_path", "transformers_version", "dtype", "torch_dtype", "_attn_implementation",
    "_attn_implementation_internal", "_attn_implementation_autoset", "attn_implementation", "_commit_hash",
    "architectures", "use_cache", "output_attentions", "output_hidden_states", "return_dict", "_experts_implementation",
})
MAX_LISTED = 3  # differences named in an error message
SAFETENSORS_HEADER_LEN_BYTES = 8  # little-endian u64, then that many bytes of JSON


@dataclass(frozen=True)
class CheckpointSignature:
    """``config`` (ignored keys dropped) and ``tensors``: name -> (dtype, shape); empty when the
    checkpoint has no safetensors files (``.bin`` headers cannot be read without loading)."""

    config: dict[str, Any]
    tensors: dict[str, tuple[str, tuple[int, ...]]]


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) from one ``.safetensors`` file's header."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(SAFETENSORS_HEADER_LEN_BYTES))
        header = json.loads(f.read(length))
    return {name: (meta["dtype"], tuple(meta["shape"])) for name, meta in header.items() if name != "__metadata__"}


def checkpoint_signature(model_path: str | Path, field: str = "model_path") -> CheckpointSignature:
    try:
        path = user_path(model_path)
    except ValueError as exc:
        raise WeightLoadError(field, str(model_path), str(exc)) from None
    if not path.is_dir():
        raise WeightLoadError(field, str(model_path), "no such directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise WeightLoadError(field, str(model_path), "is not an HF checkpoint directory (no config.json)")
    try:
        config = json.loads(config_file.read_text())
        tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        for file in sorted(path.glob("*.safetensors")):
            tensors.update(safetensors_header(file))
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise WeightLoadError(field, str(model_path), f"unreadable checkpoint: {exc}") from exc
    return CheckpointSignature(config_view(config), tensors)


def config_view(config: dict[str, Any]) -> dict[str, Any]:
    """The config keys that must match for weights to be swapped in place."""
    return {k: v for k, v in config.items() if k not in IGNORED_CONFIG_KEYS}


def config_mismatch(serving: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Why two config views differ (``model_type`` named first), or None."""
    keys = sorted((k for k in serving.keys() | new.keys() if serving.get(k) != new.get(k)), key=lambda k: (k != "model_type", k))
    if not keys:
        return None
    diffs = "; ".join(f"{k}: serving {serving.get(k)!r}, new {new.get(k)!r}" for k in keys[:MAX_LISTED])
    return f"a different architecture (config differs in {len(keys)} keys: {diffs})"


def shapes_mismatch(serving: dict[str, tuple[int, ...]], new: dict[str, tuple[int, ...]], what: str = "tensors") -> str | None:
    """Why two name -> shape maps differ (missing / unexpected names, then shapes), or None."""
    missing, unexpected = sorted(serving.keys() - new.keys()), sorted(new.keys() - serving.keys())
    if missing or unexpected:
        return f"a different architecture ({what} missing: {missing[:MAX_LISTED]}, unexpected: {unexpected[:MAX_LISTED]})"
    shapes = [f"{n}: serving {serving[n]}, new {new[n]}" for n in sorted(serving) if serving[n] != new[n]]
    if shapes:
        return f"a different architecture (shapes differ: {'; '.join(shapes[:MAX_LISTED])})"
    return None


def signature_mismatch(serving: CheckpointSignature, new: CheckpointSignature) -> str | None:
    """Why ``new`` cannot replace ``serving`` in place, or None. Dtypes may differ (the engine casts)."""
    reason = config_mismatch(serving.config, new.config)
    if reason or not serving.tensors or not new.tensors:
        return reason  # without safetensors headers (.bin) the config check is all that is cheap
    return shapes_mismatch({n: s for n, (_, s) in serving.tensors.items()}, {n: s for n, (_, s) in new.tensors.items()})


def preflight(serving_path: str | Path, new_path: str | Path) -> None:
    """Raise ``WeightLoadError`` (field ``model_path``) unless ``new_path`` fits the model served
    from ``serving_path``."""
    reason = signature_mismatch(checkpoint_signature(serving_path, "serving model_path"), checkpoint_signature(new_path))
    if reason:
        raise WeightLoadError("model_path", str(new_path), reason)


__all__ = ["CheckpointSignature", "checkpoint_signature", "signature_mismatch", "safetensors_header", "preflight",
           "config_view", "config_mismatch", "shapes_mismatch", "IGNORED_CONFIG_KEYS"]
