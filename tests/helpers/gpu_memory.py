"""GPU memory held by one process group, per NVML's per-process accounting.

A card's free memory moves with every process on it; a server's own footprint does not. The GPU
suite runs several modules on one card at once, so a test that measures what a server frees
(release_memory_occupation) reads the server's processes, not the card.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def group_bytes(processes: Iterable[tuple[int, int | None]], pgid: int,
                pgid_of: Callable[[int], int | None] = _pgid) -> int | None:
    """Sum of used bytes over (pid, used bytes) entries whose process is in group ``pgid``;
    ``None`` when none is (NVML could not see them, e.g. in a pid namespace)."""
    mine = [used or 0 for pid, used in processes if pgid_of(pid) == pgid]
    return sum(mine) if mine else None


def _nvml_processes() -> list[tuple[int, int | None]]:
    import pynvml  # nvidia-ml-py, a dependency of SGLang

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):  # every card: NVML ignores CUDA_VISIBLE_DEVICES
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            out += [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return out
    finally:
        pynvml.nvmlShutdown()


def process_group_bytes(pgid: int) -> int | None:
    """GPU bytes the processes of group ``pgid`` hold on all cards (``None``: NVML shows none of them)."""
    return group_bytes(_nvml_processes(), pgid)
