"""The app both fuzz suites hit: the reference engine on a tiny random model, small limits."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from helpers.tiny_models import load_plain, save_tiny_model
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.server.app import create_app
from sparrow_server.server.limits import Limits
from sparrow_server.server.security import SecurityConfig
from sparrow_server.sparsity.registry import ScheduleRegistry

FUZZ_LIMITS = Limits(max_new_tokens_limit=16, max_n=4, request_timeout_s=60)
FUZZ_GROUP_TIMEOUT_S = 2.0  # a generated /init_weights_update_group with backend gloo gives up fast


@contextlib.contextmanager
def running_engine(tmp_path_factory) -> Iterator[ReferenceEngine]:
    """A started engine (fuzzers may call the app without running its lifespan)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = ReferenceEngine(load_plain(save_tiny_model(tmp_path_factory.mktemp("model")), "sdpa"), None, "tiny",
                             kv_pool_tokens=4096, weight_group_timeout_s=FUZZ_GROUP_TIMEOUT_S)
    engine.start_thread()
    try:
        yield engine
    finally:
        engine.scheduler.stop()
        torch.set_num_threads(previous)


def fuzz_app(engine, tmp_path_factory, security: SecurityConfig | None = None):
    schedules = ScheduleRegistry.load(persist_dir=tmp_path_factory.mktemp("state") / "schedules")
    return create_app(engine, schedules, security=security, limits=FUZZ_LIMITS)
