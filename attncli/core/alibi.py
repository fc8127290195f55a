"""ALiBi's bias in the forms models compute it: :data:`FORMS`, the choices of ``--alibi-form``.

    relative       slope_h · (j - (P + i))                      Press et al.; in the computing dtype
    absolute-f32   fl32(fl32(slope_h) · j)                      HF Bloom's build_alibi_tensor
    absolute-bf16  bf16(bf16(slope_h) · bf16(j))                HF Falcon's build_alibi_tensor

A model that adds ALiBi to q·k before its scale 1/r (Falcon: (q·k + alibi) / √d; ``--alibi-scaled``) has the
bias divided by r after its rounding: the absolute forms as a float32 division (FalconModel's ``alibi /
math.sqrt(head_dim)``), the relative one in the computing dtype.

Query i sits at position P + i, key j at j. In exact arithmetic the three give the same weights: slope_h · j is
slope_h · (j - (P + i)) plus slope_h · (P + i), the same for every key of a row, which the softmax ignores. After
rounding they differ: transformers' Bloom multiplies the float32 slope by the key's absolute position in float32,
and its Falcon multiplies the slope rounded to bfloat16 by the position rounded to bfloat16 (``slopes.bfloat16() *
arange``: the integer positions take the bfloat16 dtype of the slopes) and rounds the product to bfloat16: with 8
significant bits each rounding moves a key's bias by up to 2^-8 of it (whole units for slope · j in the thousands).
The absolute forms reproduce those roundings exactly, for positions below 2^24 (which float32 holds).

Their slopes, when none are given, are the float32 ones of transformers' ``build_alibi_tensor``: the float32 base
2^(-8/P) raised to the integer powers, computed here in float64 from the float32 base and rounded once to float32.
torch's float32 ``pow`` is within one unit in the last place of that and may differ in it for a few heads (head 15
of 32 on a CPU with AVX2); bfloat16 (Falcon) absorbs that difference, float32 (Bloom) keeps it: that head's bias
then differs by about j · 2^-24 · slope.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core.formula import Fn, Term, terms
from attncli.errors import InputError

BiasFn = Callable[[Any, Any, Any, float], Any]  # (slopes (H,), q_pos (m,), k_pos (n,), r) -> (H, m, n) float64
Written = Callable[[Term, Term], tuple[Term, ...]]  # (a head's slope, a key's position) -> what is added, in symbols


@dataclass(frozen=True)
class Form:
    """One way of computing ALiBi's bias: ``fn`` the bias itself (divided by r, 1 unless the model adds it before
    its scale 1/r), ``slopes`` those for H heads when none are given, ``terms`` what is added at a head's slope and a
    key's position, in symbols (for display: fl32(fl32(slope_h) · j))."""

    name: str
    fn: BiasFn
    slopes: Callable[[int], Any]
    terms: Written
    source: str


FORMS: dict[str, Form] = {}


def form(name: str, slopes: Callable[[int], Any], written: Written, source: str) -> Callable[[BiasFn], BiasFn]:
    """Register the bias function of the form ``name``."""

    def deco(fn: BiasFn) -> BiasFn:
        FORMS[name] = Form(name, fn, slopes, written, source)
        return fn

    return deco


def paper_slopes(heads: int) -> Any:
    """slope_h = (2^(-8/P))^(h+1) for P = heads a power of two; otherwise P's slopes, then every other
    slope of 2P. -> (H,) float64

    fairseq ``get_slopes`` (Press et al.), computed in float64. HF Bloom's ``build_alibi_tensor``
    rounds the base 2^(-8/P) to float32 and raises it to the integer powers in float32: its
    slopes differ from these by a few float32 units in the last place (relative ~1e-7); :func:`hf_slopes`.
    """
    if heads < 1:
        raise InputError(f"ALiBi needs at least one head, got {heads}", "--alibi")
    p = 2 ** math.floor(math.log2(heads))
    slopes = (2.0 ** (-8.0 / p)) ** np.arange(1, p + 1, dtype=np.float64)  # (P,)
    if p == heads:
        return slopes
    extra = (2.0 ** (-8.0 / (2 * p))) ** np.arange(1, 2 * (heads - p), 2, dtype=np.float64)  # odd powers of 2P's base
    return np.concatenate([slopes, extra])


def hf_slopes(heads: int) -> Any:
    """transformers' build_alibi_tensor slopes (Bloom, Falcon): the float32 base 2^(-8/P) (P the largest power of
    two <= H) to the powers 1..P, then for the other H - P heads every other power 1, 3, ... of 2P's float32 base;
    each power computed in float64 from the float32 base and rounded once to float32. (H,) float64"""
    if heads < 1:
        raise InputError(f"ALiBi needs at least one head, got {heads}", "--alibi")
    p2 = 2 ** math.floor(math.log2(heads))
    base = float(np.float32(2.0 ** (-(2.0 ** -(math.log2(p2) - 3)))))
    sl = [base ** k for k in range(1, 1 + p2)]
    if p2 != heads:
        extra = float(np.float32(2.0 ** (-(2.0 ** -(math.log2(2 * p2) - 3)))))
        sl += [extra ** k for k in range(1, 1 + 2 * min(p2, heads - p2), 2)]
    return np.asarray(sl, dtype=np.float64).astype(np.float32).astype(np.float64)


def f32(x: Any) -> Any:
    """x rounded to float32 (to nearest, ties to even), as float64."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def bf16(x: Any) -> Any:
    """x rounded to bfloat16 (to nearest, ties to even, as torch's .bfloat16()), as float64: the float32 bits
    rounded to their upper 16. For values that float32 holds exactly (rounded first otherwise)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32).astype(np.float64)


def _rows(b: Any, m: int) -> Any:
    """A bias per key (H, n) as one per query and key (H, m, n): the same for every query."""
    return np.broadcast_to(b[:, None, :], (b.shape[0], m, b.shape[1]))


@form("relative", paper_slopes, lambda s, j: terms(s, " · (", j, " - (P + i))"),
      "Press et al. (ALiBi): minus slope_h times the distance")
def relative(sl: Any, q_pos: Any, k_pos: Any, r: float) -> Any:
    """b_hij = slope_h · (k_pos_j - q_pos_i) = -slope_h · distance (over r). (H,), (m,), (n,) -> (H, m, n)

    Bloom adds slope·j (the same per row up to a constant, so the same weights); FlashAttention
    -slope·|i + n - m - j|, the same on the causal side.
    """
    sl = np.asarray(sl)
    dt = sl.dtype if sl.dtype.kind == "f" else np.float64
    rel = np.asarray(k_pos)[None, :].astype(dt) - np.asarray(q_pos)[:, None].astype(dt)  # (1, n) - (m, 1) -> (m, n)
    b = sl.astype(dt)[:, None, None] * rel[None, :, :]  # (H, 1, 1) x (1, m, n) -> (H, m, n)
    return b if r == 1 else b / r


@form("absolute-f32", hf_slopes, lambda s, j: terms(Fn("fl32"), "(", Fn("fl32"), "(", s, ") · ", j, ")"),
      "transformers' Bloom (build_alibi_tensor): the float32 slope times the key's absolute position, in float32")
def absolute_f32(sl: Any, q_pos: Any, k_pos: Any, r: float) -> Any:
    """b_hij = fl32(fl32(slope_h) · fl32(j)) (then fl32(b / fl32(r))): the same for every query i.
    (H,), (m,), (n,) -> (H, m, n)"""
    b = f32(f32(sl)[:, None] * f32(k_pos)[None, :])  # (H, 1) x (1, n) -> (H, n): exact in float64, rounded once
    return _rows(b if r == 1 else f32(b / f32(r)), len(q_pos))


@form("absolute-bf16", hf_slopes,
      lambda s, j: terms(Fn("bf16"), "(", Fn("bf16"), "(", s, ") · ", Fn("bf16"), "(", j, "))"),
      "transformers' Falcon (build_alibi_tensor): the slope and the key's absolute position in bfloat16, their "
      "product rounded to bfloat16")
def absolute_bf16(sl: Any, q_pos: Any, k_pos: Any, r: float) -> Any:
    """b_hij = bf16(bf16(slope_h) · bf16(j)) (then fl32(b / fl32(r))): the same for every query i.
    (H,), (m,), (n,) -> (H, m, n)

    The product of two bfloat16 numbers is exact in float32 (16 significant bits), so rounding it once to
    bfloat16 is torch's bfloat16 multiply; the quotient of two float32 numbers rounded from float64 is the
    float32 division (FalconModel: ``alibi / math.sqrt(head_dim)``).
    """
    b = bf16(bf16(sl)[:, None] * bf16(np.asarray(k_pos, dtype=np.float64))[None, :])  # (H, 1) x (1, n) -> (H, n)
    return _rows(b if r == 1 else f32(b / f32(r)), len(q_pos))


def bias(name: str, slopes: Any, q_pos: Any, k_pos: Any, r: float = 1.0) -> Any:
    """The bias of the form ``name``: slopes (H,), query positions (m,), key positions (n,) -> (H, m, n) float64
    (``r``: what it is divided by when the model adds it before its scale 1/r)."""
    return FORMS[name].fn(np.asarray(slopes), np.asarray(q_pos), np.asarray(k_pos), r)
