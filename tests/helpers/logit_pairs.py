"""Sparse/dense logit pairs for the acceptance tests: the dense rows random, the sparse ones the dense
plus Gaussian noise (float64, seeded)."""
from __future__ import annotations

import torch


def logit_pair(t: int = 24, v: int = 300, seed: int = 0, noise: float = 0.7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(t, v, generator=g, dtype=torch.float64) * 3
    sparse = dense + noise * torch.randn(t, v, generator=g, dtype=torch.float64)
    return sparse, dense
