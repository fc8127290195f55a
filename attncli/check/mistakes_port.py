"""Mistakes made porting a model, for ``attncli check``: entries of the catalogue in
:mod:`attncli.check.variants` (registered with the same ``@variant`` decorator, so the pair search
tries them too).

- ``rope-base-other``: RoPE with another base than the reference's, either direction; the base is
  fitted (common bases first, then a search on log(base)) and named;
- ``rope-added``: RoPE applied although the problem has none (a forgotten ``--rope``);
- ``causal-diagonal-excluded`` / ``causal-one-future``: the causal mask off by one (j < i; j <= i + 1);
- ``sqrt-heads-width``: √(H·d) scaling of 4-D (B, H, T, d) inputs (of a layer: ``sqrt-model-width``);
- ``sqrt-kv-width``: √(G·d) scaling with G grouped-query K/V heads (K's width before the head split);
- ``rope-q-positions-not-offset``: in a KV-cache step, the new queries rotated at 0..m-1 while the
  mask still puts them at P..P+m-1 (every head's; single-head, 4-D, grouped-query and layers alike).

Each is tested against an independent implementation in ``tests/test_mistakes_port.py``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from attncli.check.compare import errors, within
from attncli.check.variants import Context, NotApplicable, Result, _remask, rotated, variant
from attncli.core.layer import Subject

COMMON_BASES = (10000.0, 500000.0, 1000000.0, 100000.0, 50000.0, 5000000.0, 250000.0, 2000000.0, 8000000.0,
                20000.0, 1000.0)
FIT_STEPS = 24  # golden-section steps on log10(base) in [2, 8] when no common base fits
FIT_CELLS = 1 << 22  # ...only for problems of at most this many score cells (each step is one run); larger
# problems try the first four common bases only. Both fitting entries are a search of their own: not pairable.


def _err(c: Context, t: object) -> float:
    got = np.asarray(t[c.what], dtype=np.float64)  # type: ignore[index]
    return float(errors(c.expected, got).max()) if got.shape == c.expected.shape else math.inf


def _fit_base(c: Context, exclude: float | None, **options: Any) -> float:
    """The RoPE base whose run comes closest to the expected numbers (a common one if it fits)."""
    tried: dict[float, float] = {}

    def err(b: float) -> float:
        if b not in tried:
            tried[b] = _err(c, c.rerun(rope_base=b, **options))
        return tried[b]

    p = c.problem
    small = int(np.prod(p.batch_shape)) * p.m * p.n <= FIT_CELLS
    for b in COMMON_BASES if small else COMMON_BASES[:4]:
        if b != exclude and within(c.expected, np.asarray(c.rerun(rope_base=b, **options)[c.what]), c.tol).all():
            return b
        if b != exclude:
            err(b)
    if small:
        lo, hi = 2.0, 8.0
        g = (math.sqrt(5) - 1) / 2
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        for _ in range(FIT_STEPS):
            if err(10 ** a) < err(10 ** b):
                hi, b = b, a
                a = hi - g * (hi - lo)
            else:
                lo, a = a, b
                b = lo + g * (hi - lo)
        best = 10 ** ((lo + hi) / 2)
        rounded = float(f"{best:.3g}")
        tried_r = err(rounded)
        err(best)
        if tried_r <= tried[best]:
            best = rounded
        tried.setdefault(best, err(best))
    return min(tried, key=lambda k: tried[k])


@variant("rope-base-other", "RoPE used another base: {detail}", pairable=False)
def rope_base_other(c: Context) -> Result:
    """θ = position · b^(-2k/d) with another base b than the reference's"""
    if c.options.rope is None:
        raise NotApplicable("no rotary position embedding")
    if c.options.rope_scaling:
        raise NotApplicable("a scaled RoPE (rope_scaling)")
    base = c.problem.rope_settings()[0]
    fit = _fit_base(c, base)
    if fit == 10000.0:
        raise NotApplicable("the base that fits is 10000: rope-base-default")
    c.note = f"RoPE base {fit:g}, the reference uses {base:g}"
    c.hint = f"--rope-base {fit:g}"
    return c.rerun(rope_base=fit)


@variant("rope-added", "RoPE ({rope_added}) was applied although this problem has no rotary position embedding: "
                       "{detail}", pairable=False)
def rope_added(c: Context) -> Result:
    """softmax(rotate(Q)·rotate(K)ᵀ / √d)·V for a problem without RoPE"""
    if c.options.rope is not None:
        raise NotApplicable("RoPE is there already")
    if c.d % 2:
        raise NotApplicable("an odd head width cannot be rotated")
    best: tuple[float, str] = (math.inf, "half")
    for mode in ("half", "interleaved"):
        e = _err(c, c.rerun(rope=mode))
        best = min(best, (e, mode))
    mode = best[1]
    base = _fit_base(c, None, rope=mode)
    c.note = f"{mode} pairs, base {base:g}"
    c.hint = f"--rope {mode}" + (f" --rope-base {base:g}" if base != 10000.0 else "")
    return c.rerun(rope=mode, rope_base=base)


def _shifted_causal(c: Context, shift: int) -> Subject:
    p, o = c.problem, c.options
    if not o.causal:
        raise NotApplicable("no causal mask here")
    if o.window is not None:
        raise NotApplicable("with a sliding window (its own off-by-one entries cover it)")
    if p.mask is not None and (p.mask.dtype != bool or o.mask_convention != "keep"):
        raise NotApplicable("a mask of another kind is there too")
    i, j = p.query_offset + np.arange(p.m)[:, None], np.arange(p.n)[None, :]
    keep = j <= i + shift  # (m, n)
    mask = keep if p.mask is None else p.mask & keep
    return replace(p, mask=mask, options=replace(o, causal=False))


@variant("causal-diagonal-excluded", "the causal mask was off by one: each query saw only the keys before it, not "
                                     "itself (j < i instead of j <= i; triu(..., diagonal=0) instead of diagonal=1)")
def causal_diagonal_excluded(c: Context) -> Result:
    """softmax(S masked at keys j >= i)·V"""
    return _remask(c, _shifted_causal(c, -1))


@variant("causal-one-future", "the causal mask was off by one: each query also saw the next key (j <= i + 1; "
                              "triu(..., diagonal=2) instead of diagonal=1)")
def causal_one_future(c: Context) -> Result:
    """softmax(S masked at keys j > i + 1)·V"""
    return _remask(c, _shifted_causal(c, +1))


@variant("sqrt-heads-width", "the scores of the 4-D (batch, heads, tokens, width) inputs were divided by √(H·d) "
                             "= √({H4}·{d}), the model width, instead of the head width's √d = {sqrt_d}")
def sqrt_heads_width(c: Context) -> Result:
    """softmax(QKᵀ / √(H·d))·V for (B, H, T, d) inputs"""
    if c.heads:  # a layer's model width H·d is d_k: the same mistake, named once
        raise NotApplicable("a multi-head layer: √(H·d) is its d_k, sqrt-model-width")
    p = c.single()
    c.requires_sqrt_d()
    if p.q.ndim != 4 or int(p.q.shape[-3]) == 1:
        raise NotApplicable("not 4-D inputs with several heads")
    H = int(p.q.shape[-3])
    c.note = str(H)
    return c.rerun(scale=1.0 / math.sqrt(H * c.d))


@variant("sqrt-kv-width", "the scores were divided by √(G·d) = √({G}·{d}), the width of the {G} K/V heads together "
                          "(K's last axis before the head split), instead of the head width's √d = {sqrt_d}")
def sqrt_kv_width(c: Context) -> Result:
    """softmax(QKᵀ / √(G·d))·V for G grouped-query K/V heads"""
    c.requires_sqrt_d()
    G = c.problem.kv_heads
    if G is None:
        raise NotApplicable("as many K/V heads as query heads: √(H·d) is sqrt-heads-width / sqrt-model-width")
    if G == 1:
        raise NotApplicable("one K/V head (multi-query): its width is d")
    return c.rerun(scale=1.0 / math.sqrt(G * c.d))


@variant("rope-q-positions-not-offset", "in a KV-cache step the new queries were rotated at positions 0..m-1 "
                                        "instead of {P}..{P}+m-1 (cache_position not passed to RoPE); the mask "
                                        "was right")
def rope_q_positions_not_offset(c: Context) -> Result:
    """softmax(rotate(Q, 0..m-1)·rotate(K)ᵀ / √d)·V with the mask at P + i"""
    if c.problem.query_offset == 0:
        raise NotApplicable("the queries start at position 0")
    return rotated(c, q_at=np.arange(c.m))  # every head's queries from 0, not P; keys at 0..n-1 as before
