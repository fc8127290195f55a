"""Random weights for tiny transformers models in the layout tests: large enough that a dropped bias, norm weight
or multiplier shows (std 1.5/sqrt(fan_in), 1-D weights 1 ± 0.5, biases N(0, 0.5²))."""

from __future__ import annotations

from typing import Any

import torch


def randomise(model: Any, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif p.ndim == 1:  # norm weights away from 1
                p.copy_(1 + 0.5 * (2 * torch.rand(p.shape, generator=g) - 1))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / p.shape[-1] ** 0.5)
