"""A stand-in disaggregated trainer, as slime drives SGLang's weight-update group (THUDM/slime
``update_weight_from_distributed.py``): rank 0 of a process group it creates with the product's trainer
side (``sparrow_server.client.trainer_group``, SGLang's ``init_custom_process_group`` written out apart
from the server's code), while it POSTs ``/init_weights_update_group`` to the server on a thread; each
step it POSTs ``/update_weights_from_distributed`` on a thread while it ``dist.broadcast``s every tensor
from rank 0, in the order of ``names``. Unlike ``sparrow_server.client.weight_broadcast`` it can
misbehave on purpose (other bodies, no POST, stop mid-broadcast), which the failure tests need.

Run as ``python gloo_trainer.py`` (torch, safetensors, httpx and the product's client).
It reads one JSON command per line on stdin and answers one JSON line on stdout:

- ``{"op": "init", "url", "world_size", "group_name", "server_body": {...}, "post": true, "group_timeout_s"}``:
  join as rank 0 (``server_body`` overrides fields of the POSTed body, e.g. another ``world_size``);
  answers when the POST returned and its own join ended, or at once if the POST failed. The master port
  is bound before anything is POSTed, on port 0 (the kernel picks a free one, so no other process can
  take it between choosing and binding): a ``multi_tenant`` ``TCPStore`` that the group's own rendezvous
  store then shares (torch: TCPStores of one process on one port share their server). Its answer says
  which port (``"port"``);
- ``{"op": "update", "url", "ckpt", "group_name", "body": {...}, "post": true, "flattened": false,
  "stop_after": null}``: broadcast the checkpoint's tensors (``body`` overrides fields of the POSTed body:
  bad names...); with ``stop_after: k`` it answers ``{"event": "stopped", "sent": k}`` after k tensors and
  then blocks (the test kills it mid-broadcast);
- ``{"op": "destroy", "url", "group_name"}``; ``{"op": "exit"}``.
With ``post: false`` the test sends the HTTP request itself. Answers: ``{"server": {"status", "body",
"elapsed_s"}, "trainer": "ok" | "<error>"}`` (and ``"port"`` for ``init``).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

GROUPS: dict = {}
MASTER_STORES: dict = {}  # group name -> the TCPStore holding its master port (alive while the group is)


def new_group(port: int, world_size: int, group_name: str, timeout_s: float):
    from sparrow_server.client.trainer_group import open_trainer_group

    return open_trainer_group("127.0.0.1", port, world_size, group_name, "gloo", timeout_s)


class Post:
    """One HTTP POST on a thread (the server answers only when the collective side is done)."""

    def __init__(self, url: str, body: dict):
        self.reply: dict = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self.thread.start()

    def _run(self, url: str, body: dict) -> None:
        import httpx

        started = time.monotonic()
        try:
            r = httpx.post(url, json=body, timeout=120)
            self.reply = {"status": r.status_code, "body": r.json(), "elapsed_s": time.monotonic() - started}
        except Exception as exc:
            self.reply = {"status": None, "body": repr(exc), "elapsed_s": time.monotonic() - started}
        self.done.set()

    def failed(self) -> bool:
        return self.done.is_set() and self.reply.get("status") != 200


def on_thread(fn) -> tuple[threading.Event, dict]:
    done, out = threading.Event(), {}

    def run() -> None:
        try:
            out["value"] = fn()
            out["trainer"] = "ok"
        except Exception as exc:
            out["trainer"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, out


def master_port(group_name: str, timeout_s: float) -> int:
    """Bind the group's master port now (port 0: the kernel's choice, free by construction); the
    rendezvous of ``open_trainer_group`` on that port shares this store's server (``multi_tenant``)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False,
                     multi_tenant=True)
    MASTER_STORES[group_name] = store
    return store.port


def init(cmd: dict) -> dict:
    name, timeout_s = cmd["group_name"], cmd.get("group_timeout_s", 30.0)
    port = master_port(name, timeout_s)
    body = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1,
            "world_size": cmd["world_size"], "group_name": name, "backend": "gloo", **cmd.get("server_body", {})}
    post = Post(f"{cmd['url']}/init_weights_update_group", body) if cmd.get("post", True) else None
    joined, out = on_thread(lambda: new_group(port, cmd["world_size"], name, timeout_s))
    while not joined.wait(0.05):
        if post is not None and post.failed():  # no point waiting for a group the server left
            return {"server": post.reply, "trainer": "abandoned: the server's init failed", "port": port}
    if "value" in out:
        GROUPS[name] = out["value"]
    if post is not None:
        post.done.wait()
    return {"server": post.reply if post else None, "trainer": out["trainer"], "port": port}


def tensors_of(ckpt: str) -> dict:
    from safetensors.torch import load_file

    return dict(sorted(load_file(str(Path(ckpt) / "model.safetensors")).items()))


def update(cmd: dict) -> dict:
    import torch
    import torch.distributed as dist

    from sparrow_server.client.weight_broadcast import update_body

    tensors, name = tensors_of(cmd["ckpt"]), cmd["group_name"]
    body = {**update_body(name, tensors), **({"load_format": "flattened_bucket"} if cmd.get("flattened") else {}),
            **cmd.get("body", {})}
    post = Post(f"{cmd['url']}/update_weights_from_distributed", body) if cmd.get("post", True) else None
    stop_after = cmd.get("stop_after")

    def broadcast() -> None:
        if cmd.get("flattened"):
            flat = torch.cat([t.flatten().view(torch.uint8) for t in tensors.values()])
            dist.broadcast(flat, src=0, group=GROUPS[name])
            return
        for i, tensor in enumerate(tensors.values()):
            if i == stop_after:
                reply({"event": "stopped", "sent": i})
                threading.Event().wait()  # until killed
            dist.broadcast(tensor, src=0, group=GROUPS[name])

    sent, out = on_thread(broadcast)
    sent.wait()
    if post is not None:
        post.done.wait()
    return {"server": post.reply if post else None, "trainer": out["trainer"]}


def destroy(cmd: dict) -> dict:
    import torch.distributed as dist

    post = Post(f"{cmd['url']}/destroy_weights_update_group", {"group_name": cmd["group_name"]})
    post.done.wait()
    group = GROUPS.pop(cmd["group_name"], None)
    if group is not None:
        dist.destroy_process_group(group)
    MASTER_STORES.pop(cmd["group_name"], None)
    return {"server": post.reply, "trainer": "ok"}


def reply(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    import torch

    torch.set_num_threads(1)
    reply({"event": "ready"})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            return
        reply({"op": cmd["op"], **{"init": init, "update": update, "destroy": destroy}[cmd["op"]](cmd)})


if __name__ == "__main__":
    main()
