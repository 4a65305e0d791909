"""Fuzzing the HTTP API with schemathesis against the app's own OpenAPI schema (skipped where
schemathesis is not installed; ``test_fuzz_bodies.py`` always runs): no input makes the server
answer 5xx, and every answer conforms to the document (its status code, content type and body
schema are the ones declared: schemathesis's response-conformance checks), over every route.
Without a key: every operation except the state-changing admin ones (pausing and weight updates
would change what later examples see). With a key: the admin operations, which must refuse the
unauthenticated examples with 401 (in the declared error shape).

A tiny random model on the reference engine, so generation is real and fast.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from helpers.fuzz_app import fuzz_app, running_engine
from sparrow_server.server.security import SecurityConfig

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import checks  # noqa: E402

KEY = "fuzz-key-0123456789"
ADMIN = {("PUT", "/schedules/{name}"), ("POST", "/update_weights_from_disk"), ("POST", "/pause_generation"),
         ("POST", "/continue_generation"), ("POST", "/adapters"), ("DELETE", "/adapters/{name}"),
         ("PUT", "/adapters/aliases/{alias}"), ("DELETE", "/adapters/aliases/{alias}")}
# Admin operations also fuzzed without a key: registering schedules changes nothing other examples rely on.
OPEN_ADMIN = {("PUT", "/schedules/{name}")}
EXAMPLES = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
CONFORMANCE = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
               checks.response_schema_conformance]


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


open_api = schemathesis.pytest.from_fixture("open_schema").include(
    lambda ctx: operation_of(ctx) not in ADMIN or operation_of(ctx) in OPEN_ADMIN)
keyed_api = schemathesis.pytest.from_fixture("keyed_schema").include(lambda ctx: operation_of(ctx) in ADMIN)


@open_api.parametrize()
@EXAMPLES
def test_no_5xx_and_responses_conform_without_key(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    case.validate_response(response, checks=CONFORMANCE)


@keyed_api.parametrize()
@EXAMPLES
def test_no_5xx_and_admin_needs_key(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    case.validate_response(response, checks=CONFORMANCE)
    operation = (case.operation.method.upper(), case.operation.path)
    if operation in ADMIN and case.method.upper() == operation[0]:  # not the wrong-method probes (405)
        assert response.status_code == 401, (case.method, case.path, response.status_code)
