"""Fuzzing the HTTP API with schemathesis against the app's own OpenAPI schema (skipped where
schemathesis is not installed; ``test_fuzz_bodies.py`` always runs): no input makes the server
answer 5xx. Without a key: generation and schedules (pausing, weight updates and aborts are left
out because they change what later examples see). With a key: every state-changing operation,
which must refuse the unauthenticated examples with 401.

A tiny random model on the reference engine, so generation is real and fast.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from helpers.fuzz_app import fuzz_app, running_engine
from sparrow_server.server.security import SecurityConfig

schemathesis = pytest.importorskip("schemathesis")

KEY = "fuzz-key-0123456789"
# Operations fuzzed without a key (pausing, weight updates and aborts change what later examples see).
OPEN = {("POST", "/rollout"), ("POST", "/generate"), ("PUT", "/schedules/{name}"), ("GET", "/schedules/{name}")}
ADMIN = {("PUT", "/schedules/{name}"), ("POST", "/update_weights_from_disk"), ("POST", "/pause_generation"),
         ("POST", "/continue_generation"), ("POST", "/adapters"), ("DELETE", "/adapters/{name}"),
         ("PUT", "/adapters/aliases/{alias}"), ("DELETE", "/adapters/aliases/{alias}")}
EXAMPLES = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory) as engine:
        yield engine


@pytest.fixture(scope="module")
def open_schema(engine, tmp_path_factory):
    app = fuzz_app(engine, tmp_path_factory)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def keyed_schema(engine, tmp_path_factory):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app(engine, tmp_path_factory, SecurityConfig(api_key=KEY)))


def operation_of(ctx) -> tuple[str, str]:
    return ctx.operation.method.upper(), ctx.operation.path


open_api = schemathesis.pytest.from_fixture("open_schema").include(lambda ctx: operation_of(ctx) in OPEN)
keyed_api = schemathesis.pytest.from_fixture("keyed_schema").include(lambda ctx: operation_of(ctx) in ADMIN)


@open_api.parametrize()
@EXAMPLES
def test_no_5xx_without_key(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])


@keyed_api.parametrize()
@EXAMPLES
def test_no_5xx_and_admin_needs_key(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    operation = (case.operation.method.upper(), case.operation.path)
    if operation in ADMIN and case.method.upper() == operation[0]:  # not the wrong-method probes (405)
        assert response.status_code == 401, (case.method, case.path, response.status_code)
