"""Loopback soak test: concurrent clients with random disconnects, mixed schedules and endpoints,
and hostile bodies, against a real ``serve`` subprocess (reference engine, tiny random model).

    python benchmarks/soak/soak.py --clients 16 --duration-s 300 --out benchmarks/results/soak

Each client loops for the duration, picking a probe (prompt, schedule, seed, endpoint) at random:
- with probability ``--drop`` it reads 1-4 events and drops the connection;
- otherwise it reads the whole stream, which must end with its ``max_new_tokens`` tokens, no error,
  and exactly the tokens that probe produced when it ran alone before the soak (batching with
  anything else, dropped neighbours included, must not change them);
- every 10th request is hostile (NaN, a 65-bit seed, booleans as ids, a lone surrogate, a tiny
  temperature) and must get its 422 (or, for the tiny temperature, a normal greedy answer: 200).
At the end the engine must settle: no live request, every KV page free, admission gauges at 0,
file descriptors back to the start. Exit status 1 when any check failed. Bounded: loopback only,
``--duration-s`` of load plus a settle bound.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "load"))
from loadgen import Server, rss_mib, save_tiny_model  # noqa: E402

SCHEDULES = {
    "soak-a": {"budgets_tokens": [64, 96], "bin_tokens": 64, "dense_layers": [0]},
    "soak-b": {"budgets_tokens": [80], "length_basis": "generated", "dense_layers": [0, 3]},
}
PROBES = 24
NEW_TOKENS = 48
SETTLE_BOUND_S = 10.0
HOSTILE = [
    ('{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}', 422),
    ('{"input_ids": [1, 2], "sampling_params": {"seed": 36893488147419103232}}', 422),
    ('{"input_ids": [true, 2]}', 422),
    ('{"input_ids": [1, 2], "rid": "\\ud800"}', 422),
    ('{"input_ids": [1, 2], "sampling_params": {"top_k": 1e30}}', 422),
    ('{"input_ids": [1, 2], "sampling_params": {"temperature": 1e-30, "max_new_tokens": 4}}', 200),  # greedy
]


@dataclass
class Probe:
    prompt: list[int]
    schedule: str
    seed: int
    endpoint: str
    expected: list[int] = field(default_factory=list)

    def body(self) -> dict:
        sampling = {"max_new_tokens": NEW_TOKENS, "temperature": 0.9, "seed": self.seed, "ignore_eos": True}
        if self.endpoint == "/rollout":
            return {"input_ids": self.prompt, "stream": True, "schedule": self.schedule, "sampling_params": sampling}
        return {"input_ids": self.prompt, "stream": True, "extra_key": f"sparrow_schedule={self.schedule}",
                "sampling_params": sampling}


@dataclass
class Tally:
    started: int = 0
    generations: int = 0  # requests that reached the engine (each must be counted once in requests_total)
    completed: int = 0
    exact: int = 0
    mismatched: int = 0
    dropped: int = 0
    hostile: int = 0
    hostile_refused: int = 0
    server_errors: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.failures) < 10:
            self.failures.append(what[:300])


def tokens_of(endpoint: str, events: list[dict]) -> tuple[list[int], dict]:
    if endpoint == "/rollout":
        return [t for e in events for t in e.get("token_ids", ())], events[-1]
    return list(events[-1].get("output_ids", ())), events[-1]


async def stream(client: httpx.AsyncClient, probe: Probe, drop_after: int | None) -> tuple[int, list[dict]]:
    events: list[dict] = []
    async with client.stream("POST", probe.endpoint, json=probe.body()) as response:
        if response.status_code != 200:
            return response.status_code, [{"body": (await response.aread()).decode(errors="replace")}]
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
                if drop_after is not None and len(events) >= drop_after:
                    return 200, events  # leaving the block drops the connection mid-stream
    return 200, events


async def one(client: httpx.AsyncClient, rng: random.Random, probes: list[Probe], drop: float, tally: Tally) -> None:
    tally.started += 1
    if tally.started % 10 == 0:
        body, status = rng.choice(HOSTILE)
        tally.hostile += 1
        r = await client.post("/rollout", content=body.encode(), headers={"content-type": "application/json"})
        tally.generations += r.status_code == 200
        if r.status_code == status:
            tally.hostile_refused += 1
        else:
            tally.fail(f"hostile {body} -> {r.status_code} {r.text[:100]}")
        return
    probe = rng.choice(probes)
    tally.generations += 1
    drop_after = rng.randint(1, 4) if rng.random() < drop else None
    status, events = await stream(client, probe, drop_after)
    if status >= 500:
        tally.server_errors += 1
    if status != 200:
        tally.fail(f"{probe.endpoint} -> HTTP {status}: {events}")
        return
    if drop_after is not None:
        tally.dropped += 1
        return
    tokens, last = tokens_of(probe.endpoint, events)
    if "error" in last or not (last.get("done") or last.get("meta_info", {}).get("finish_reason")):
        tally.fail(f"{probe.endpoint}: bad final event {str(last)[:200]}")
        return
    tally.completed += 1
    if tokens == probe.expected:
        tally.exact += 1
    else:
        tally.mismatched += 1
        tally.fail(f"{probe.endpoint} {probe.schedule} seed {probe.seed}: tokens differ from the probe's alone run")


async def expected_tokens(client: httpx.AsyncClient, probe: Probe) -> list[int]:
    status, events = await stream(client, probe, None)
    assert status == 200, events
    return tokens_of(probe.endpoint, events)[0]


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))


async def soak(url: str, pid: int, clients: int, duration_s: float, drop: float, seed: int) -> dict:
    rng = random.Random(seed)
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as admin:
        for name, body in SCHEDULES.items():
            (await admin.put(f"/schedules/{name}", json=body)).raise_for_status()
        probes = [Probe([rng.randrange(1, 127) for _ in range(rng.randint(20, 120))],
                        rng.choice(["dense", *SCHEDULES]), rng.randrange(1 << 32), rng.choice(["/rollout", "/generate"]))
                  for _ in range(PROBES)]
        for probe in probes:  # alone, before any load
            probe.expected = await expected_tokens(admin, probe)
        fds_start, rss_start = fds(pid), rss_mib(pid)
        tally = Tally(generations=len(probes))  # the probes' alone runs
        stop_at = time.monotonic() + duration_s

        async def worker(i: int) -> None:
            worker_rng = random.Random(seed * 1000 + i)
            async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
                while time.monotonic() < stop_at:
                    try:
                        await one(client, worker_rng, probes, drop, tally)
                    except httpx.HTTPError as exc:
                        tally.fail(f"transport: {type(exc).__name__}: {exc}")

        started = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        load_s = time.monotonic() - started
        left = time.monotonic()
        settled_s = None
        while time.monotonic() - left < SETTLE_BOUND_S:
            health = (await admin.get("/health")).json()
            if health["live_requests"] == 0 and health["free_pages"] == health["total_pages"]:
                settled_s = time.monotonic() - left
                break
            await asyncio.sleep(0.05)
        health = (await admin.get("/health")).json()
        metrics = (await admin.get("/metrics")).text
    await asyncio.sleep(1.0)  # the admin connection's socket closes
    return {
        "clients": clients, "load_s": round(load_s, 1), "drop_probability": drop, "probes": PROBES,
        "max_new_tokens": NEW_TOKENS, "schedules": ["dense", *SCHEDULES], **asdict(tally),
        "settled_s": None if settled_s is None else round(settled_s, 3), "settle_bound_s": SETTLE_BOUND_S,
        "live_requests_after": health["live_requests"], "free_pages_after": health["free_pages"],
        "total_pages": health["total_pages"],
        "admitted_streams_after": metric(metrics, "sparrow_admitted_streams"),
        "adapter_inflight_after": metric(metrics, "sparrow_adapter_inflight_requests"),
        "requests_total": metric(metrics, "sparrow_requests_total"),
        "fds_start": fds_start, "fds_end": fds(pid), "rss_start_mib": round(rss_start, 1),
        "rss_end_mib": round(rss_mib(pid), 1),
    }


def passed(r: dict) -> bool:
    return (r["mismatched"] == 0 and r["server_errors"] == 0 and not r["failures"] and r["settled_s"] is not None
            and r["admitted_streams_after"] == 0 and r["adapter_inflight_after"] == 0
            and r["hostile_refused"] == r["hostile"] and r["fds_end"] <= r["fds_start"] and r["completed"] > 0
            and r["dropped"] > 0 and r["requests_total"] == r["generations"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration-s", type=float, default=300.0)
    ap.add_argument("--drop", type=float, default=0.3, help="probability that a request drops its stream")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write OUT.json (path without suffix)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        server = Server(save_tiny_model(workdir / "model"), workdir, "--max-batch-size", str(args.clients))
        try:
            result = asyncio.run(soak(server.url, server.proc.pid, args.clients, args.duration_s, args.drop, args.seed))
        finally:
            server.stop()
    result["passed"] = passed(result)
    result["command"] = "python benchmarks/soak/soak.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["server_command"] = server.command
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.with_suffix(".json").write_text(text + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
