"""What a device call brings back from the DistillSparse GPU run (at most 8 files; 4 here): the summary pair,
the per-token arrays and one ``distill_logs.tar.xz`` (logs, rollouts, the adapter's metadata, not its weights)."""
from __future__ import annotations

from pathlib import Path

from run_common import pack_outputs

FILES = ("distill_summary.json", "distill_summary.md", "distill_tokens.npz")
IN_TAR = ("*.log", "rollouts-*.jsonl", "adapter/sparrow_adapter.json", "adapter/adapter_config.json")


def pack(work: Path, dest: Path) -> list[Path]:
    return pack_outputs(work, dest, FILES, IN_TAR, "distill_logs.tar.xz")
