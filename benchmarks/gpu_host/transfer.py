"""Ship a model file (the embedded SmolLM2 GGUF) to the GPU host in parts, one part per device call.

Each device call carries at most 64 MiB: the repo's working tree, plus the ignored folders named in
``carry``. The first call of a warm host also carries the kit's wheels (``.whl``, 45 MiB) and
``.kit``, so part 1 is small and the later parts fill what is left. On the host, each call stores
its part under ``/tmp`` (which survives while the host stays warm) and the last one reassembles the
file and checks its sha256; ``convert`` then writes the HF directory SGLang loads, with the
project's own converter (``sparrow_server.models.converted_gguf_dir``).

Here (from this worktree; ``--repo`` is the checkout whose tree the device calls send):

    python benchmarks/gpu_host/transfer.py prepare --repo /work/main

writes ``<repo>/.gpu16/code.tar.gz`` (this worktree's code: it travels beside the repo's own tree)
and ``<repo>/.model1`` ... ``.modelN`` (one part + ``MANIFEST.json`` each), and prints the plan.
On the host:

    python benchmarks/gpu_host/transfer.py store .model2 --store /tmp/sparrow-gguf
    python benchmarks/gpu_host/transfer.py assemble --store /tmp/sparrow-gguf --out /tmp/smollm2/model.gguf
    python benchmarks/gpu_host/transfer.py convert /tmp/smollm2/model.gguf --cache /tmp/sparrow-cache
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
CALL_LIMIT_BYTES = 64 * MIB          # the device tool's limit on what one call carries
DEFAULT_MARGIN_BYTES = 2 * MIB       # slack for files the repo gains before the calls run
FIRST_CALL_CARRY = (".whl", ".kit")  # only the first call of a warm host needs the kit
CODE_DIR = ".gpu16"
CODE_ARCHIVE = "code.tar.gz"
CODE_PATHS = ("pyproject.toml", "README.md", "sparrow_server", "benchmarks", "tests", "examples")  # examples: grpo_gpu.py
CODE_EXCLUDE = ("benchmarks/results", "benchmarks/distill/runs")
PART_FILE = "part.bin"
MANIFEST = "MANIFEST.json"
PART_PREFIX = ".model"
CHUNK = 4 * MIB
MANIFEST_ALLOWANCE = 4096            # bytes of a part's MANIFEST.json, at most


class TransferError(RuntimeError):
    """A part is missing, truncated or corrupt, or the plan does not fit; the message says which."""


@dataclass(frozen=True)
class PartPlan:
    index: int     # 1-based: part k travels in call k
    offset: int
    size: int


def sha256_file(path: Path, start: int = 0, size: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = size if size is not None else os.fstat(f.fileno()).st_size - start
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                raise TransferError(f"{path}: ended {left} bytes early")
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def plan_parts(total: int, capacities: list[int]) -> list[PartPlan]:
    """Cut ``total`` bytes into consecutive parts, part k at most ``capacities[k-1]`` (the last one
    repeats for later calls). The first call also carries the kit (``.whl``, ``.kit``): where that
    leaves no room, part 1 is empty, so the stages keep their numbers (call 1 installs the kit and
    stores nothing). Raises when a later capacity is not positive."""
    if not capacities or any(c <= 0 for c in capacities[1:]) or (len(capacities) == 1 and capacities[0] <= 0):
        raise TransferError(f"capacities {capacities}: every call after the first needs room for a part (carry less)")
    capacities = [max(capacities[0], 0), *capacities[1:]]
    parts, offset = [], 0
    while offset < total or not parts:
        cap = capacities[min(len(parts), len(capacities) - 1)]
        size = min(cap, total - offset)
        parts.append(PartPlan(len(parts) + 1, offset, size))
        offset += size
    return parts


def write_parts(src: Path, parts: list[PartPlan], out_root: Path) -> list[Path]:
    """``out_root/.model<k>/part.bin`` + ``MANIFEST.json`` (file name, size and sha256, part range
    and sha256) for each part; returns the folders."""
    total, whole = src.stat().st_size, sha256_file(src)
    folders = []
    with open(src, "rb") as f:
        for p in parts:
            folder = out_root / f"{PART_PREFIX}{p.index}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            f.seek(p.offset)
            data = f.read(p.size)
            (folder / PART_FILE).write_bytes(data)
            manifest = {"file": src.name, "size": total, "sha256": whole, "parts": len(parts), "index": p.index,
                        "offset": p.offset, "part_size": p.size, "part_sha256": hashlib.sha256(data).hexdigest()}
            (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            folders.append(folder)
    return folders


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise TransferError(f"{path}: missing (was the folder carried?)")
    return json.loads(path.read_text())


def store_part(folder: Path, store: Path) -> Path:
    """Check one carried part against its manifest and copy it (and the manifest) into ``store``."""
    m = _manifest(folder)
    part = folder / PART_FILE
    if not part.is_file() or part.stat().st_size != m["part_size"]:
        raise TransferError(f"{part}: expected {m['part_size']} bytes, found "
                            f"{part.stat().st_size if part.is_file() else 'no file'}")
    if sha256_file(part) != m["part_sha256"]:
        raise TransferError(f"{part}: sha256 differs from its manifest (truncated or corrupt transfer)")
    store.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(part, store / f"part{m['index']:02d}.bin")
    (store / f"part{m['index']:02d}.json").write_text(json.dumps(m))
    return store / f"part{m['index']:02d}.bin"


def assemble(store: Path, out: Path) -> Path:
    """Concatenate the stored parts into ``out`` and check the whole file's size and sha256."""
    manifests = sorted((json.loads(p.read_text()) for p in store.glob("part*.json")), key=lambda m: m["index"])
    if not manifests:
        raise TransferError(f"{store}: no stored parts (the host went cold? start again with call 1)")
    want = manifests[0]["parts"]
    have = [m["index"] for m in manifests]
    if have != list(range(1, want + 1)):
        raise TransferError(f"{store}: have parts {have}, need 1..{want} (the host went cold? start again with call 1)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "wb") as f:
        for m in manifests:
            with open(store / f"part{m['index']:02d}.bin", "rb") as part:
                shutil.copyfileobj(part, f, CHUNK)
    size, digest = tmp.stat().st_size, sha256_file(tmp)
    if size != manifests[0]["size"] or digest != manifests[0]["sha256"]:
        raise TransferError(f"{tmp}: {size} bytes, sha256 {digest}; expected {manifests[0]['size']} bytes, "
                            f"sha256 {manifests[0]['sha256']}")
    os.replace(tmp, out)
    return out


def convert(gguf: Path, cache: Path) -> Path:
    """The project's converter (dequantise once, save an HF directory) with its cache under ``cache``.
    SGLang 0.5.17's Llama reads transformers 5's ``rope_parameters`` (theta 1e5 here) as is."""
    os.environ["SPARROW_CACHE_DIR"] = str(cache)
    from sparrow_server.models import converted_gguf_dir

    return converted_gguf_dir(gguf)


def tree_bytes(repo: Path) -> int:
    """Bytes of what a device call always sends: tracked + untracked-not-ignored files, and ``shared/``."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    files = {repo / name for name in out.decode().split("\0") if name}
    if (repo / "shared").is_dir():
        files |= {p for p in (repo / "shared").rglob("*") if p.is_file()}
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def dir_bytes(path: Path) -> int:
    if not path.exists():
        raise TransferError(f"{path}: missing (it must travel in the first call)")
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def pack_code(src: Path, dest_dir: Path) -> Path:
    """``dest_dir/code.tar.gz``: this worktree's committed code (HEAD), without results folders."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / CODE_ARCHIVE
    paths = [*CODE_PATHS, *(f":(exclude){p}" for p in CODE_EXCLUDE)]
    subprocess.run(["git", "-C", str(src), "archive", "--format=tar.gz", "-o", str(out.resolve()), "HEAD", "--", *paths],
                   check=True)
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (dest_dir / "HEAD").write_text(head + "\n")
    return out


def prepare(repo: Path, gguf: Path, code_src: Path, margin: int) -> dict:
    for old in repo.glob(f"{PART_PREFIX}*"):
        if old.is_dir() and old.name[len(PART_PREFIX):].isdigit():
            shutil.rmtree(old)
    pack_code(code_src, repo / CODE_DIR)
    tree, code = tree_bytes(repo), dir_bytes(repo / CODE_DIR)
    kit = sum(dir_bytes(repo / name) for name in FIRST_CALL_CARRY)
    every_call = tree + code + margin + MANIFEST_ALLOWANCE
    capacities = [CALL_LIMIT_BYTES - every_call - kit, CALL_LIMIT_BYTES - every_call]
    parts = plan_parts(gguf.stat().st_size, capacities)
    write_parts(gguf, parts, repo)
    calls = []
    for p in parts:
        carry = [*(FIRST_CALL_CARRY if p.index == 1 else ()), CODE_DIR, f"{PART_PREFIX}{p.index}"]
        size = tree + sum(dir_bytes(repo / name) for name in carry)
        calls.append({"call": p.index, "carry": carry, "part_bytes": p.size, "call_bytes": size,
                      "call_mib": round(size / MIB, 2)})
        if size + margin > CALL_LIMIT_BYTES:  # the device refuses the call: say so here, not there
            raise TransferError(
                f"call {p.index} would send {size / MIB:.2f} MiB (tree {tree / MIB:.2f} MiB + {', '.join(carry)}), over "
                f"{CALL_LIMIT_BYTES / MIB:.0f} MiB less the {margin / MIB:.2f} MiB margin: move tracked results the calls "
                f"do not read out of the checkout for them (e.g. mv benchmarks/results /tmp/results-aside; "
                f"git checkout -- benchmarks/results after)")
    return {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "tree_bytes": tree, "code_bytes": code,
            "kit_bytes": kit, "margin_bytes": margin, "limit_bytes": CALL_LIMIT_BYTES, "calls": calls}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="pack the code and split the GGUF into <repo>/.model<k>")
    p.add_argument("--repo", type=Path, required=True, help="the checkout whose tree the device calls send")
    p.add_argument("--gguf", type=Path, default=None, help="default: the embedded SmolLM2 GGUF")
    p.add_argument("--code-from", type=Path, default=Path(__file__).resolve().parents[2])
    p.add_argument("--margin-mib", type=float, default=DEFAULT_MARGIN_BYTES / MIB)
    s = sub.add_parser("store", help="check a carried part and keep it under --store")
    s.add_argument("folder", type=Path)
    s.add_argument("--store", type=Path, required=True)
    a = sub.add_parser("assemble", help="concatenate the stored parts and check the sha256")
    a.add_argument("--store", type=Path, required=True)
    a.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("convert", help="GGUF -> HF directory (the project's converter); prints the directory")
    c.add_argument("gguf", type=Path)
    c.add_argument("--cache", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "prepare":
            if args.gguf is None:
                from sparrow_server.models import embedded_gguf_path
                args.gguf = embedded_gguf_path()
            print(json.dumps(prepare(args.repo, args.gguf, args.code_from, int(args.margin_mib * MIB)), indent=1))
        elif args.cmd == "store":
            print(store_part(args.folder, args.store))
        elif args.cmd == "assemble":
            print(assemble(args.store, args.out))
        else:
            print(convert(args.gguf, args.cache))
    except TransferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
