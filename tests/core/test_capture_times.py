"""``benchmarks/capture_times.py``: the seconds per captured batch size it reads from SGLang's progress bar, and the
reports committed under calls 45 and 46 are what it prints."""
from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import capture_times  # noqa: E402

SPEED = REPO / "benchmarks" / "results" / "speed"


def test_capture_steps_follow_the_progress_bar_and_its_skipped_counts():
    log = ("[t] Capture target decode CUDA graph begin. backend=full, bs=[1, 2, 4, 8], avail mem=1 GB\n"
           "Capturing batches (bs=8 avail_mem=1 GB):   0%|          | 0/4 [00:00<?, ?it/s]\r"
           "Capturing batches (bs=4 avail_mem=1 GB):  25%|##        | 1/4 [00:17<00:51, 17.0s/it]\r"
           "Capturing batches (bs=1 avail_mem=1 GB):  75%|######    | 3/4 [00:18<00:06, 6.0s/it]\r"
           "Capturing batches (bs=1 avail_mem=1 GB): 100%|##########| 4/4 [00:38<00:00, 9.5s/it]\n"
           "[t] Capture target decode CUDA graph end. elapsed=38.60 s, mem usage=0.38 GB\n")
    steps, total = capture_times.capture_steps(log)
    assert steps == [([8], 17), ([4, 2], 1), ([1], 20)] and total == 38.6


@pytest.mark.parametrize("call", ["call45", "call46"])
def test_committed_capture_report_is_what_the_script_prints(monkeypatch, call):
    monkeypatch.chdir(REPO)
    committed = (SPEED / call / "capture_times.md").read_text()
    logs = re.search(r"`python benchmarks/capture_times.py ([^`]+)`", committed).group(1).split()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert capture_times.main(logs) == 0
    assert out.getvalue().count("- `") == len(logs) and committed.endswith(out.getvalue())
