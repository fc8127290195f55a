"""Heads and positions checked against the problem's shapes, ALiBi's slopes and T5's position bias.

One-line InputErrors that name the option: K/V heads that do not divide the query heads, RoPE
widths, sinks of the wrong length, a positional variant with a score for which positions mean
nothing. Below the Problem and the projections (which check with them) and the stages (which
compute with the slopes).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core.alibi import paper_slopes as alibi_slopes  # noqa: F401  (Press et al.'s, re-exported)
from attncli.core.options import check_rope_mode
from attncli.errors import InputError

POSITION_SCORES = {
    "rope": ("dot", "scaled-dot", "cosine", "gaussian"),
    "alibi": ("dot", "scaled-dot", "general", "additive", "cosine", "gaussian"),
}


def check_kv_heads(q_heads: int, kv_heads: int, source: str = "--kv-heads") -> int:
    """The group size r = H_q / H_kv, or an InputError when H_kv does not divide H_q."""
    if kv_heads < 1 or q_heads < 1 or q_heads % kv_heads:
        raise InputError(f"{kv_heads} K/V heads do not divide {q_heads} query heads; grouped-query attention "
                         f"needs a divisor of {q_heads} (query head h reads K/V head h // (H_q / H_kv))", source)
    return q_heads // kv_heads


def check_rope(head_dim: int, rotary_dim: int | None, mode: str, source: str = "--rotary-dim",
               mode_source: str = "--rope") -> int:
    """The rotary width (head_dim when not given), or an InputError: odd widths, too wide, unknown mode.
    ``source``: where the rotary width came from (a flag, a file's option, config.json); ``mode_source``: the mode."""
    check_rope_mode(mode, mode_source)
    if rotary_dim is None:
        if head_dim % 2:
            raise InputError(f"RoPE rotates pairs of features but the head width is {head_dim} (odd); "
                             "use an even head width or --rotary-dim with an even part of it", mode_source)
        return head_dim
    if rotary_dim < 2 or rotary_dim % 2:
        raise InputError(f"the rotary width must be even and at least 2 (RoPE rotates pairs), got {rotary_dim}", source)
    if rotary_dim > head_dim:
        raise InputError(f"the rotary width {rotary_dim} is larger than the head width {head_dim}", source)
    return rotary_dim


def check_rope_dim(dim: int, source: str) -> None:
    if dim < 2 or dim % 2:
        raise InputError(f"the rotary width must be even and at least 2, got {dim}", source)


def check_sinks(sinks: Any, heads: int, source: str = "--sinks", what: str = "sinks") -> np.ndarray:
    """The sinks (or, ``what="ALiBi slopes"``, the slopes) as a float64 (H,) array, or an InputError naming
    ``what`` and ``source``: wrong count, not a vector, not finite-or--inf (slopes: not finite)."""
    one = "slope" if what != "sinks" else "logit"
    a = np.asarray(sinks)
    if a.dtype.kind not in "fiu":
        raise InputError(f"{what} must be numbers (one {one} per head), got dtype {a.dtype}", source)
    a = a.astype(np.float64).reshape(-1) if a.ndim <= 1 else a
    if a.ndim != 1 or a.shape[0] != heads:
        raise InputError(f"{what} have shape {tuple(np.shape(sinks))} but attention has {heads} query heads; "
                         f"give one {one} per head, shape ({heads},)", source)
    if what != "sinks" and not np.isfinite(a).all():
        raise InputError(f"{what} hold NaN or an infinity; each must be a finite number", source)
    if np.isnan(a).any() or (np.isinf(a) & (a > 0)).any():
        raise InputError("sinks hold NaN or +inf; each must be a finite logit (or -inf for no sink)", source)
    return a


def check_positional(score: str, variant: str) -> None:
    """An InputError when the position stage ``variant`` ("rope" or "alibi") means nothing for ``score``."""
    ok = POSITION_SCORES[variant]
    if score in ok:
        return
    if variant == "rope":
        why = ("it ignores the query, so rotating it changes nothing" if score == "location" else
               "its learned matrices mix the rotated features, so scores no longer depend on i - j alone")
        raise InputError(f"--rope makes q·k depend on the offset i - j; with --score {score} {why}: "
                         f"use one of {', '.join(ok)}", "--rope")
    raise InputError(f"--alibi adds -slope·(i - j) per query; --score {score} gives every query the same weights "
                     f"by definition, which a per-query distance would undo: use one of {', '.join(ok)}", "--alibi")


# ---- T5's relative position bias -------------------------------------------------------------

def t5_bucket(relative: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bucket of each relative position j - i (``T5Attention._relative_position_bucket``):
    exact buckets for small distances, logarithmic ones up to max_distance; the log in float32 as torch does."""
    rel = np.asarray(relative, dtype=np.int64)
    buckets = np.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).astype(np.int64) * num_buckets
        rel = np.abs(rel)
    else:
        rel = -np.minimum(rel, 0)
    max_exact = num_buckets // 2
    small = rel < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (np.log(rel.astype(np.float32) / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
             * np.float32(num_buckets - max_exact))
        large = max_exact + np.where(small, 0, x).astype(np.int64)  # small ones are not used: avoid casting -inf
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(small, rel, large)
