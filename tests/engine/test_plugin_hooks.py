"""The plug-in's hook targets exist in the installed SGLang (skipped without SGLang), and ``register()``
wires both halves of the plug-in and adds the backend to SGLang's attention-backend and deterministic
choices (on stand-in SGLang modules; against the real ones where SGLang is installed)."""
from __future__ import annotations

import pkgutil

import pytest

from sparrow_server.sglang_plugin.frontend import weight_preflight
from sparrow_server.sglang_plugin.scheduler import determinism, exact_hooks, hooks, landmarks


@pytest.mark.parametrize("target", [hooks.ALLOC_TARGET, hooks.INIT_NEW_TARGET, hooks.REPLAY_VIEW_TARGET,
                                    landmarks.FLUSH_TARGET, weight_preflight.PREFLIGHT_TARGET,
                                    exact_hooks.SAMPLE_TARGET, exact_hooks.LOGITS_TARGET, exact_hooks.ABORT_TARGET,
                                    determinism.CONFIG_TARGET, determinism.ADD_REQ_TARGET])
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


def _stand_in_sglang(monkeypatch, choices: list[str], deterministic: list[str] | None = None,
                     radix: list[str] | None = None) -> tuple[dict, list]:
    """Stand-ins for the three SGLang modules ``register()`` imports: the attention registry, the
    hook registry and the server args' backend choices (all, deterministic, radix-compatible
    deterministic). Returns (backends, hooks registered)."""
    deterministic = [] if deterministic is None else deterministic
    radix = [] if radix is None else radix
    import sys
    import types

    backends: dict = {}
    registered: list = []
    modules = {
        "sglang.srt.layers.attention.attention_registry": {
            "register_attention_backend": lambda name: lambda fn: backends.setdefault(name, fn)},
        "sglang.srt.plugins.hook_registry": {
            "HookRegistry": types.SimpleNamespace(register=lambda target, hook, kind: registered.append((target, kind))),
            "HookType": types.SimpleNamespace(AFTER="after", AROUND="around", BEFORE="before")},
        "sglang.srt.server_args": {"ATTENTION_BACKEND_CHOICES": choices,
                                   "add_attention_backend_choices": choices.extend,
                                   "DETERMINISTIC_ATTENTION_BACKEND_CHOICES": deterministic,
                                   "add_deterministic_attention_backend_choices": deterministic.extend,
                                   "RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND": radix,
                                   "add_radix_supported_deterministic_attention_backend_choices": radix.extend},
    }
    for dotted, attrs in modules.items():
        parts = dotted.split(".")
        for i in range(1, len(parts)):  # the parent packages, so the import machinery finds the leaf
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    for dotted, attrs in modules.items():
        module = types.ModuleType(dotted)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, dotted, module)
    return backends, registered


def test_register_installs_the_backend_and_both_halves_hooks(monkeypatch):
    """The entry point wires the scheduler half (backend, side-table hooks, landmark flush) and the
    frontend half (checkpoint preflight), and adds the backend to the CLI choices once."""
    import sparrow_server.sglang_plugin as plugin
    from sparrow_server.sglang_plugin import scheduler

    choices, deterministic, radix = ["flashinfer"], ["fa3", "flashinfer"], ["fa3"]
    backends, registered = _stand_in_sglang(monkeypatch, choices, deterministic, radix)
    plugin.register()
    plugin.register()  # a second call in one process does not add the choice twice
    assert backends == {"sparrow": scheduler.create_backend} and choices == ["flashinfer", "sparrow"]
    # --enable-deterministic-inference accepts it; like flashinfer, it runs without the radix cache there
    assert deterministic == ["fa3", "flashinfer", "sparrow"] and radix == ["fa3"]
    once = [(hooks.ALLOC_TARGET, "after"), (hooks.INIT_NEW_TARGET, "after"), (hooks.REPLAY_VIEW_TARGET, "around"),
            (landmarks.FLUSH_TARGET, "after"), (landmarks.RESUME_TARGET, "after"),
            (hooks.INIT_NEW_TARGET, "after"), (exact_hooks.SAMPLE_TARGET, "before"),
            (exact_hooks.LOGITS_TARGET, "around"), (exact_hooks.ABORT_TARGET, "after"),
            (determinism.CONFIG_TARGET, "after"), (determinism.ADD_REQ_TARGET, "around"),
            (weight_preflight.PREFLIGHT_TARGET, "around")]
    assert registered == once + once


def test_real_sglang_accepts_sparrow_for_deterministic_inference():
    """SGLang's own check of ``--enable-deterministic-inference`` (the resolution pass that refuses a
    backend outside its deterministic choices) passes for ``sparrow`` once the plug-in added it, and
    refuses it before; the radix cache stays off for it, as for ``flashinfer``."""
    pytest.importorskip("sglang", reason="SGLang not installed (CPU CI); the GPU test starts a deterministic server")
    import types

    from sglang.srt import server_args
    from sglang.srt.arg_groups.overrides import _deterministic_attention_backend

    import sparrow_server.sglang_plugin as plugin

    view = types.SimpleNamespace(enable_deterministic_inference=True, attention_backend="sparrow")
    listed = server_args.DETERMINISTIC_ATTENTION_BACKEND_CHOICES
    saved = list(listed)
    try:
        listed[:] = [b for b in listed if b != "sparrow"]
        with pytest.raises(ValueError, match="sparrow"):
            _deterministic_attention_backend(view)
        plugin.add_choice(server_args, "DETERMINISTIC_ATTENTION_BACKEND_CHOICES",
                          "add_deterministic_attention_backend_choices")
        assert _deterministic_attention_backend(view) == {}
        assert "sparrow" not in server_args.RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND
    finally:
        listed[:] = saved
