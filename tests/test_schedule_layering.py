"""The core layer (schedules, selection, statistics, cost model) imports nothing from SGLang,
and statistics / cost need no scipy at run time (scipy is a dev dependency)."""
from __future__ import annotations

import ast
from pathlib import Path

import sparrow_server

ROOT = Path(sparrow_server.__file__).parent
SERVING_STACK = {"sglang", "sgl_kernel", "flashinfer", "vortex_torch"}


def _imports(package: str) -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((str(path.relative_to(ROOT)), node.module))
    return found


def test_core_layer_imports_no_serving_stack():
    offenders = [(f, m) for pkg in ("sparsity", "stats", "cost") for f, m in _imports(pkg)
                 if m.split(".")[0] in SERVING_STACK]
    assert not offenders


def test_stats_and_cost_import_no_scipy():
    offenders = [(f, m) for pkg in ("stats", "cost") for f, m in _imports(pkg) if m.split(".")[0] == "scipy"]
    assert not offenders
