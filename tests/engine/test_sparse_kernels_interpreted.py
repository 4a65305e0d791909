"""The sparse decode backend's Triton kernels checked on CPU: ``sparse_kernel_cases.py`` (exact
scores, selection in every tier, landmark updates, against the pure references) run under the
Triton interpreter in child pytests (two shards at once). ``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates,
triton's own library functions included, i.e. at triton's first import: it cannot be switched on in
this process, where other tests may use the compiled kernels (a GPU host)."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("sparse_kernel_cases.py")
REPO = Path(__file__).resolve().parents[2]


SHARDS = 2  # the parent only waits: two children use a 2-core CI box's both cores
CHILD_TIMEOUT_S = 1200  # bounds a hang, far above a shard's time on a busy 2-core box


def interpreter_env() -> dict[str, str]:
    return {**os.environ, "TRITON_INTERPRET": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def pytest_child(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]


def case_ids() -> list[str]:
    proc = subprocess.run(pytest_child("--collect-only", str(CASES)), cwd=REPO, env=interpreter_env(),
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [line for line in proc.stdout.splitlines() if "::" in line]


def passed_count(out: str) -> int:
    summary = [line for line in out.splitlines() if re.search(r" in [\d.]+s", line)][-1]
    assert not re.search(r"failed|error|skipped|deselected|xfail|xpass", summary), out
    return int(re.search(r"(\d+) passed", summary).group(1))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed: the kernels' CPU check runs them under its interpreter")
@pytest.mark.timeout(2 * CHILD_TIMEOUT_S + 60)  # the children's own bounds, not the suite's 300 s, bound a hang
def test_kernels_match_the_references_under_the_triton_interpreter():
    ids = case_ids()
    shards = [subprocess.Popen(pytest_child(*ids[i::SHARDS]), cwd=REPO, env=interpreter_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(SHARDS)]
    try:
        outputs = [shard.communicate(timeout=CHILD_TIMEOUT_S)[0] for shard in shards]
    finally:
        for shard in shards:
            shard.kill()
    for shard, out in zip(shards, outputs):
        assert shard.returncode == 0, out
    assert sum(passed_count(out) for out in outputs) == len(ids) > 100, outputs
