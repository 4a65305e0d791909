"""The engine's optional capabilities are typed ports: the base answers None, the reference engine
hands out its own, and the adapter gate is an ``Engine`` that delegates each one explicitly."""
from __future__ import annotations

import inspect

import pytest

from helpers.fake_engine import FakeEngine
from helpers.tiny_models import tiny_model
from sparrow_server.engine.adapter_versions import AdapterManager
from sparrow_server.engine.base import Engine
from sparrow_server.engine.gated import GatedEngine
from sparrow_server.engine.memory import MemoryControl
from sparrow_server.engine.ports import AdapterPort
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.weights import WeightSync

PORTS = ("adapter_port", "weights", "memory_control", "local_model", "dense_scoring", "max_running_requests")


def test_an_engine_without_capabilities_answers_none():
    engine = FakeEngine()
    assert [getattr(engine, p)() for p in PORTS] == [None] * len(PORTS)
    assert engine.default_schedule_fixed_at_start is False


@pytest.mark.usefixtures("one_torch_thread")
def test_the_reference_engine_offers_its_ports():
    engine = ReferenceEngine(tiny_model(), None, "tiny", max_batch_size=3)
    assert isinstance(engine.adapter_port(), AdapterPort) and engine.adapter_port().loaded_adapters() == ()
    assert isinstance(engine.weights(), WeightSync) and isinstance(engine.memory_control(), MemoryControl)
    local = engine.local_model()
    assert local.model is engine.runner.model and local.step_lock.acquire(blocking=False)
    local.step_lock.release()
    assert engine.dense_scoring() is None and engine.max_running_requests() == 3


@pytest.mark.usefixtures("one_torch_thread")
def test_the_gate_delegates_every_port():
    inner = ReferenceEngine(tiny_model(), None, "tiny", max_batch_size=3)
    gated = GatedEngine(inner, AdapterManager(inner.adapter_port()))
    assert isinstance(gated, Engine) and not hasattr(GatedEngine, "__getattr__")
    assert gated.adapter_port() is inner and gated.weights() is inner.weights()
    assert gated.memory_control() is inner.memory_control() and gated.max_running_requests() == 3
    assert gated.local_model().model is inner.runner.model and gated.dense_scoring() is None
    assert gated.info() == inner.info()


def test_the_gate_overrides_every_engine_method():
    """Nothing reaches the wrapped engine through an inherited default: each method is the gate's own."""
    public = {n for n, v in inspect.getmembers(Engine) if not n.startswith("_") and callable(v)}
    assert public <= set(vars(GatedEngine)), sorted(public - set(vars(GatedEngine)))
    assert "default_schedule_fixed_at_start" in vars(GatedEngine)
