"""New policy weights from the trainer's memory to every server over a process group: the path slime
takes with SGLang (``/init_weights_update_group``, then per update one ``/update_weights_from_distributed``
per bucket while the trainer broadcasts the bucket's tensors from rank 0, ``/destroy_weights_update_group``).

    from sparrow_server.client.weight_broadcast import BroadcastConfig, WeightBroadcaster

    with WeightBroadcaster(urls, BroadcastConfig(master_port=29650, backend="nccl")) as sync:
        for step in ...:
            ...  # train
            sync.update(dict(policy.named_parameters()), weight_version=str(step))

Ranks: the trainer is 0; server ``i`` joins as ``1 + i * ranks_per_server`` (its tensor-parallel ranks
follow), so ``world_size = 1 + len(urls) * ranks_per_server``. ``nccl`` needs the tensors on the
trainer's GPU; ``gloo`` (the reference engine, CPU tests) on the CPU; ``update`` moves them when needed.
Between two GPUs of a VM without working P2P, both processes need ``NCCL_P2P_DISABLE=1
NCCL_CUMEM_ENABLE=0 NCCL_NVLS_ENABLE=0`` (docs/fleet.md).

A server that fails answers 400 and destroys its side of the group (SGLang and the reference engine
alike); the broadcaster then raises ``FleetError`` naming every server (the failed ones with their
replies, the rest as not answered yet), stops waiting for its own broadcast (which may never end) and
refuses further updates: open a new one.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import httpx

from sparrow_server.client.common import DEFAULT_TIMEOUT_S, raise_for_status
from sparrow_server.client.trainer_group import broadcast_all, check_backend, close_trainer_group, open_trainer_group
from sparrow_server.client.weights import FleetError, Urls, admin_headers, pause, resume, url_list

# THUDM/slime: --update-weight-buffer-size defaults to 512 MiB per /update_weights_from_distributed request.
DEFAULT_BUCKET_BYTES = 512 * 1024**2
# SGLang's servers join with torch's default process-group timeout (30 min); the trainer waits less.
DEFAULT_GROUP_TIMEOUT_S = 600.0
POLL_S = 0.05  # how often a waiting trainer looks for a server's failure


@dataclass(frozen=True)
class BroadcastConfig:
    master_port: int  # the trainer's TCPStore port (free on master_address; every server connects to it)
    master_address: str = "127.0.0.1"  # an address of the trainer's host that the servers reach
    backend: str = "nccl"
    group_name: str | None = None  # None: a fresh name (a server may refuse one it has seen)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ranks_per_server: int = 1  # each server's tensor-parallel size
    group_timeout_s: float = DEFAULT_GROUP_TIMEOUT_S
    http_timeout_s: float = DEFAULT_TIMEOUT_S
    device: str | None = None  # nccl: the trainer's CUDA device (default: the current one)
    api_key: str | None = None

    def __post_init__(self) -> None:
        check_backend(self.backend)
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port = {self.master_port}: must be in 1..65535")
        for name in ("bucket_bytes", "ranks_per_server"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")
        for name in ("group_timeout_s", "http_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} = {getattr(self, name)}: must be > 0")
        if self.device is not None and self.backend != "nccl":
            raise ValueError(f"device = {self.device!r}: only for backend 'nccl' (gloo sends CPU tensors)")


def plan_buckets(sizes: Sequence[tuple[str, int]], limit: int) -> list[list[str]]:
    """slime's and verl's bucketing: names in order; a tensor that would overflow the current bucket starts
    a new one, and one larger than ``limit`` gets a bucket of its own."""
    out: list[list[str]] = []
    filled = 0
    for name, size in sizes:
        if out and filled + size <= limit:
            out[-1].append(name)
            filled += size
        else:
            out.append([name])
            filled = size
    return out


def dtype_name(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def update_body(group_name: str, tensors: Mapping[str, Any], *, weight_version: str | None = None,
                flush_cache: bool = True) -> dict[str, Any]:
    """``POST /update_weights_from_distributed`` body for ``tensors`` (names in broadcast order)."""
    body: dict[str, Any] = {"names": list(tensors), "dtypes": [dtype_name(t) for t in tensors.values()],
                            "shapes": [list(t.shape) for t in tensors.values()], "group_name": group_name,
                            "flush_cache": flush_cache, "abort_all_requests": False}
    if weight_version is not None:
        body["weight_version"] = weight_version
    return body


class _Background:
    """``fn()`` on a daemon thread; ``value`` or ``error`` once ``done`` is set. A daemon thread, because
    a collective whose peer died may never return, and it must not keep the trainer's process alive."""

    def __init__(self, fn: Callable[[], Any]):
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # handed to the waiting trainer
            self.error = exc
        self.done.set()


class WeightBroadcaster:
    """Rank 0 of one weight-update group with every server of ``urls``; see the module's docstring."""

    def __init__(self, urls: Urls, config: BroadcastConfig):
        self.urls = url_list(urls)
        self.config = config
        self.group_name = config.group_name or f"sparrow-trainer-{os.getpid()}-{time.time_ns()}"
        self.world_size = 1 + len(self.urls) * config.ranks_per_server
        self.group: Any = None
        self.broken: str | None = None  # why updates are refused
        self.updates = 0

    # ----- lifecycle ------------------------------------------------------------------------------
    def open(self) -> dict[str, Any]:
        """POST ``/init_weights_update_group`` to every server while joining as rank 0; their replies."""
        c = self.config
        self._use_device()
        bodies = {url: {"master_address": c.master_address, "master_port": c.master_port,
                        "rank_offset": 1 + i * c.ranks_per_server, "world_size": self.world_size,
                        "group_name": self.group_name, "backend": c.backend} for i, url in enumerate(self.urls)}
        join = lambda: self._use_device() or open_trainer_group(c.master_address, c.master_port, self.world_size,
                                                                self.group_name, c.backend, c.group_timeout_s)
        replies, group = self._together("init_weights_update_group", "/init_weights_update_group", bodies, join)
        self.group = group
        return replies

    def close(self) -> dict[str, Any]:
        """POST ``/destroy_weights_update_group`` to every server and leave the group. Best effort: each
        server's reply or exception (a server whose group a failure destroyed says it does not exist)."""
        outcomes = {url: _Background(lambda u=url: self._post(u, "/destroy_weights_update_group",
                                                               {"group_name": self.group_name}))
                    for url in self.urls}
        for call in outcomes.values():
            call.done.wait(self.config.http_timeout_s)
        if self.group is not None and self.broken is None:  # a hung collective would hang the destroy too
            close_trainer_group(self.group)
        self.group = None
        self.broken = self.broken or "closed"
        return {url: call.error or call.value for url, call in outcomes.items()}

    def __enter__(self) -> "WeightBroadcaster":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----- updates --------------------------------------------------------------------------------
    def update(self, tensors: Mapping[str, Any], *, weight_version: str | None = None, pause_mode: str | None = None,
               flush_cache: bool = True) -> list[dict[str, Any]]:
        """Send every tensor of ``tensors`` (checkpoint names, e.g. ``dict(model.named_parameters())``) to
        every server, one request per bucket; the servers' replies per bucket. ``pause_mode``
        (``abort`` | ``retract`` | ``in_place``): pause generation around the update, as slime does while
        rollouts stream; ``flush_cache`` goes with the last bucket (the KV cache then holds nothing
        computed with the old weights)."""
        if self.group is None or self.broken:
            raise RuntimeError(f"group {self.group_name!r}: cannot update ({self.broken or 'not open'}); "
                               "open a new WeightBroadcaster")
        prepared = {name: self._prepared(t) for name, t in tensors.items()}
        if not prepared:
            raise ValueError("tensors: give at least one tensor")
        plan = plan_buckets([(n, t.numel() * t.element_size()) for n, t in prepared.items()], self.config.bucket_bytes)
        if pause_mode is not None:
            pause(self.urls, pause_mode, api_key=self.config.api_key, timeout=self.config.http_timeout_s)
        try:
            replies = [self._bucket({n: prepared[n] for n in names}, weight_version, flush_cache and i == len(plan) - 1)
                       for i, names in enumerate(plan)]
        finally:
            if pause_mode is not None:
                resume(self.urls, api_key=self.config.api_key, timeout=self.config.http_timeout_s)
        self.updates += 1
        return replies

    def _use_device(self) -> None:
        """NCCL binds to the calling thread's current device, and the collectives run on threads of their
        own (whose current device is cuda:0 until told): set it in each."""
        if self.config.backend == "nccl" and self.config.device is not None:
            import torch

            torch.cuda.set_device(self.config.device)

    def _prepared(self, tensor: Any) -> Any:
        """Detached and contiguous, on the device the backend sends from."""
        t = tensor.detach()
        if self.config.backend == "gloo" and t.device.type != "cpu":
            t = t.cpu()
        elif self.config.backend == "nccl" and t.device.type != "cuda":
            t = t.to(self.config.device or "cuda")
        return t.contiguous()

    def _bucket(self, tensors: dict[str, Any], weight_version: str | None, flush_cache: bool) -> dict[str, Any]:
        body = update_body(self.group_name, tensors, weight_version=weight_version, flush_cache=flush_cache)
        send = lambda: self._use_device() or broadcast_all(self.group, list(tensors.values()))
        replies, _ = self._together("update_weights_from_distributed", "/update_weights_from_distributed",
                                    {url: body for url in self.urls}, send)
        return replies

    # ----- the HTTP side beside the collective ----------------------------------------------------
    def _post(self, url: str, path: str, body: dict[str, Any]) -> Any:
        response = httpx.post(f"{url}{path}", json=body, headers=admin_headers(self.config.api_key),
                              timeout=self.config.http_timeout_s)
        raise_for_status(response)
        reply = response.json()
        if isinstance(reply, dict) and reply.get("success") is False:  # SGLang answers 400, but be sure
            raise RuntimeError(f"{path} answered {reply}")
        return reply

    def _together(self, action: str, path: str, bodies: dict[str, dict], local: Callable[[], Any]) -> tuple[dict, Any]:
        """POST ``bodies`` (one per server) while ``local()`` runs the trainer's side of the collective; a
        server that fails ends the wait at once (its peers' side of the collective may never end)."""
        posts = {url: _Background(lambda u=url: self._post(u, path, bodies[u])) for url in self.urls}
        mine = _Background(local)
        while not mine.done.wait(POLL_S):
            answered = {u: p for u, p in posts.items() if p.done.is_set()}  # one snapshot: each url in one group
            failed = {u: p.error for u, p in answered.items() if p.error is not None}
            if failed:
                self.broken = f"{action} failed on a server"
                raise FleetError(action, {u: p.value for u, p in answered.items() if u not in failed}, failed,
                                 [u for u in posts if u not in answered])
        for call in posts.values():
            call.done.wait(self.config.http_timeout_s + 5)
        failures = {u: p.error or TimeoutError("no answer") for u, p in posts.items() if p.error or not p.done.is_set()}
        if failures or mine.error is not None:
            self.broken = (f"the trainer's side of {action} failed: {mine.error}" if mine.error is not None
                           else f"{action} failed on a server")
            raise FleetError(action, {u: p.value for u, p in posts.items() if u not in failures}, failures,
                             trainer_error=mine.error)
        return {u: p.value for u, p in posts.items()}, mine.value


__all__ = ["BroadcastConfig", "WeightBroadcaster", "plan_buckets", "update_body", "DEFAULT_BUCKET_BYTES"]
