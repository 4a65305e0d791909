"""The package layering: each of the project's packages imports only packages of its own layer or
below (no upward import), the package import graph has no cycle, the core imports nothing from
SGLang, and statistics / cost need no scipy at run time (scipy is a dev dependency).

The SGLang plug-in is split by the process its code runs in: ``sglang_plugin/scheduler/`` (each
scheduler process, next to the model runner) is the only code that imports FlashInfer or SGLang's
layer, model-executor, memory-cache or scheduler internals, or hooks one of them;
``sglang_plugin/frontend/`` (the HTTP process) and ``scheduler/`` never import each other; what
both need sits at ``sglang_plugin/``'s top level (``config``, and ``register``, which wires both).

Every import counts, also one inside a function: a lazy import is still a dependency."""
from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import sparrow_server

ROOT = Path(sparrow_server.__file__).parent
SERVING_STACK = {"sglang", "sgl_kernel", "flashinfer", "vortex_torch"}
CORE = ("sparsity", "stats", "cost", "autopilot", "models", "adapter_meta", "kernels", "modeling", "lazy_exports")
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


def _imports(package: str, names: bool = False) -> list[tuple[str, str]]:
    """(file, absolute module) of every import in ``package``, relative ones resolved. With ``names``,
    ``from M import a`` also gives ``M.a`` (``a`` may be a submodule: ``from pkg import submodule``)."""
    found = []
    for path in _files(package):
        own = ("sparrow_server",) + path.relative_to(ROOT).with_suffix("").parts
        file = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(file, a.name) for a in node.names]
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and node.module:
                module = node.module
            else:
                base = own[:-node.level]  # an __init__'s own name ends in "__init__", so this holds for it too
                module = ".".join(base + ((node.module,) if node.module else ()))
            found.append((file, module))
            if names:
                found += [(file, f"{module}.{a.name}") for a in node.names]
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


def _first_cycle(edges: dict[str, set[str]]) -> list[str]:
    """A cycle of the directed graph (its nodes, the first repeated at the end), or [] (depth first)."""
    state: dict[str, str] = {}

    def visit(node: str, path: tuple[str, ...]) -> list[str]:
        state[node] = "open"
        for dst in sorted(edges.get(node, ())):
            if state.get(dst) == "open":
                return list(path + (dst,))
            if dst not in state and (found := visit(dst, path + (dst,))):
                return found
        state[node] = "done"
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node, (node,))):
            return found
    return []


def test_cycle_finder_finds_a_cycle():
    assert _first_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _first_cycle({"a": {"b", "c"}, "b": {"c"}}) == []


def test_package_graph_has_no_cycle():
    cycle = _first_cycle({pkg: set(targets) for pkg, targets in _package_edges().items()})
    assert not cycle, f"import cycle: {' -> '.join(cycle)}"


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


PLUGIN = "sglang_plugin"
PLUGIN_HALVES = ("scheduler", "frontend")
# Modules that exist only in SGLang's scheduler processes (or must only be touched there).
SCHEDULER_INTERNALS = ("flashinfer", "sgl_kernel", "sglang.srt.layers", "sglang.srt.model_executor",
                       "sglang.srt.mem_cache", "sglang.srt.managers.scheduler", "sglang.srt.runtime_context")


def _plugin_half(file: str) -> str | None:
    """``scheduler`` / ``frontend`` for a file of that half of the plug-in, None for its top level."""
    parts = Path(file).parts
    return parts[1] if len(parts) > 2 and parts[0] == PLUGIN else None


def _is_scheduler_internal(module: str) -> bool:
    # a prefix of the dotted name: "sglang.srt.managers.scheduler" also covers "...scheduler_components"
    return module.startswith(SCHEDULER_INTERNALS)


def _hook_targets(path: Path) -> list[str]:
    """The SGLang dotted paths a file names in string constants (its ``HookRegistry`` targets)."""
    return [node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("sglang.srt.")]


def test_plugin_has_both_halves():
    """The rules below are about files that exist: each half holds modules."""
    for half in PLUGIN_HALVES:
        assert len(_files(f"{PLUGIN}/{half}")) > 1, half


def test_only_the_scheduler_half_imports_scheduler_internals():
    imports = [(f, m) for f, m in _imports(PLUGIN, names=True) if _is_scheduler_internal(m)]
    assert imports, "the backend imports FlashInfer: the rule must see it"
    offenders = [(f, m) for f, m in imports if _plugin_half(f) != "scheduler"]
    assert not offenders, offenders


def test_only_the_scheduler_half_hooks_scheduler_internals():
    """A hook target is a dependency too: hooking the scheduler is scheduler-process code."""
    targets = [(str(p.relative_to(ROOT)), t) for p in _files(PLUGIN) for t in _hook_targets(p)]
    assert any(_plugin_half(f) == "scheduler" and _is_scheduler_internal(t) for f, t in targets)
    offenders = [(f, t) for f, t in targets if _is_scheduler_internal(t) and _plugin_half(f) != "scheduler"]
    assert not offenders, offenders


def test_plugin_halves_do_not_import_each_other():
    crossing = []
    for file, module in _imports(PLUGIN, names=True):
        half = _plugin_half(file)
        parts = module.split(".")
        target = parts[2] if parts[:2] == ["sparrow_server", PLUGIN] and len(parts) > 2 else None
        if half is not None and target in PLUGIN_HALVES and target != half:
            crossing.append((file, module))
    assert not crossing, crossing


def test_nothing_outside_the_plugin_imports_scheduler_internals():
    """The engine-agnostic packages never need FlashInfer or SGLang's model side (``kernels`` is
    Triton; the reference engine is plain torch)."""
    offenders = [(pkg, f, m) for pkg in LAYER_OF if pkg != PLUGIN for f, m in _imports(pkg, names=True)
                 if _is_scheduler_internal(m)]
    assert not offenders, offenders


def _module_of(dotted: str) -> str | None:
    """The project module file an absolute import name lands in (``a.b`` for a/b.py or a/b/__init__.py),
    or None outside the project."""
    parts = dotted.split(".")
    if parts[0] != "sparrow_server":
        return None
    for n in range(len(parts), 1, -1):
        path = ROOT.joinpath(*parts[1:n])
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts[:n])
    return "sparrow_server"


def _module_edges() -> dict[str, set[str]]:
    """module -> the project modules it imports (every import, lazy and TYPE_CHECKING ones included; ``from P
    import m`` of a submodule ``m`` counts as an import of ``P.m`` only, as Python's import system sees it)."""
    edges: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        own = ".".join(("sparrow_server",) + parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module if node.level == 0 else ".".join(
                    (("sparrow_server",) + rel.parts)[:-node.level] + ((node.module,) if node.module else ()))
                targets = [f"{base}.{a.name}" if _module_of(f"{base}.{a.name}") == f"{base}.{a.name}" else base
                           for a in node.names]
            else:
                continue
            edges.setdefault(own, set()).update(m for m in map(_module_of, targets) if m and m != own)
    return edges


def test_module_graph_has_no_cycle():
    """No two modules import each other, directly or around a circle (``farm-studio look``'s circles): a
    constant or error both sides need lives in a module of its own or in the lower one."""
    cycle = _first_cycle(_module_edges())
    assert not cycle, f"import cycle: {' -> '.join(cycle)}"
