"""The tensors the weight-update benchmarks send (``benchmarks/weight_update_timing.py``): a Qwen3 config's
Hugging Face names and shapes, seeded random bf16 values drawn on a device, slime's and verl's bucketing, and
a checkpoint saved the way ``save_pretrained`` lays it out. torch and safetensors are imported on use."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import sglang_server as S
from sparrow_server.client.weight_broadcast import plan_buckets as buckets  # slime's and verl's rule

HF_SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained max_shard_size "5GB"


def param_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The HF checkpoint's (name, shape) list of a Qwen3 config, in HF state-dict order (checked on CPU
    against ``AutoModelForCausalLM.from_config`` on the meta device)."""
    hs, inter, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], hs))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (q, hs)), (p + "self_attn.k_proj.weight", (kv, hs)),
                (p + "self_attn.v_proj.weight", (kv, hs)), (p + "self_attn.o_proj.weight", (hs, q)),
                (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                (p + "mlp.gate_proj.weight", (inter, hs)), (p + "mlp.up_proj.weight", (inter, hs)),
                (p + "mlp.down_proj.weight", (hs, inter)), (p + "input_layernorm.weight", (hs,)),
                (p + "post_attention_layernorm.weight", (hs,))]
    out.append(("model.norm.weight", (hs,)))
    if not cfg.get("tie_word_embeddings"):  # tied: the head is the embedding, and SGLang has no lm_head param
        out.append(("lm_head.weight", (cfg["vocab_size"], hs)))
    return out


def make_tensors(shapes, seed: int, device: str) -> dict:
    """bf16 weights drawn in order from one seeded generator (the same values in every process on the same
    torch build): projections ~ N(0, 0.02), norms ~ 1 + N(0, 0.02), so the model still decodes sensibly."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in shapes:
        t = torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16) * 0.02
        out[name] = t + 1 if len(shape) == 1 else t
    return out


def nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def digest(tensors: dict) -> str:
    """Bit-level fingerprint (sum of the int16 bit patterns per tensor) to show two processes drew the same
    tensors without copying 3.4 GB to the host."""
    import torch

    sums = [int(t.view(torch.int16).sum(dtype=torch.int64)) for t in tensors.values()]
    return hashlib.sha256(json.dumps([list(tensors), sums]).encode()).hexdigest()


def save_checkpoint(tensors: dict, cfg: dict, model_dir: Path, shard_bytes: int = HF_SHARD_BYTES) -> dict:
    """config.json + safetensors shards (+ index when more than one), HF's layout; returns the seconds
    (device-to-host copy included) and the file names."""
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    host = {n: t.cpu() for n, t in tensors.items()}
    d2h = time.perf_counter() - t0
    S.write_config(model_dir, cfg)
    shards = buckets([(n, t.numel() * t.element_size()) for n, t in host.items()], shard_bytes)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for fname, names in zip(files, shards):
        save_file({n: host[n] for n in names}, str(model_dir / fname), metadata={"format": "pt"})
    if len(shards) > 1:
        index = {"metadata": {"total_size": nbytes(host)},
                 "weight_map": {n: f for f, names in zip(files, shards) for n in names}}
        (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return {"save_s": round(time.perf_counter() - t0, 3), "d2h_s": round(d2h, 3), "files": files}
