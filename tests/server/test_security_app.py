"""Which routes of the real app need the token (in-process, fake engine)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from helpers.fake_engine import FakeEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.security import SecurityConfig
from sparrow_server.sparsity.registry import ScheduleRegistry

KEY = "app-key-0123456789"
GOOD = {"Authorization": f"Bearer {KEY}"}
BAD = {"Authorization": "Bearer app-key-0123456788"}
ROLLOUT = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
SCHEDULE = {"budgets_tokens": [64, 128]}
ADMIN_CALLS = [("PUT", "/schedules/mine", SCHEDULE), ("POST", "/update_weights_from_disk", {"model_path": "/tmp"}),
               ("POST", "/pause_generation", {"mode": "abort"}), ("POST", "/continue_generation", {}),
               ("GET", "/flush_cache", None), ("POST", "/release_memory_occupation", {}),
               ("POST", "/resume_memory_occupation", {}), ("POST", "/weights_checker", {"action": "checksum"}),
               ("POST", "/update_weights_from_tensor", {"serialized_named_tensors": []}),
               ("POST", "/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1,
                                                       "rank_offset": 1, "world_size": 2}),
               ("POST", "/update_weights_from_distributed", {"names": ["w"], "dtypes": ["float32"], "shapes": [[1]]}),
               ("POST", "/destroy_weights_update_group", {})]
ROLLOUT_CALLS = [("POST", "/rollout", ROLLOUT), ("POST", "/generate", ROLLOUT), ("POST", "/abort_request", {"rid": "x"})]
OPEN_CALLS = [("GET", "/health", None), ("GET", "/metrics", None), ("GET", "/schedules", None),
              ("GET", "/schedules/dense", None), ("GET", "/server_info", None), ("GET", "/get_weight_version", None),
              ("GET", "/v1/loads", None)]


def client_for(tmp_path, config: SecurityConfig | None) -> TestClient:
    registry = ScheduleRegistry.load(persist_dir=tmp_path / "schedules")
    return TestClient(create_app(FakeEngine(), registry, security=config))


def call(client, method, path, body, headers=None):
    return client.request(method, path, json=body, headers=headers or {})


@pytest.mark.parametrize("method,path,body", ADMIN_CALLS)
def test_admin_routes_need_the_key(tmp_path, method, path, body):
    with client_for(tmp_path, SecurityConfig(api_key=KEY)) as client:
        for headers in (None, BAD):
            r = call(client, method, path, body, headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", r.text
            assert call(client, method, path, "not an object", headers).status_code == 401  # before body checks
        assert call(client, method, path, body, GOOD).status_code != 401
    with client_for(tmp_path, SecurityConfig(open_admin_without_key=False)) as client:  # remote bind, no key
        assert call(client, method, path, body).status_code == 401


def test_rollouts_and_reads(tmp_path):
    with client_for(tmp_path, SecurityConfig(api_key=KEY)) as client:
        for method, path, body in ROLLOUT_CALLS + OPEN_CALLS:
            assert call(client, method, path, body).status_code == 200, path
    with client_for(tmp_path, SecurityConfig(api_key=KEY, require_auth_for_rollouts=True)) as client:
        for method, path, body in ROLLOUT_CALLS:
            assert call(client, method, path, body).status_code == 401, path
            assert call(client, method, path, body, BAD).status_code == 401, path
            assert call(client, method, path, body, GOOD).status_code == 200, path
        for method, path, body in OPEN_CALLS:
            assert call(client, method, path, body).status_code == 200, path


def test_no_key_in_process_keeps_admin_open(tmp_path):
    with client_for(tmp_path, None) as client:
        assert call(client, "PUT", "/schedules/mine", SCHEDULE).status_code == 200
