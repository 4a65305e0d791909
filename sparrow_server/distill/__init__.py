"""DistillSparse: a LoRA trained so that the sparse actor matches the dense base model's logprobs,
letting a tighter (cheaper) schedule reach the same tail acceptance. Applies only to the sparse
rollout path; the dense policy never uses the adapter."""
from sparrow_server.adapter_meta.fingerprint import model_fingerprint
from sparrow_server.adapter_meta.metadata import METADATA_FILE, AdapterArtifactError, AdapterMetadata, read_adapter_metadata
from sparrow_server.distill.artifact import save_adapter
from sparrow_server.distill.config import DistillConfig, DistillConfigError
from sparrow_server.distill.evaluate import AcceptanceProbe, AcceptanceSummary
from sparrow_server.distill.rollouts import Rollout, RolloutError, dump_rollouts, load_rollouts
from sparrow_server.distill.train import DistillReport, train_lora

__all__ = [
    "DistillConfig", "DistillConfigError", "DistillReport", "train_lora", "Rollout", "RolloutError",
    "load_rollouts", "dump_rollouts", "AcceptanceSummary", "AcceptanceProbe",
    "model_fingerprint", "save_adapter", "read_adapter_metadata", "AdapterMetadata", "AdapterArtifactError",
    "METADATA_FILE",
]
