"""What a device call brings back from the DistillSparse GPU run (at most 8 files; 4 here): the summary pair,
the per-token arrays and one ``distill_logs.tar.xz`` (logs, rollouts, the adapter's metadata, not its weights)."""
from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

FILES = ("distill_summary.json", "distill_summary.md", "distill_tokens.npz")
IN_TAR = ("*.log", "rollouts-*.jsonl", "adapter/sparrow_adapter.json", "adapter/adapter_config.json")


def pack(work: Path, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    out = [Path(shutil.copy(work / name, dest / name)) for name in FILES if (work / name).is_file()]
    with tarfile.open(dest / "distill_logs.tar.xz", "w:xz") as tar:
        for pattern in IN_TAR:
            for path in sorted(work.glob(pattern)):
                tar.add(path, arcname=str(path.relative_to(work)))
    return [*out, dest / "distill_logs.tar.xz"]
