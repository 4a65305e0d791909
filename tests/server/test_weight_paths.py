"""Paths a client or operator gives for weights, adapters and models: ``~`` expands to the home
directory, and a ``~user`` without one (``Path.expanduser`` raises ``RuntimeError``) or a NUL byte
is refused naming the field and the value, instead of a 500 in plain text (issue 26)."""
from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient

from helpers.tiny_models import load_plain
from sparrow_server.engine.checkpoint_preflight import checkpoint_signature
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.weights import WeightLoadError
from sparrow_server.models import ModelLoadError, load_model, user_path
from sparrow_server.server.app import create_app

NO_SUCH_USER = "~sparrow-no-such-user-26/x"
BAD_PATHS = [(NO_SUCH_USER, "~sparrow-no-such-user-26: no such user"), ("ckpt\x00x", "NUL byte")]


@pytest.fixture(scope="module")
def http(model_dir, one_torch_thread):
    engine = ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=1024)
    with TestClient(create_app(engine), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("path,reason", BAD_PATHS)
def test_update_weights_from_disk_refuses_an_unexpandable_path_naming_it(http, path, reason):
    r = http.post("/update_weights_from_disk", json={"model_path": path})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["success"] is False and reason in body["message"]
    assert (body["error"]["type"], body["error"]["field"], body["error"]["value"]) == ("weight_load_failed", "model_path", path)
    assert http.get("/get_weight_version").json()["weight_version"] == "default"  # the old weights keep serving


@pytest.mark.parametrize("path,reason", BAD_PATHS)
def test_preflight_and_model_loading_refuse_it_too(path, reason):
    with pytest.raises(WeightLoadError, match=reason) as info:
        checkpoint_signature(path)  # what the SGLang engine runs before forwarding an update
    assert (info.value.field, info.value.value) == ("model_path", path)
    with pytest.raises(ModelLoadError, match=reason):
        load_model(path)  # serve --model


def test_a_home_path_still_expands(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(model_dir, tmp_path / "ckpt")
    assert user_path("~/ckpt") == tmp_path / "ckpt"
    assert checkpoint_signature("~/ckpt") == checkpoint_signature(model_dir)
