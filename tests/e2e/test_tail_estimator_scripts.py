"""The tail-estimator study's scripts (benchmarks/fidelity/tail_*.py, run by hand on CPU for issue 25): they
import the product and benchmarks only, parse their command line, and answer --help without loading torch."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["benchmarks/fidelity/tail_estimators.py", "benchmarks/fidelity/tail_estimators_report.py",
           "benchmarks/fidelity/tail_hybrid.py"]
PROBE = """
import runpy, sys
script = sys.argv[1]
sys.argv = [script, "--help"]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
print("torch loaded:", "torch" in sys.modules)
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_without_torch(script):
    done = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower(), done.stdout[-500:]
    assert done.stdout.strip().endswith("torch loaded: False"), done.stdout[-500:]
