"""Launch and query an SGLang HTTP server for the GPU tests and benchmarks (standard library only,
plus torch/safetensors for the tiny random checkpoint).

- ``qwen3_config(size)``: Qwen3 1.7B / 4B / 8B architecture configs (served with ``--load-format dummy``).
- ``write_tiny_checkpoint(dir)``: a small random Qwen3 with real (seeded, std 0.02) weights, so greedy
  decoding has clear margins; same head shapes as Qwen3-1.7B (8 KV heads, G = 2, D = 128).
- ``Server``: start ``python -m sglang.launch_server`` (own process group), wait for /health, stop.
- ``generate``: one batched /generate call with input ids.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from sparrow_server.commands.demo import free_port  # noqa: F401  (the OS's choice of port; decode_profile.py)

QWEN3_BASE = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000, "rope_scaling": None,
    "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16", "dtype": "bfloat16", "hidden_act": "silu",
    "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "sliding_window": None,
    "use_sliding_window": False, "use_cache": True, "bos_token_id": 151643, "eos_token_id": 151645,
}
QWEN3_SIZES = {
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=False),
}
TINY = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=16,
            tie_word_embeddings=True, vocab_size=4096)


def qwen3_config(size: str) -> dict:
    if size not in QWEN3_SIZES:
        raise ValueError(f"size={size!r}: must be one of {sorted(QWEN3_SIZES)}")
    cfg = dict(QWEN3_BASE, **QWEN3_SIZES[size])
    cfg["max_window_layers"] = cfg["num_hidden_layers"]
    return cfg


def write_config(model_dir: str | Path, cfg: dict) -> Path:
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    return model_dir


def write_tiny_checkpoint(model_dir: str | Path, seed: int = 0, lm_head_std: float | None = None,
                          attn_scale: float = 1.0, query_heads: int | None = None) -> Path:
    """A 6-layer random Qwen3 (vocab 4096) saved as safetensors; returns its directory.

    ``query_heads``: query heads over the 8 KV heads (default 16, a GQA group of 2 as in Qwen3-1.7B; 32
    gives Qwen3-4B's and 8B's group of 4, where SGLang decodes on FlashInfer's tensor-core kernel).

    ``lm_head_std``: an untied output layer with this weight scale (0.5 gives logits of std ~11,
    so next-token distributions are peaked and a top-20 list holds nearly all the mass, as in
    a trained model); ``None``: tied embeddings, flat distributions.
    ``attn_scale``: the q-norm weight (1 = Qwen3's initial value). Qwen3 normalises queries and keys,
    so attention logits have std ~``attn_scale``: at 1 attention over a long random prompt is nearly
    uniform, the context barely reaches the output and greedy decoding repeats one token whatever
    pages are attended; at 2 a few keys dominate, the output depends on which pages are attended
    (a 512-token budget moves the chosen tokens' logprobs by ~0.2 nats median) and greedy outputs
    vary (9-14 distinct tokens in 48), measured on CPU in float32
    (``benchmarks/gpu_host/tiny_model_probe.py``, benchmarks/results/gpu_suite/cpu_probe.log)."""
    import torch
    from safetensors.torch import save_file

    cfg = dict(QWEN3_BASE, **TINY)
    cfg["max_window_layers"] = cfg["num_hidden_layers"]
    if query_heads is not None:
        cfg["num_attention_heads"] = query_heads
    if lm_head_std is not None:
        cfg["tie_word_embeddings"] = False
    model_dir = write_config(model_dir, cfg)
    g = torch.Generator().manual_seed(seed)
    hs, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    rnd = lambda *shape: (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
    ones = lambda n, scale=1.0: torch.full((n,), scale, dtype=torch.bfloat16)
    w = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], hs), "model.norm.weight": ones(hs)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({
            p + "input_layernorm.weight": ones(hs), p + "post_attention_layernorm.weight": ones(hs),
            p + "self_attn.q_proj.weight": rnd(nq * hd, hs), p + "self_attn.k_proj.weight": rnd(nkv * hd, hs),
            p + "self_attn.v_proj.weight": rnd(nkv * hd, hs), p + "self_attn.o_proj.weight": rnd(hs, nq * hd),
            p + "self_attn.q_norm.weight": ones(hd, attn_scale), p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": rnd(inter, hs), p + "mlp.up_proj.weight": rnd(inter, hs),
            p + "mlp.down_proj.weight": rnd(hs, inter),
        })
    if lm_head_std is not None:
        w["lm_head.weight"] = (torch.randn(cfg["vocab_size"], hs, generator=g) * lm_head_std).to(torch.bfloat16)
    save_file(w, str(model_dir / "model.safetensors"))
    return model_dir


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_lora_adapter(adapter_dir: str | Path, model_dir: str | Path, seed: int, rank: int = 8,
                       std: float = 0.05) -> Path:
    """A random PEFT LoRA (q/k/v/o, both A and B non-zero) for the tiny checkpoint."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hs, hd, nq, nkv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dims = {"q_proj": (hs, nq * hd), "k_proj": (hs, nkv * hd), "v_proj": (hs, nkv * hd), "o_proj": (nq * hd, hs)}
    g = torch.Generator().manual_seed(seed)
    w = {}
    for i in range(cfg["num_hidden_layers"]):
        for m in LORA_TARGETS:
            fan_in, fan_out = dims[m]
            p = f"base_model.model.model.layers.{i}.self_attn.{m}."
            w[p + "lora_A.weight"] = (torch.randn(rank, fan_in, generator=g) * std).to(torch.bfloat16)
            w[p + "lora_B.weight"] = (torch.randn(fan_out, rank, generator=g) * std).to(torch.bfloat16)
    adapter_dir = Path(adapter_dir)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    save_file(w, str(adapter_dir / "adapter_model.safetensors"))
    (adapter_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(LORA_TARGETS), "bias": "none", "base_model_name_or_path": str(model_dir),
        "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False}, indent=1))
    return adapter_dir


def port_in_use(port: int) -> bool:
    """Whether a process listens on ``port`` (SO_REUSEADDR: a stopped server's connections in TIME_WAIT do not
    count, as they do not stop the next server from binding it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _names_model(served: str, model_dir: str) -> bool:
    """Whether a ``/model_info`` ``model_path`` names ``model_dir``: SGLang answers the path it was given, the
    reference engine (``sparrow-server serve --engine reference``) the model's name: its folder's, or a GGUF file's
    stem (``sparrow_server.models.load_model``)."""
    if os.path.isabs(served):
        return os.path.realpath(served) == os.path.realpath(model_dir)
    name = os.path.basename(os.path.normpath(model_dir))
    return served in (model_dir, name, os.path.splitext(name)[0])


_LIVE: set["Server"] = set()  # servers this process started and has not stopped


def stop_servers_on_sigterm() -> None:
    """On SIGTERM (``timeout``'s), stop every server this process started, then exit 143. A server runs in a session
    of its own, so without this it outlives its benchmark and holds its card and port: call 40, 3's timed-out
    benchmark left one whose port failed the next run on that card. ``Server.start`` calls it from the main thread;
    a benchmark whose servers start in threads calls it once first."""
    def stop_all(signum, frame):
        for srv in list(_LIVE):
            srv.stop()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop_all)


class Server:
    """``python -m sglang.launch_server`` (or ``sparrow-server serve --engine sglang`` with ``sparrow``)
    in its own process group, logging to ``log_path``."""

    def __init__(self, model_dir, args: list[str], log_path, port: int = 30000, env: dict | None = None,
                 sparrow: bool = False):
        self.port = port
        self.model_dir = str(model_dir)
        self.log_path = Path(log_path)
        if sparrow:  # `sparrow-server serve --engine sglang`: SGLang's server with the sparrow app mounted
            self.cmd = [sys.executable, "-m", "sparrow_server.cli", "serve", "--engine", "sglang",
                        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                        "--skip-tokenizer-init", *args]
        else:
            self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
                        "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init", *args]
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 400) -> float:
        """Start and wait for /health; returns seconds to healthy. Raises with the log tail on failure, and at once
        if the port is taken: another process's server would answer this one's /health (call 25: two profiles on
        one port, one benchmarking the other's server)."""
        if port_in_use(self.port):
            raise RuntimeError(f"port {self.port} is in use: another server would answer this server's /health")
        if threading.current_thread() is threading.main_thread():
            stop_servers_on_sigterm()
        t0 = time.time()
        log = open(self.log_path, "a")
        log.write("$ " + " ".join(self.cmd) + "\n")
        log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        _LIVE.add(self)
        while time.time() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                urllib.request.urlopen(self.base + "/health", timeout=3)
            except Exception:
                time.sleep(2)
                continue
            if self.proc.poll() is not None:  # healthy, but not this process: it died (a port taken meanwhile)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            self.refuse_another_servers_answer()
            return time.time() - t0
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.tail()}")

    def refuse_another_servers_answer(self) -> None:
        """Raise (and stop this server) where the port's ``/model_info`` names another model: two servers started at
        once on one port both pass the free-port check, and the first to bind answers the other's /health while the
        other still loads (call 49, 2: two benchmarks' servers on port 30100, both clients' requests on one of them).
        A server without the route is taken at its word."""
        try:
            with urllib.request.urlopen(self.base + "/model_info", timeout=10) as resp:
                served = json.loads(resp.read()).get("model_path")
        except Exception:
            return
        if served is not None and not _names_model(served, self.model_dir):
            self.stop()
            raise RuntimeError(f"port {self.port} is answered by another server (model_path {served!r}, "
                               f"not {self.model_dir!r})")

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def stop(self) -> None:
        _LIVE.discard(self)
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except Exception:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def generate(base: str, input_ids: list[list[int]], max_new_tokens: int, schedule: str | list | None = None,
             temperature: float = 0.0, ignore_eos: bool = True, timeout: float = 900,
             return_logprob: bool = False, top_logprobs_num: int = 0) -> list[dict]:
    """One batched /generate call; ``schedule`` (one name or one per prompt) goes in custom_params."""
    schedules = schedule if isinstance(schedule, list) else [schedule] * len(input_ids)
    params = []
    for s in schedules:
        sp = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": ignore_eos}
        if s is not None:
            sp["custom_params"] = {"sparrow_schedule": s}
        params.append(sp)
    payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": return_logprob}
    if top_logprobs_num:
        payload["top_logprobs_num"] = top_logprobs_num
    req = urllib.request.Request(base + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return out if isinstance(out, list) else [out]
