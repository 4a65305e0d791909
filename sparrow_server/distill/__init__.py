"""DistillSparse: a LoRA trained so that the sparse actor matches the dense base model's logprobs,
letting a tighter (cheaper) schedule reach the same tail acceptance. Applies only to the sparse
rollout path; the dense policy never uses the adapter."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparrow_server.lazy_exports import lazy_getattr

# Public name -> defining module, imported on first use: ``config`` (what the CLI's
# ``distill`` parser reads) imports neither torch nor transformers, and importing it runs this file.
_EXPORTS = {
    "sparrow_server.adapter_meta.fingerprint": ("model_fingerprint",),
    "sparrow_server.adapter_meta.metadata": ("METADATA_FILE", "AdapterArtifactError", "AdapterMetadata",
                                             "read_adapter_metadata"),
    "sparrow_server.distill.artifact": ("save_adapter",),
    "sparrow_server.distill.config": ("DistillConfig", "DistillConfigError"),
    "sparrow_server.distill.evaluate": ("AcceptanceProbe", "AcceptanceSummary"),
    "sparrow_server.distill.rollouts": ("Rollout", "RolloutError", "dump_rollouts", "load_rollouts"),
    "sparrow_server.distill.train": ("DistillReport", "train_lora"),
}
__all__ = [name for names in _EXPORTS.values() for name in names]

if TYPE_CHECKING:  # the same names, for type checkers and the layering test
    from sparrow_server.adapter_meta.fingerprint import model_fingerprint
    from sparrow_server.adapter_meta.metadata import (
        METADATA_FILE, AdapterArtifactError, AdapterMetadata, read_adapter_metadata,
    )
    from sparrow_server.distill.artifact import save_adapter
    from sparrow_server.distill.config import DistillConfig, DistillConfigError
    from sparrow_server.distill.evaluate import AcceptanceProbe, AcceptanceSummary
    from sparrow_server.distill.rollouts import Rollout, RolloutError, dump_rollouts, load_rollouts
    from sparrow_server.distill.train import DistillReport, train_lora


__getattr__ = lazy_getattr(__name__, _EXPORTS)
