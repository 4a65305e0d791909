"""No module of the package reads or writes another module's private members.

A private name (``_x``, not a dunder) may be used through ``self``/``cls``/``super()`` anywhere, and
through any other object only in the module that defines it (a class's own instances, a module's own
helpers). Everything else (``engine._step_lock``, ``module._helper``, ``from m import _helper``,
``getattr(x, "_name")``) couples a module to another's internals and fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sparrow_server

ROOT = Path(sparrow_server.__file__).parent
# (file relative to the package, the expression as ast.unparse writes it). Each entry says why.
ALLOWED = {
    # transformers 5 has a setter (set_attn_implementation) but no public getter for the active
    # attention implementation; the context manager must restore it afterwards.
    ("modeling/sparse_forward.py", "model.config._attn_implementation"),
    # FastAPI's get_openapi walks included routers with this helper and exports no public one; the
    # route check must see exactly the routes the OpenAPI document describes.
    ("server/openapi.py", "from fastapi.openapi.utils import _get_api_route_for_openapi"),
    # SGLang's paged allocator keeps its table size private (pool.size + 1 on versions without it);
    # the plug-in's hooks live inside SGLang's scheduler by design.
    ("sglang_plugin/scheduler/hooks.py", "getattr(pool, '_alloc_size', pool.size + 1)"),
    # SGLang's LogitsProcessor computes the logits of chosen hidden rows (LM head, logit scale, TP gather,
    # soft-cap) only in this helper; the exact-acceptance verify pass needs the dense rows of kept positions.
    ("sglang_plugin/scheduler/exact_hooks.py", "processor._get_logits"),
    # torch has no public way to open a process group of its own (its own rendezvous, no default group):
    # new_group needs the default group and every rank of it. SGLang's init_custom_process_group (and
    # slime's, OpenRLHF's copies) build a trainer's weight-update group with these two; the server must
    # build its side the same way to meet the trainer's.
    ("engine/reference/process_group.py", "from torch.distributed.distributed_c10d import _new_process_group_helper"),
    ("engine/reference/process_group.py", "from torch.distributed.distributed_c10d import _world"),
    # The trainer's side of the same group (rank 0), as SGLang's init_custom_process_group builds it.
    ("client/trainer_group.py", "from torch.distributed.distributed_c10d import _new_process_group_helper"),
    ("client/trainer_group.py", "from torch.distributed.distributed_c10d import _world"),
    # Per-request dense layers under CUDA graphs: each layer decodes through its own shallow copy of
    # FlashInfer's decode wrapper, with its own workspace and row pointers, and the step's plan copied
    # in. FlashInfer's BatchDecodeWithPagedKVCacheWrapper has no public way to give a copy its own
    # buffers or plan (names checked against flashinfer 0.6.15.post1, the version the kit installs).
    ("sglang_plugin/scheduler/layer_plans.py", "view._int_workspace_buffer"),
    ("sglang_plugin/scheduler/layer_plans.py", "view._pin_memory_int_workspace_buffer"),
    ("sglang_plugin/scheduler/layer_plans.py", "view._paged_kv_indptr_buf"),
    ("sglang_plugin/scheduler/layer_plans.py", "slot._plan_info"),
    ("sglang_plugin/scheduler/layer_plans.py", "decode.wrapper._plan_info"),
}
REFLECTION = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _own_names(tree: ast.AST) -> set[str]:
    """Private names this module defines: functions, classes, module and local names, and attributes
    it sets on ``self``/``cls``."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            own.add(node.attr)
    return own


def foreign_private_uses(source: str) -> list[str]:
    """Every use of another module's private member in ``source``, as ``ast.unparse`` writes it."""
    tree = ast.parse(source)
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value) \
                and node.attr not in own:
            found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom):
            found += [f"from {node.module or '.'} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REFLECTION \
                and len(node.args) >= 2 and not _is_self(node.args[0]) and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value) \
                and node.args[1].value not in own:
            found.append(ast.unparse(node))
    return found


def test_no_module_touches_another_modules_private_members():
    offences = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        offences += [f"{rel}: {use}" for use in foreign_private_uses(path.read_text())
                     if (rel, use) not in ALLOWED]
    assert not offences, "private members used across modules:\n" + "\n".join(offences)


def test_every_allowed_use_still_exists():
    """An allow-list entry whose code is gone must go too (it would silently allow a new use)."""
    for rel, use in ALLOWED:
        assert use in foreign_private_uses((ROOT / rel).read_text()), (rel, use)


@pytest.mark.parametrize("source, expected", [
    ("def f(engine):\n    with engine._step_lock:\n        pass\n", ["engine._step_lock"]),
    ("def f(e):\n    e._running = []\n", ["e._running"]),
    ("from sparrow_server.client.weights import _post_all\n", ["from sparrow_server.client.weights import _post_all"]),
    ("import m\nm._helper()\n", ["m._helper"]),
    ("def f(x):\n    return getattr(x, '_live')\n", ["getattr(x, '_live')"]),
    # allowed: its own members, through self, or through another instance of its own class
    ("class A:\n    def __init__(self):\n        self._n = 1\n    def same(self, other):\n"
     "        return self._n == other._n\n", []),
    ("class B(A):\n    def f(self):\n        return super()._g()\n", []),
    ("def _helper():\n    pass\nclass C:\n    _helper = staticmethod(_helper)\nC._helper()\n", []),
    ("def f(x):\n    return x.__class__\n", []),
])
def test_the_scan_finds_foreign_private_uses(source, expected):
    assert foreign_private_uses(source) == expected
