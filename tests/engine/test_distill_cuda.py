"""DistillSparse runs on CUDA (marker ``gpu``; skipped without one): on a tiny random Llama, the dense targets,
the sparse loss and the held-out scoring on the GPU equal the CPU's (float32; the CPU is the reference), one
``train_lora`` run on cuda trains only LoRA parameters that live on the GPU and lowers the k3 loss, and a
bfloat16 base keeps float32 LoRA weights (peft's ``autocast_adapter_dtype``) and trains."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.tiny_models import TINY_VOCAB, tiny_model
from sparrow_server.distill import DistillConfig, Rollout, train_lora
from sparrow_server.distill.evaluate import Arm, score_arms
from sparrow_server.distill.train import dense_target, sequence_loss, wrap_with_lora
from sparrow_server.sparsity.schedule import Schedule

pytestmark = pytest.mark.gpu

TIGHT = Schedule(name="tight", budgets_tokens=(64,), page_size=16, dense_layers=(0,))
PROMPT_LEN = 96


def _rollouts(n: int, length: int = 160) -> list[Rollout]:
    g = torch.Generator().manual_seed(0)
    return [Rollout(tuple(torch.randint(0, TINY_VOCAB, (length,), generator=g).tolist()), PROMPT_LEN) for _ in range(n)]


def test_targets_loss_and_scoring_on_cuda_equal_the_cpu():
    rollout = _rollouts(1)[0]
    config = DistillConfig(loss="k3")
    cpu, gpu = wrap_with_lora(tiny_model(), config), wrap_with_lora(tiny_model(), config).to("cuda")
    t_cpu, t_gpu = dense_target(cpu, rollout, config), dense_target(gpu, rollout, config)
    assert t_gpu.logprob.device.type == "cuda"
    torch.testing.assert_close(t_gpu.logprob.cpu(), t_cpu.logprob, rtol=1e-4, atol=1e-4)
    loss_gpu = sequence_loss(gpu, rollout, t_gpu, TIGHT, config)
    torch.testing.assert_close(loss_gpu.detach().cpu(), sequence_loss(cpu, rollout, t_cpu, TIGHT, config).detach(),
                               rtol=1e-3, atol=1e-4)
    arms = [Arm("tight", TIGHT), Arm("adapted", TIGHT, "default")]
    on_gpu, on_cpu = score_arms(gpu, [rollout], arms, 1.0), score_arms(cpu, [rollout], arms, 1.0)
    for name in ("tight", "adapted"):
        assert np.allclose(on_gpu[name][0], on_cpu[name][0], atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_train_lora_on_cuda(dtype):
    base = tiny_model().to(device="cuda", dtype=dtype)
    config = DistillConfig(rank=4, steps=12, batch=2, lr=1e-3, seed=0)
    model, report = train_lora(base, _rollouts(4), TIGHT, config, heldout=[])
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.device.type == "cuda" and p.dtype == torch.float32 for p in trainable)
    assert report.steps == 12 and all(np.isfinite(report.loss_curve))
    assert sum(report.loss_curve[-3:]) < sum(report.loss_curve[:3])
