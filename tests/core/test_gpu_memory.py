"""The GPU suite's per-process-group memory sum (tests/helpers/gpu_memory.py), on real processes."""
from __future__ import annotations

import os
import subprocess
import sys

from helpers import gpu_memory


def test_sums_only_the_group_and_says_when_none_is_seen():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        grandchild_like = (child.pid, 300)
        entries = [grandchild_like, (os.getpid(), 50), (2**22 + 12345, 7), (child.pid, None)]
        assert gpu_memory.group_bytes(entries, child.pid) == 300
        assert gpu_memory.group_bytes(entries, os.getpgid(os.getpid())) == 50
        assert gpu_memory.group_bytes([(os.getpid(), 50)], child.pid) is None
    finally:
        child.kill()
        child.wait()
