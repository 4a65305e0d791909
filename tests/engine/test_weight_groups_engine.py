"""``ReferenceWeightGroups`` in process, its process-group layer (``open_group``, ``receive_tensors``,
``close_group``) replaced by stand-ins the test holds or releases (deterministic, no sockets; the real
gloo path runs against a trainer process in ``tests/e2e/test_weights_distributed.py``).

Received tensors are swapped in as an update from disk is (rollouts then equal a fresh engine's on that
checkpoint; a subset updates only the named parameters); a failed receive closes the group and keeps
every parameter as it was; deadlines on the join and on the receive answer in time and close what the
abandoned thread opened once it returns; a name stays taken until then."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from helpers.engine_util import scenario
from helpers.tiny_models import TINY_VOCAB, load_plain, save_tiny_model
from sparrow_server.engine.base import GenerationRequest, SamplingParams
from sparrow_server.engine.reference import ReferenceEngine
from sparrow_server.engine.reference import weight_groups as groups_module
from sparrow_server.engine.reference.process_group import DeadlineExceeded, call_with_deadline
from sparrow_server.engine.reference.weight_update import dense_parameters
from sparrow_server.engine.weight_groups import DistributedWeightUpdate, WeightGroupError, WeightGroupSpec
from sparrow_server.engine.weights import WeightSyncConflictError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = tuple((i * 7 + 3) % (TINY_VOCAB - 1) for i in range(40))
WAIT_S = 30.0  # the most a stand-in blocks, and a test waits for a thread to return
SPEC = WeightGroupSpec("127.0.0.1", 29500, 1, 2, "g", "gloo")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("weight-groups")
    return {"a": save_tiny_model(root / "a", seed=0, lm_head_std=0.5),
            "b": save_tiny_model(root / "b", seed=1, lm_head_std=0.5)}


class FakeGroup:
    def __init__(self, name: str):
        self.name = name


class FakeDistributed:
    """Stand-ins for the process-group layer; each blocks until ``release`` is set."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.release = threading.Event()
        self.release.set()
        self.fail: Exception | None = None
        self.opened: list[FakeGroup] = []
        self.closed: list[FakeGroup] = []
        self.received: list[tuple] = []

    def open_group(self, address, port, rank, world_size, name, timeout_s):
        assert self.release.wait(WAIT_S)
        self.opened.append(FakeGroup(name))
        return self.opened[-1]

    def receive_tensors(self, group, specs, flattened):
        assert self.release.wait(WAIT_S)
        if self.fail is not None:
            raise self.fail
        self.received.append((group, specs, flattened))
        return {s.name: self.tensors[s.name].to(s.dtype) for s in specs}

    def close_group(self, group):
        self.closed.append(group)


@pytest.fixture
def fake(ckpt, monkeypatch):
    stand_in = FakeDistributed(dense_parameters(load_plain(ckpt["b"])))
    for name in ("open_group", "receive_tensors", "close_group"):
        monkeypatch.setattr(groups_module, name, getattr(stand_in, name))
    yield stand_in
    stand_in.release.set()  # never leave a thread blocked


def make_engine(directory, timeout_s: float = WAIT_S) -> ReferenceEngine:
    return ReferenceEngine(load_plain(directory, "sdpa"), None, "tiny", kv_pool_tokens=2048,
                           weight_group_timeout_s=timeout_s)


def update_of(tensors: dict[str, torch.Tensor], group: str = "g", **fields) -> DistributedWeightUpdate:
    return DistributedWeightUpdate(tuple(tensors), tuple(str(t.dtype).removeprefix("torch.") for t in tensors.values()),
                                   tuple(tuple(t.shape) for t in tensors.values()), group, **fields)


async def greedy(engine: ReferenceEngine, rid: str) -> tuple[list[int], set[str]]:
    request = GenerationRequest(rid=rid, input_ids=PROMPT,
                                sampling=SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True))
    tokens, versions = [], set()
    async for chunk in engine.submit(request):
        tokens += chunk.token_ids
        versions.add(chunk.weight_version)
    return tokens, versions


def snapshot(engine: ReferenceEngine) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in dense_parameters(engine.runner.model).items()}


def assert_same(params: dict[str, torch.Tensor], engine: ReferenceEngine) -> None:
    for name, tensor in dense_parameters(engine.runner.model).items():
        assert torch.equal(tensor, params[name]), name


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_received_tensors_swap_in_as_a_disk_update_would(ckpt, fake):
    engine = make_engine(ckpt["a"])
    port = engine.weight_groups()

    async def go():
        before = await greedy(engine, "before")
        assert await port.init_group(SPEC) == "Succeeded to initialize custom process group."
        result = await port.update_from_group(update_of(fake.tensors, weight_version="step-1"))
        return before, result, await greedy(engine, "after")

    before, result, after = scenario(engine, go)
    fresh = make_engine(ckpt["b"])
    want = scenario(fresh, lambda: greedy(fresh, "fresh"))
    assert (result.previous_weight_version, result.weight_version) == ("default", "step-1")
    assert after == (want[0], {"step-1"}) and after[0] != before[0]
    assert [flattened for _, _, flattened in fake.received] == [False]
    assert fake.closed == fake.opened, "shutdown closes the open group"


def test_a_subset_updates_only_the_named_parameters_cast_to_their_dtype(ckpt, fake):
    engine = make_engine(ckpt["a"])
    port, before = engine.weight_groups(), snapshot(engine)
    head = {"lm_head.weight": fake.tensors["lm_head.weight"].to(torch.bfloat16)}

    async def go():
        await port.init_group(SPEC)
        return await port.update_from_group(update_of(head, load_format="flattened_bucket"))

    result = scenario(engine, go)
    assert result.weight_version == "1" and [flattened for _, _, flattened in fake.received] == [True]
    after = dense_parameters(engine.runner.model)
    assert torch.equal(after["lm_head.weight"], head["lm_head.weight"].float())
    assert_same({**before, "lm_head.weight": after["lm_head.weight"]}, engine)


def test_a_failed_receive_closes_the_group_and_keeps_every_parameter(ckpt, fake):
    engine = make_engine(ckpt["a"])
    port, before = engine.weight_groups(), snapshot(engine)
    fake.fail = RuntimeError("[pair.cc:537] Read error: Connection reset by peer.\nframe #0: c10::Error ...")

    async def go():
        await port.init_group(SPEC)
        with pytest.raises(WeightGroupError) as failed:
            await port.update_from_group(update_of(fake.tensors))
        with pytest.raises(WeightGroupError) as gone:
            await port.update_from_group(update_of(fake.tensors))
        return failed.value, gone.value

    failed, gone = scenario(engine, go)
    assert failed.group_destroyed and "Connection reset by peer" in str(failed) and "frame #0" not in str(failed)
    assert "old weights keep serving" in str(failed) and "init_weights_update_group again" in str(failed)
    assert fake.closed == fake.opened and port.group_names() == ()
    assert gone.kind == "unknown_group" and gone.field == "group_name"
    assert_same(before, engine)
    assert engine.weight_version == "default"


def test_bad_metadata_is_named_and_closes_the_open_group(ckpt, fake):
    engine = make_engine(ckpt["a"])
    port = engine.weight_groups()
    bad = {"lm_head.weight": fake.tensors["lm_head.weight"][:64]}

    async def go():
        await port.init_group(SPEC)
        with pytest.raises(WeightGroupError) as failed:
            await port.update_from_group(update_of(bad))
        return failed.value

    failed = scenario(engine, go)
    assert (failed.kind, failed.field, failed.value) == ("weight_load_failed", "shapes[0]", [64, 64])
    assert failed.group_destroyed and fake.closed == fake.opened and fake.received == []


def test_receive_deadline_answers_in_time_and_the_group_closes_when_the_thread_returns(ckpt, fake):
    engine = make_engine(ckpt["a"])
    port, before = engine.weight_groups(), snapshot(engine)
    assert port.timeout_s == WAIT_S  # the engine's weight_group_timeout_s

    async def go():
        await port.init_group(SPEC)
        fake.release.clear()  # the trainer never broadcasts
        started = time.monotonic()
        port.timeout_s = 0.5  # only the receive that is meant to time out runs under a short deadline
        try:
            with pytest.raises(WeightGroupError) as timed_out:
                await port.update_from_group(update_of(fake.tensors))
        finally:
            port.timeout_s = WAIT_S  # the joins and the close at shutdown are meant to succeed
        elapsed = time.monotonic() - started
        with pytest.raises(WeightSyncConflictError, match="still closing"):
            await port.init_group(SPEC)
        assert port.closing_names() == ("g",) and fake.closed == []
        fake.release.set()  # the receive returns (late): the group it holds is closed, the name freed
        await until(lambda: not port.closing_names(), "the abandoned receive to return")
        await port.init_group(SPEC)
        return timed_out.value, elapsed

    timed_out, elapsed = scenario(engine, go)
    assert elapsed < 0.5 + 5 and timed_out.group_destroyed and "within 0.5 s" in str(timed_out)
    assert fake.closed == fake.opened and len(fake.opened) == 2
    assert_same(before, engine)


def test_join_deadline_answers_in_time_and_a_late_group_is_closed(ckpt, fake):
    engine = make_engine(ckpt["a"], timeout_s=0.5)
    port = engine.weight_groups()

    async def go():
        fake.release.clear()  # nobody at master_address:master_port
        with pytest.raises(WeightGroupError) as timed_out:
            await port.init_group(SPEC)
        assert port.group_names() == () and port.closing_names() == ("g",)
        fake.release.set()  # the join completes after its deadline
        await until(lambda: not port.closing_names(), "the abandoned join to return")
        return timed_out.value

    timed_out = scenario(engine, go)
    assert "Failed to initialize custom process group" in str(timed_out) and "127.0.0.1:29500" in str(timed_out)
    assert len(fake.opened) == 1 and fake.closed == fake.opened


def test_backend_open_names_and_destroy(ckpt, fake):
    engine = make_engine(ckpt["a"])
    port = engine.weight_groups()

    async def go():
        with pytest.raises(WeightGroupError) as nccl:
            await port.init_group(WeightGroupSpec("127.0.0.1", 29500, 1, 2, "g", "nccl"))
        await port.init_group(SPEC)
        with pytest.raises(WeightSyncConflictError, match="already open"):
            await port.init_group(SPEC)
        assert await port.destroy_group("g") == "Succeeded to destroy custom process group."
        with pytest.raises(WeightGroupError) as missing:
            await port.destroy_group("g")
        return nccl.value, missing.value

    nccl, missing = scenario(engine, go)
    assert (nccl.kind, nccl.field, nccl.value) == ("not_supported", "backend", "nccl") and "gloo" in str(nccl)
    assert str(missing) == "The group to be destroyed does not exist." and fake.closed == fake.opened


def test_call_with_deadline_returns_raises_and_hands_late_results_over():
    late: list = []
    gate, handed_over = threading.Event(), threading.Event()

    def on_late(result, error) -> None:
        late.append((result, error))
        handed_over.set()

    async def go():
        assert await call_with_deadline(lambda: 7, 5, "quick") == 7
        with pytest.raises(ValueError, match="bad"):
            await call_with_deadline(lambda: (_ for _ in ()).throw(ValueError("bad")), 5, "failing")
        with pytest.raises(DeadlineExceeded, match="slow did not finish within 0.1 s"):
            await call_with_deadline(lambda: gate.wait(WAIT_S) and "late", 0.1, "slow", on_late=on_late)

    asyncio.run(go())
    gate.set()
    assert handed_over.wait(WAIT_S) and late == [("late", None)]
