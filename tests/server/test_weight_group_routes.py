"""The weight-update group routes over HTTP, without a trainer (in process, reference engine on a tiny
model): SGLang 0.5.17's request models (names, defaults), and every refusal that needs no group: a
backend other than gloo, out-of-range fields (422 naming them), bad names, dtypes and shapes (400 naming
the entry, nothing changes), an unknown group; ``/update_weights_from_tensor`` refused with its reason;
an engine without weight groups says so. The gloo path itself: tests/e2e/test_weights_distributed.py."""
from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from helpers.fake_engine import FakeEngine
from helpers.tiny_models import load_plain
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.reference.weight_update import dense_parameters
from sparrow_server.server.app import create_app
from sparrow_server.server.weight_groups import (
    DestroyWeightsUpdateGroupIn,
    InitWeightsUpdateGroupIn,
    UpdateWeightsFromDistributedIn,
)

GROUP = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2, "backend": "gloo"}
HEAD = {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[128, 64]]}


@pytest.fixture(scope="module")
def engine(model_dir, one_torch_thread):
    return ReferenceEngine(load_plain(model_dir, "sdpa"), None, "tiny", kv_pool_tokens=1024, weight_group_timeout_s=2)


@pytest.fixture(scope="module")
def http(engine):
    with TestClient(create_app(engine)) as client:
        yield client


def failure(response, status: int, kind: str, field: str | None = None) -> dict:
    body = response.json()
    assert response.status_code == status, body
    assert body["error"]["type"] == kind and body["error"].get("field") == field, body
    if status == 400:
        assert body["success"] is False and body["message"] == body["error"]["message"]
    return body


def test_request_models_are_sglangs():
    """Fields and defaults of ``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput`` and
    ``DestroyWeightsUpdateGroupReqInput`` (sglang 0.5.17 ``srt/managers/io_struct.py``; ``rid`` from ``BaseReq``)."""
    def fields(model):
        return {name: (None if f.is_required() else f.default) for name, f in model.model_fields.items()}

    assert fields(InitWeightsUpdateGroupIn) == {
        "master_address": None, "master_port": None, "rank_offset": None, "world_size": None,
        "group_name": "weight_update_group", "backend": "nccl", "rid": None}
    assert fields(UpdateWeightsFromDistributedIn) == {
        "names": None, "dtypes": None, "shapes": None, "group_name": "weight_update_group", "flush_cache": True,
        "abort_all_requests": False, "weight_version": None, "load_format": None, "torch_empty_cache": False,
        "rid": None}
    assert fields(DestroyWeightsUpdateGroupIn) == {"group_name": "weight_update_group", "rid": None}


def test_backends_other_than_gloo_are_refused_naming_the_field(http):
    for body in ({k: v for k, v in GROUP.items() if k != "backend"}, {**GROUP, "backend": "mpi"}):
        refused = failure(http.post("/init_weights_update_group", json=body), 400, "not_supported", "backend")
        assert "gloo" in refused["message"] and "NCCL needs GPUs" in refused["message"]


@pytest.mark.parametrize("field,value", [("master_port", 0), ("master_port", 65536), ("world_size", 1),
                                         ("rank_offset", 0), ("rank_offset", 2), ("group_name", ""),
                                         ("master_address", ""), ("master_port", "29500"), ("world_size", 2.0),
                                         ("colour", "blue")])
def test_bad_group_fields_are_422_naming_them(http, field, value):
    body = failure(http.post("/init_weights_update_group", json={**GROUP, field: value}), 422, "invalid_request", field)
    assert body["error"]["value"] == value


@pytest.mark.parametrize("change,field,words", [
    ({"names": ["model.nope.weight"]}, "names[0]", "not a parameter of the served model"),
    ({"names": ["lm_head.weight"] * 2, "dtypes": ["float32"] * 2, "shapes": [[128, 64]] * 2}, "names[1]", "named twice"),
    ({"dtypes": ["int8"]}, "dtypes[0]", "floating-point"),
    ({"dtypes": ["torch.bfloat16"]}, "dtypes[0]", "floating-point"),
    ({"shapes": [[64, 128]]}, "shapes[0]", "has shape [128, 64]"),
    ({"shapes": []}, "shapes", "one per name"),
    ({"names": [], "dtypes": [], "shapes": []}, "names", "at least one"),
    ({"load_format": "safetensors"}, "load_format", "flattened_bucket"),
])
def test_bad_metadata_is_400_naming_the_entry_and_nothing_changes(http, engine, change, field, words):
    before = {name: t.clone() for name, t in dense_parameters(engine.runner.model).items()}
    body = failure(http.post("/update_weights_from_distributed", json={**HEAD, **change}), 400, "weight_load_failed", field)
    assert words in body["message"] and body["error"]["group_destroyed"] is False
    assert all(torch.equal(t, before[n]) for n, t in dense_parameters(engine.runner.model).items())
    assert http.get("/get_weight_version").json()["weight_version"] == "default"


def test_float_is_an_alias_sglang_resolves_and_so_do_we(http):
    """``getattr(torch, "float")`` is ``torch.float32``: valid metadata, so the refusal is the missing group."""
    failure(http.post("/update_weights_from_distributed", json={**HEAD, "dtypes": ["float"]}), 400, "unknown_group",
            "group_name")


def test_unknown_group_and_destroy_without_a_group(http):
    body = failure(http.post("/update_weights_from_distributed", json={**HEAD, "group_name": "g"}), 400,
                   "unknown_group", "group_name")
    assert "/init_weights_update_group first" in body["message"]
    for request in ({"json": {"group_name": "g"}}, {}):  # no body: SGLang's default group name
        body = failure(http.post("/destroy_weights_update_group", **request), 400, "unknown_group", "group_name")
        assert body["message"] == "The group to be destroyed does not exist."


def test_update_weights_from_tensor_is_refused_with_its_reason(http):
    body = failure(http.post("/update_weights_from_tensor", json={"serialized_named_tensors": ["AAAA"]}), 400,
                   "not_supported")
    for words in ("CUDA IPC", "GPU worker on the trainer's host", "unpickling bytes from HTTP is unsafe",
                  "/update_weights_from_disk", "/update_weights_from_distributed"):
        assert words in body["message"], words


def test_an_engine_without_weight_groups_says_so():
    with TestClient(create_app(FakeEngine())) as http:
        for path, body in (("/init_weights_update_group", GROUP), ("/update_weights_from_distributed", HEAD),
                           ("/destroy_weights_update_group", {})):
            refused = failure(http.post(path, json=body), 400, "not_supported")
            assert "cannot join a trainer's weight-update group" in refused["message"], path
        tensor = failure(http.post("/update_weights_from_tensor", json={}), 400, "not_supported")
        assert "/update_weights_from_distributed" not in tensor["message"]
