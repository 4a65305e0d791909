"""Bearer-token dependencies and path confinement, on a minimal app (no engine)."""
from __future__ import annotations

import os

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sparrow_server.server.security import (
    PathNotAllowedError,
    SecurityConfig,
    install_security,
    is_loopback_host,
    require_admin,
    require_rollout_auth,
    resolve_adapter_path,
    resolve_inside,
    token_matches,
)

KEY = "s3cret-Key_0123456789"


class PathIn(BaseModel):
    path: str


def mini_app(config: SecurityConfig) -> TestClient:
    app = FastAPI()
    install_security(app, config)

    @app.post("/admin", dependencies=[Depends(require_admin)])
    async def admin(body: PathIn, request: Request):
        return {"path": str(resolve_adapter_path(request, body.path))}

    @app.post("/gen", dependencies=[Depends(require_rollout_auth)])
    async def gen():
        return {"ok": True}

    return TestClient(app)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture()
def roots(tmp_path):
    root = tmp_path / "adapters"
    (root / "a1").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    return root, outside


def test_admin_requires_the_key(roots):
    root, _ = roots
    client = mini_app(SecurityConfig(api_key=KEY, adapter_roots=(root,)))
    body = {"path": "a1"}
    latin = {"Authorization": "Bearer ключ".encode()}  # non-ASCII bytes must not raise
    for headers in ({}, bearer("wrong"), {"Authorization": KEY}, {"Authorization": "Basic " + KEY}, bearer(""), latin):
        r = client.post("/admin", json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert KEY not in r.text
    r = client.post("/admin", json=body, headers=bearer(KEY))
    assert r.status_code == 200 and r.json()["path"] == str((root / "a1").resolve())
    assert client.post("/admin", json=body, headers={"authorization": f"bearer  {KEY} "}).status_code == 200


def test_auth_is_checked_before_the_body(roots):
    client = mini_app(SecurityConfig(api_key=KEY, adapter_roots=(roots[0],)))
    assert client.post("/admin", content=b"{not json").status_code == 401
    assert client.post("/admin", content=b"{not json", headers={"content-type": "application/json"}).status_code == 401
    assert client.post("/admin", json=[1], headers=bearer(KEY)).status_code == 422
    form = {"content-type": "multipart/form-data; boundary=x"}  # unparseable: FastAPI's 400 before dependencies
    assert client.post("/admin", content=b"--x\r\nbad", headers=form).status_code == 401
    assert client.get("/admin").status_code == 405 and client.post("/nowhere").status_code == 404
    assert client.post("/admin", json={"path": "../secret"}).status_code == 401  # 401, not 403: auth first


def test_rollouts_open_unless_configured():
    assert mini_app(SecurityConfig(api_key=KEY)).post("/gen").status_code == 200
    client = mini_app(SecurityConfig(api_key=KEY, require_auth_for_rollouts=True))
    assert client.post("/gen").status_code == 401
    assert client.post("/gen", headers=bearer(KEY)).status_code == 200


def test_no_key_admin_open_only_when_allowed(roots):
    root, _ = roots
    assert mini_app(SecurityConfig(adapter_roots=(root,))).post("/admin", json={"path": "a1"}).status_code == 200
    r = mini_app(SecurityConfig(open_admin_without_key=False)).post("/admin", json={"path": "a1"})
    assert r.status_code == 401 and "--api-key" in r.json()["error"]["message"]


@pytest.mark.parametrize("given", ["../secret", "escape", "escape/x", "a1/../../secret", "/etc/passwd", "", "a1\x00"])
def test_traversal_is_403_after_auth(roots, given):
    root, outside = roots
    client = mini_app(SecurityConfig(api_key=KEY, adapter_roots=(root,)))
    r = client.post("/admin", json={"path": given}, headers=bearer(KEY))
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["type"] == "path_not_allowed" and error["field"] == "path" and error["value"] == given
    assert str(outside) not in error["message"] or given.startswith(str(outside))


def test_resolve_inside(roots):
    root, outside = roots
    assert resolve_inside("a1", [root]) == (root / "a1").resolve()
    assert resolve_inside(str(root / "a1" / "new"), [root]) == (root / "a1" / "new").resolve()
    assert resolve_inside("x", [outside, root]) == (outside / "x").resolve()  # first root that contains it
    assert resolve_inside(str(root / "escape"), [root, outside]) == outside.resolve()  # the symlink's target is a root
    with pytest.raises(PathNotAllowedError, match="no root"):
        resolve_inside("a1", [])
    with pytest.raises(PathNotAllowedError):
        resolve_inside(os.path.relpath(outside, root), [root])


def test_token_compare_and_repr():
    assert token_matches(KEY, KEY) and not token_matches(KEY, KEY + "x") and not token_matches("", KEY)
    config = SecurityConfig(api_key=KEY, require_auth_for_rollouts=True)
    assert KEY not in repr(config) and KEY not in str(config)
    for bad in ("  ", "", "two words", "ключ"):
        with pytest.raises(ValueError, match="api_key"):
            SecurityConfig(api_key=bad)
    with pytest.raises(ValueError, match="needs an api_key"):
        SecurityConfig(require_auth_for_rollouts=True)


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
                                           ("localhost", True), ("0.0.0.0", False), ("::", False),
                                           ("10.0.0.1", False), ("example.com", False)])
def test_is_loopback_host(host, loopback):
    assert is_loopback_host(host) is loopback


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=40), st.text(alphabet="./a\x00~", max_size=40), st.just("a" * 5000),
                 st.lists(st.sampled_from(["..", ".", "a1", "escape", "", "/"]), max_size=8).map("/".join)))
def test_resolve_inside_never_escapes_or_crashes(roots, given):
    root, _ = roots
    try:
        resolved = resolve_inside(given, [root])
    except PathNotAllowedError as exc:
        assert exc.field == "path" and exc.path == given
        return
    assert resolved.is_relative_to(root.resolve()) and resolved == resolved.resolve()
