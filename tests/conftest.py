"""Test tiers: CPU by default; ``gpu`` tests skip without CUDA; ``perf`` tests run only with ``-m perf``."""
from __future__ import annotations

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    selected = config.getoption("-m") or ""
    no_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    no_perf = pytest.mark.skip(reason="perf test: run with -m perf")
    cuda = _has_cuda()
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(no_cuda)
        if "perf" in item.keywords and "perf" not in selected:
            item.add_marker(no_perf)
