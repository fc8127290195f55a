"""d2l's masked softmax, transcribed from "Dive into Deep Learning" (10.3, as quoted in the notes
in ../shared/seeds): the independent reference the tests compare valid-length masking with."""

from __future__ import annotations

import torch


def sequence_mask(X: torch.Tensor, valid_len: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """d2l's sequence_mask: entries at or after each row's valid length become ``value``."""
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """d2l's masked_softmax: masked scores are set to -1e6 before the softmax over the last axis.
    (d2l writes into X in place; this works on a copy so callers' tensors stay as they were.)"""
    if valid_lens is None:
        return torch.nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask(X.reshape(-1, shape[-1]).clone(), valid_lens, value=-1e6)
    return torch.nn.functional.softmax(X.reshape(shape), dim=-1)
