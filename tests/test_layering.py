"""The package layering: each of the project's packages imports only packages of its own layer or
below (no upward import), the package import graph has no cycle, the core imports nothing from
SGLang, and statistics / cost need no scipy at run time (scipy is a dev dependency).

Every import counts, also one inside a function: a lazy import is still a dependency."""
from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import sparrow_server

ROOT = Path(sparrow_server.__file__).parent
SERVING_STACK = {"sglang", "sgl_kernel", "flashinfer", "vortex_torch"}
CORE = ("sparsity", "stats", "cost", "autopilot", "models", "adapter_meta", "kernels", "modeling")
# Lowest first. A package may import its own layer and the layers below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    CORE,
    ("engine",),
    ("monitor", "distill", "calibrate"),
    ("server", "sglang_plugin"),
    ("client",),
    ("commands", "cli"),
)
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _files(package: str) -> list[Path]:
    path = ROOT / package
    return sorted(path.rglob("*.py")) if path.is_dir() else [ROOT / f"{package}.py"]


def _imports(package: str) -> list[tuple[str, str]]:
    """(file, absolute module) of every import in ``package``, relative ones resolved."""
    found = []
    for path in _files(package):
        own = ("sparrow_server",) + path.relative_to(ROOT).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((str(path.relative_to(ROOT)), node.module))
            elif isinstance(node, ast.ImportFrom):
                base = own[:-node.level]  # an __init__'s own name ends in "__init__", so this holds for it too
                found.append((str(path.relative_to(ROOT)), ".".join(base + ((node.module,) if node.module else ()))))
    return found


def _package_edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the files importing it."""
    edges: dict[str, dict[str, list[str]]] = {}
    for pkg in LAYER_OF:
        for file, module in _imports(pkg):
            parts = module.split(".")
            if parts[0] == "sparrow_server" and len(parts) > 1 and parts[1] != pkg:
                edges.setdefault(pkg, {}).setdefault(parts[1], []).append(file)
    return edges


def test_every_package_has_a_layer():
    packages = {m.name for m in pkgutil.iter_modules([str(ROOT)]) if m.name != "__main__"}
    assert packages == set(LAYER_OF), f"give these a layer in LAYERS: {sorted(packages ^ set(LAYER_OF))}"


def test_no_upward_import():
    upward = [(pkg, dst, files) for pkg, targets in _package_edges().items()
              for dst, files in targets.items() if LAYER_OF[dst] > LAYER_OF[pkg]]
    assert not upward, upward


def test_package_graph_has_no_cycle():
    edges = {pkg: set(targets) for pkg, targets in _package_edges().items()}
    state: dict[str, str] = {}

    def visit(pkg: str, path: tuple[str, ...]) -> None:
        state[pkg] = "open"
        for dst in sorted(edges.get(pkg, ())):
            assert state.get(dst) != "open", f"import cycle: {' -> '.join(path + (dst,))}"
            if dst not in state:
                visit(dst, path + (dst,))
        state[pkg] = "done"

    for pkg in sorted(LAYER_OF):
        if pkg not in state:
            visit(pkg, (pkg,))


def test_relative_imports_resolve_within_the_project():
    """The resolution above is right: every relative import names an existing module or package."""
    for pkg in LAYER_OF:
        for file, module in _imports(pkg):
            parts = module.split(".")
            if parts[0] == "sparrow_server":
                target = ROOT.joinpath(*parts[1:])
                assert target.is_dir() or target.with_suffix(".py").is_file() or target.parent.with_suffix(".py").is_file() \
                    or (target.parent / "__init__.py").is_file(), (file, module)


def test_core_layer_imports_no_serving_stack():
    offenders = [(f, m) for pkg in CORE for f, m in _imports(pkg) if m.split(".")[0] in SERVING_STACK]
    assert not offenders


def test_stats_and_cost_import_no_scipy():
    offenders = [(f, m) for pkg in ("stats", "cost") for f, m in _imports(pkg) if m.split(".")[0] == "scipy"]
    assert not offenders
