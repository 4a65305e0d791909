"""Benchmarks and examples import the product (and each other), never the tests' helpers: a helper's
move once broke ``benchmarks/fleet_2gpu.py`` without a test noticing. Static: every import of every
script under ``benchmarks/`` and ``examples/``, lazy ones too, and every ``sys.path`` edit."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
# Every module name a test directory puts on sys.path: tests/, tests/helpers, tests/gpu's files, ...
TEST_MODULES = {"tests"} | {p.stem for p in TESTS.rglob("*.py")} | {p.name for p in TESTS.rglob("*") if p.is_dir()}


def _scripts() -> list[Path]:
    roots = [REPO / "benchmarks", REPO / "examples"]
    return sorted(p for r in roots if r.is_dir() for p in r.rglob("*.py") if "results" not in p.parts)


def test_modules_from_tests(tmp_path):
    """The checker finds what it must: an import of a test helper, and a sys.path edit towards tests/."""
    script = tmp_path / "bench.py"
    script.write_text("import sys\nsys.path.insert(0, 'tests')\n\ndef f():\n    from helpers.tiny_models import x\n")
    assert sorted(_offences(script)) == ["imports helpers.tiny_models", "puts a tests/ folder on sys.path (line 2)"]


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"imports {n}" for n in names if n.split(".")[0] in TEST_MODULES]
        if isinstance(node, ast.Call) and "sys.path" in ast.unparse(node.func) and "tests" in ast.unparse(node):
            found.append(f"puts a tests/ folder on sys.path (line {node.lineno})")
        if (isinstance(node, ast.Assign) and any("sys.path" in ast.unparse(t) for t in node.targets)
                and "tests" in ast.unparse(node.value)):
            found.append(f"puts a tests/ folder on sys.path (line {node.lineno})")
    return found


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_benchmarks_import_the_product_not_the_tests(script):
    assert _offences(script) == [], f"{script.relative_to(REPO)}: use the product instead"
