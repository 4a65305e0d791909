"""The skeleton the GPU-host run scripts (``live_tail.py``, ``served_adapter.py``, ``distill_gpu.py``,
``grpo_gpu.py``) share: the run clock and its ``[script +Ns]`` log lines, the command line (the parser from the
module's docstring, a flag per ``RunConfig`` field, the converted model's directory, a ``RunConfig`` error named
by its flag), the ``sparrow-server serve`` command and a fixed-budget schedule, and the main that runs and then,
whatever happened, packs what a device call brings back.

Standard library only at import time (``smollm2`` and the product's schedule are imported where used): the
scripts' ``--help`` must stay fast."""
from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable, NoReturn, Sequence


class Clock:
    """Seconds since the run started."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def logger(script: str) -> Callable[[Any, str], None]:
    """``log(clock, msg)``: prints ``[<script> +<elapsed>s] msg`` (``clock``: anything with ``elapsed()``)."""

    def log(clock: Any, msg: str) -> None:
        print(f"[{script} +{clock.elapsed():.0f}s] {msg}", flush=True)

    return log


def fixed_schedule(name: str, budget: int, description: str, bin_tokens: int | None = None) -> Any:
    """A fixed ``budget`` (tokens) with the library's defaults otherwise (page 16, 1 sink, 2 recent, layers 0-1
    dense); ``bin_tokens``: the monitor's bins (None: the library's)."""
    from sparrow_server.sparsity.schedule import schedule_from_dict

    spec: dict[str, Any] = {"name": name, "budgets_tokens": [budget]}
    if bin_tokens is not None:
        spec["bin_tokens"] = bin_tokens
    return schedule_from_dict({**spec, "description": description})


def serve_command(config: Any, port: int, state_dir: Path) -> list[str]:
    """``sparrow-server serve`` on ``config.model_dir`` with ``config.engine``, on 127.0.0.1:``port``."""
    return [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", config.engine, "--model",
            str(config.model_dir), "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir)]


def engine_args(config: Any) -> list[str]:
    """What follows the serve command: the CPU dry run's reference engine (pool for ``total_tokens`` x
    ``concurrency``), or SmolLM2's study settings (``smollm2.py``) with CUDA graphs up to ``cuda_graph_max_bs``."""
    if config.engine == "reference":
        return ["--device", config.device, "--threads", "1", "--kv-pool-tokens", str(config.total_tokens * config.concurrency)]
    import smollm2

    args = list(smollm2.SERVER_ARGS)
    args[args.index("--cuda-graph-max-bs") + 1] = str(config.cuda_graph_max_bs)
    return ["--", *args]


def doc_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first paragraph, the rest as its epilog."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=doc.split("\n\n", 1)[1])


def add_model_dir(parser: argparse.ArgumentParser) -> None:
    from smollm2 import MODEL_DIR_FILE

    parser.add_argument("--model-dir", type=Path, default=None, help=f"converted SmolLM2 (default: the path in {MODEL_DIR_FILE})")


def add_field_flags(parser: argparse.ArgumentParser, defaults: Any, skip: Iterable[str]) -> None:
    """``--name`` for every field of ``defaults``' dataclass not in ``skip``, typed and defaulted by its value."""
    skip = set(skip)
    for f in fields(defaults):
        if f.name not in skip:
            value = getattr(defaults, f.name)
            parser.add_argument("--" + f.name.replace("_", "-"), type=type(value), default=value)


def model_dir_or_error(parser: argparse.ArgumentParser, given: Path | None) -> Path:
    """``--model-dir``, else the path ``host.sh`` stage 3 left; a parser error unless it holds a config.json."""
    from smollm2 import default_model_dir

    model_dir = given or default_model_dir()
    if model_dir is None or not (model_dir / "config.json").is_file():
        parser.error(f"--model-dir {model_dir}: no config.json there (run host.sh stages 1-3 first, or pass the converted dir)")
    return model_dir


def flag_error(parser: argparse.ArgumentParser, exc: ValueError) -> NoReturn:
    """A ``RunConfig`` error (``name = value: why``) as a parser error on its flag: ``--name: name = value: why``."""
    parser.error(f"--{str(exc).split(' ', 1)[0].replace('_', '-')}: {exc}")


def config_from_args(parser: argparse.ArgumentParser, config_type: Callable[..., Any], args: argparse.Namespace,
                     model_dir: Path) -> Any:
    """``config_type`` from every parsed flag (``model_dir`` resolved), its ValueError a parser error on the flag."""
    try:
        return config_type(**{**vars(args), "model_dir": model_dir})
    except ValueError as exc:
        flag_error(parser, exc)


def run_and_pack(config: Any, run: Callable[[], Any], pack: Callable[[Path, Path], Any]) -> Any:
    """Makes ``config.out``, returns ``run()``; ``pack(out, config.pack)`` afterwards even when it raised."""
    config.out.mkdir(parents=True, exist_ok=True)
    try:
        return run()
    finally:
        if config.pack is not None:
            pack(config.out, config.pack)


def pack_outputs(work: Path, dest: Path, files: Sequence[str], in_tar: Sequence[str], tar_name: str) -> list[Path]:
    """Copies ``files`` (those there) from ``work`` into ``dest`` and puts what ``in_tar``'s patterns match (paths
    relative to ``work``) into ``dest/tar_name`` (xz): what a device call brings back."""
    dest.mkdir(parents=True, exist_ok=True)
    out = [Path(shutil.copy(work / name, dest / name)) for name in files if (work / name).is_file()]
    with tarfile.open(dest / tar_name, "w:xz") as tar:
        for pattern in in_tar:
            for path in sorted(work.glob(pattern)):
                tar.add(path, arcname=str(path.relative_to(work)))
    return [*out, dest / tar_name]
