"""The plug-in's hook targets exist in the installed SGLang (skipped without SGLang)."""
from __future__ import annotations

import pkgutil

import pytest

from sparrow_server.sglang_plugin import hooks, weight_sync


@pytest.mark.parametrize("target", [hooks.ALLOC_TARGET, hooks.INIT_NEW_TARGET, hooks.REPLAY_VIEW_TARGET,
                                    weight_sync.FLUSH_TARGET, weight_sync.PREFLIGHT_TARGET])
def test_hook_target_resolves(target):
    pytest.importorskip("sglang", reason="SGLang not installed (CPU CI); the GPU runs exercise the hooks")
    obj_path, attr = target.rsplit(".", 1)
    assert hasattr(pkgutil.resolve_name(obj_path), attr)


def test_hooks_install_registers_three_targets():
    seen = []

    class _Registry:
        @staticmethod
        def register(target, hook, hook_type):
            seen.append((target, hook_type))

    class _Types:
        AFTER, AROUND = "after", "around"

    hooks.install(_Registry, _Types)
    assert seen == [(hooks.ALLOC_TARGET, "after"), (hooks.INIT_NEW_TARGET, "after"),
                    (hooks.REPLAY_VIEW_TARGET, "around")]
