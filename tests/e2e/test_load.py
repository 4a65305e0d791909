"""Bounded loopback load test (``benchmarks/load``): concurrent streaming clients against a real
``serve`` subprocess on a tiny model; zero errors and bounded server memory growth.

The default suite runs a short version; the 60 s, 64-client run whose figures are committed in
``benchmarks/results/load.md`` is ``-m perf`` (or ``python benchmarks/load/run.py``).
"""
from __future__ import annotations

import functools
import importlib.util
import math
import sys

import pytest

from helpers.server_util import REPO

SHORT_CLIENTS, SHORT_DURATION_S, SHORT_WARMUP_S = 32, 8.0, 2.0
MAX_RSS_GROWTH_MIB = 256.0  # generous: the point is "no unbounded growth", not a tight budget


@functools.cache
def loadgen():
    spec = importlib.util.spec_from_file_location("sparrow_loadgen", REPO / "benchmarks" / "load" / "loadgen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def check(result) -> None:
    assert result.errors == 0, result.error_examples
    assert result.requests > 0 and result.tokens > 0
    assert all(math.isfinite(x) and x > 0 for x in (result.latency_p50_s, result.latency_p99_s, result.ttft_p50_s))
    assert result.latency_p50_s <= result.latency_p99_s
    assert result.rss_growth_mib < MAX_RSS_GROWTH_MIB, result.to_dict()


def test_quantile_nearest_rank():
    q = loadgen().quantile
    assert q([3.0, 1.0, 2.0], 0.5) == 2.0 and q(list(range(1, 101)), 0.99) == 99 and q([5.0], 0.99) == 5.0
    assert math.isnan(q([], 0.5))


@pytest.mark.slow
def test_short_load(tmp_path):
    result, _ = loadgen().load_test(SHORT_CLIENTS, SHORT_DURATION_S, SHORT_WARMUP_S, workdir=tmp_path)
    check(result)


@pytest.mark.perf
def test_full_load(tmp_path):
    result, _ = loadgen().load_test(64, 60.0, 5.0, workdir=tmp_path)
    check(result)
