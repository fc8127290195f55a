"""The stages of attention, each written once over the array API (``xp``: numpy or torch).

    project    Q = X W_q + b_q, K = Y W_k + b_k, V = Z W_v + b_v        (B, T, D) x (D, e) -> (B, T, e)
    split      (B, T, H·d) -> (B, H, T, d); K/V may have fewer heads (grouped-query: expand_kv)
    score      the registered score function (attncli.scoring)          (..., m, d) x (..., n, d) -> (..., m, n)
    scale      S · factor / T
    mask       keep-mask (valid lengths, causal, boolean masks) and additive float masks
    softmax    stable, rows of -inf give zeros; online (blocks of keys) for the output-only path
    select     hard attention, dropout
    sum        weights · V                                              (..., m, n) x (..., n, d_v) -> (..., m, d_v)
    merge      (B, H, T, d) -> (B, T, H·d), then W_o + b_o

The explicit path (attncli.engine), the blocked output-only path and PyTorch's fused kernel
(attncli.fast), ``check``'s variants, the explanations and the diagnostics all call these:
none keeps a private copy of a softmax, a mask fill or a head merge.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attncli.problem import Problem
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.backend import Backend, to_numpy
from attncli.errors import InputError
from attncli.scoring import SCALINGS, ScoreInput, get_score
from attncli.trace import Trace
from attncli.weights import seeded_rng

# ---- 1) project, 2) split, 11) merge ------------------------------------------------------


def project(x: Any, w: Any, b: Any = None) -> Any:
    """A projection in the textbook convention: X W (+ b). (B, T, D) x (D, e) -> (B, T, e)"""
    y = x @ w  # (B, T, D) x (D, e) -> (B, T, e)
    return y if b is None else y + b


def split_heads(xp: Any, a: Any, heads: int) -> Any:
    """Each head its own slice of the features: (B, T, H·d) -> (B, T, H, d) -> (B, H, T, d)."""
    B, T, e = (int(s) for s in a.shape)
    return xp.permute_dims(xp.reshape(a, (B, T, heads, e // heads)), (0, 2, 1, 3))


def merge_heads(xp: Any, a: Any) -> Any:
    """The heads side by side, in order: (B, H, T, d) -> (B, T, H, d) -> (B, T, H·d)."""
    B, H, T, d = (int(s) for s in a.shape)
    return xp.reshape(xp.permute_dims(a, (0, 2, 1, 3)), (B, T, H * d))


def expand_kv(xp: Any, a: Any, n_rep: int) -> Any:
    """Grouped-query heads: query head h reads K/V head h // n_rep. (..., G, S, d) -> (..., G·n_rep, S, d)

    As SDPA's ``enable_gqa`` (``repeat_interleave`` on the head axis) and HF ``repeat_kv``;
    tiling instead (``repeat``: head h reads h % G) is the classic mistake."""
    if n_rep == 1:
        return a
    *lead, G, S, d = (int(s) for s in a.shape)
    b = xp.broadcast_to(xp.expand_dims(a, axis=-3), (*lead, G, n_rep, S, d))  # (..., G, 1, S, d) -> (..., G, r, S, d)
    return xp.reshape(b, (*lead, G * n_rep, S, d))


# ---- 3) score, 4) scale ------------------------------------------------------------------------


def score(problem: Problem, xp: Any, q: Any, k: Any, params: dict[str, Any], trace: Trace | None = None) -> Any:
    """The problem's registered score of queries ``q`` against keys ``k``. (..., m, d) x (..., n, d) -> (..., m, n)"""
    return get_score(problem.options.score).fn(ScoreInput(xp, q, k, params, trace, problem.options))


def scale_factor(problem: Problem, xp: Any, s: Any) -> tuple[Any, str]:
    """The factor the raw scores are multiplied by (None for none) and its description."""
    o = problem.options
    d, n = problem.d_qk, problem.n
    if o.scale is not None:
        return o.scale, f"S · {o.scale:g}"
    rule = SCALINGS[o.scaling or get_score(o.score).scaling]
    if rule.name == "none":
        return None, "S"
    return rule.factor(xp, s, d, n), rule.describe(d, n)


# ---- 5) mask ------------------------------------------------------------------------------------


Rows = tuple[int, int] | np.ndarray | None  # which queries: all, i0..i1-1 (a block), or an index array (corners)


def keep_mask(problem: Problem, n: int, rows: Rows = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(keep, bias) on the host: a boolean keep-mask broadcastable to (..., rows, n) from the valid
    lengths, the causal rule and boolean masks, and an additive float mask (or None for each)."""
    o = problem.options
    m = problem.m
    index = np.arange(*rows) if isinstance(rows, tuple) else np.arange(m) if rows is None else rows  # query indices
    keep = None
    j = np.arange(n)  # key index
    if problem.query_limit is not None:
        keep = _row_block(problem.query_limit[..., None], rows) > j  # (..., m, 1) vs (n,) -> (..., m, n)
    if o.causal:
        i = index[:, None]
        offset = n - m if o.causal_align == "bottom-right" else 0
        causal = j <= i + offset  # (m, n)
        keep = causal if keep is None else keep & causal
    bias = None
    if problem.mask is not None:
        mk = _row_block(problem.mask, rows)
        if mk.dtype == bool:
            mk = mk if o.mask_convention == "keep" else ~mk
            keep = mk if keep is None else keep & mk
        else:
            bias = mk
    if problem.padding is not None:  # key padding (B, 1, 1, n), True = ignore, as PyTorch
        pad = problem.padding
        if pad.dtype == bool:
            keep = ~pad if keep is None else keep & ~pad
        else:
            bias = pad if bias is None else bias + pad  # a float key padding mask is added, as PyTorch merges it
    return keep, bias


def masks(problem: Problem, be: Backend, rows: Rows = None) -> tuple[Any, Any]:
    """:func:`keep_mask` on the backend: (keep as booleans, bias in the computing dtype)."""
    keep, bias = keep_mask(problem, problem.n, rows)
    return (None if keep is None else be.asbool(keep)), (None if bias is None else be.asarray(bias, problem.dtype))


def _row_block(a: np.ndarray, rows: Rows) -> np.ndarray:
    """Some rows (i0..i1-1, or an index array) of an array broadcast over (..., m, n); one that has
    a single row (or none) as it is."""
    if rows is None or a.ndim < 2 or a.shape[-2] == 1:
        return a
    return a[..., rows[0]:rows[1], :] if isinstance(rows, tuple) else a[..., rows, :]


def fill_value(problem: Problem) -> float:
    """What a masked score becomes: -inf (masked weights exactly 0), or --mask-value."""
    mv = problem.options.mask_value
    return -math.inf if mv is None else mv


def apply_mask(xp: Any, s: Any, keep: Any, bias: Any, fill: float) -> Any:
    """masked = S + bias, with the keys that keep excludes set to ``fill``. (..., m, n)"""
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = xp.where(keep, s, xp.asarray(fill, dtype=s.dtype, device=_device(s)))
    return s


# ---- 6) softmax ---------------------------------------------------------------------------------


def softmax_parts(xp: Any, s: Any) -> tuple[Any, Any, Any]:
    """(row max, e = exp(s - max), z = Σ e) over the last axis; a row of -inf has max 0, e 0, z 0."""
    mx = xp.max(s, axis=-1, keepdims=True)
    mx = xp.where(xp.isfinite(mx), mx, xp.zeros_like(mx))
    e = xp.exp(s - mx)
    return mx, e, xp.sum(e, axis=-1, keepdims=True)


def softmax(xp: Any, s: Any) -> Any:
    """Stable softmax over the last axis: exp(s - max) / Σ exp(s - max). Rows of -inf give zeros."""
    _, e, z = softmax_parts(xp, s)
    return e / xp.where(z > 0, z, xp.ones_like(z))


class OnlineSoftmax:
    """The softmax of a row met in chunks of keys, folded straight into the product with V:
    the running max r, the output and the sum a = Σ e·[V | 1] are rescaled by exp(r_old - r_new)
    when a chunk raises the max. ``shift=False`` (scores known to be bounded well inside exp's
    range) takes exp(s) with no max at all. ``finish()`` gives a[:d_v] / a[d_v]."""

    def __init__(self, xp: Any, shift: bool) -> None:
        self.xp, self.shift = xp, shift
        self.r: Any = None  # running max (..., b, 1)
        self.a: Any = None  # outputs and sums (..., b, d_v + 1)

    def add(self, s: Any, v1: Any, reuse: bool = False) -> None:
        """Fold in a chunk of scores ``s`` (..., b, n_c) with its values [V | 1] (..., n_c, d_v + 1);
        ``reuse``: ``s`` may be overwritten."""
        xp, alpha = self.xp, None
        if self.shift:
            mx = xp.max(s, axis=-1, keepdims=True)  # (..., b, 1)
            r_new = mx if self.r is None else xp.maximum(self.r, mx)
            ref = xp.where(xp.isfinite(r_new), r_new, xp.zeros_like(r_new))  # a row all -inf so far: zeros
            if self.r is not None:  # rescale what earlier chunks added: exp(r_old - r_new) <= 1 (0 where r_old is -inf)
                alpha = xp.where(xp.isfinite(self.r), xp.exp(self.r - ref), xp.zeros_like(self.r))
            self.r = r_new
            if reuse and hasattr(s, "__isub__"):
                s -= ref
            else:
                s = s - ref
        e = _exp(xp, s, reuse or self.shift)
        ev = e @ v1  # (..., b, n_c) x (..., n_c, d_v + 1) -> (..., b, d_v + 1): outputs, sums
        self.a = ev if self.a is None else (self.a + ev if alpha is None else self.a * alpha + ev)

    def finish(self) -> Any:
        """The output rows (..., b, d_v): Σ e·v / Σ e (0 where the sum is 0)."""
        xp, a = self.xp, self.a
        total = a[..., -1:]  # (..., b, 1)
        return a[..., :-1] / xp.where(total > 0, total, xp.ones_like(total))

    def dead(self) -> Any:
        """Rows (..., b) whose every score was -inf (needs shift=True)."""
        return ~self.xp.isfinite(self.r[..., 0])


def _exp(xp: Any, s: Any, inplace: bool) -> Any:
    if inplace and isinstance(s, np.ndarray):
        return np.exp(s, out=s)
    if inplace and hasattr(s, "exp_"):
        return s.exp_()
    return xp.exp(s)


def dead_rows(xp: Any, s: Any, keep: Any) -> np.ndarray | None:
    """Rows (..., m) with every key masked (all scores -inf, or no key kept), on the host; None if none.
    The one definition of a fully masked row: the warnings, diagnostics and views read it."""
    dead = xp.all(xp.isinf(s) & (s < 0), axis=-1)
    if keep is not None:
        dead = dead | ~xp.any(keep, axis=-1)
    dead_np = to_numpy(dead)
    return dead_np if dead_np.any() else None


def dead_row_messages(problem: Problem, dead: np.ndarray) -> list[str]:
    """One warning per fully masked row (the first 10), named by label and batch/head index."""
    dead = np.broadcast_to(dead, problem.batch_shape + (problem.m,))
    labels, mv = problem.query_labels, problem.options.mask_value
    names = problem.axis_names
    what = "its weights and head output are zero" if "head" in names else "its weights and output are zero"
    out = []
    for idx in np.argwhere(dead)[:10]:
        *b, i = (int(x) for x in idx)
        row = f"query {labels[i]!r}" if labels else f"query {i}"
        shown = [f"{n} {x}" for n, x in zip(names, b) if n] if len(names) == len(b) else [f"batch {', '.join(map(str, b))}"]
        where = f"{row} ({', '.join(shown)})" if shown else row
        if mv is None or math.isinf(mv):
            out.append(f"{where} has every key masked: {what}")
        else:
            out.append(f"{where} has every key masked: with mask value {mv:g} its weights are uniform (as d2l)")
    extra = int(dead.sum()) - len(out)
    if extra > 0:
        out.append(f"... and {extra} more fully masked rows")
    return out


def check_scores(problem: Problem, xp: Any, raw: Any, s: Any, keep: Any, offset: tuple[int, int] = (0, 0)) -> None:
    """Raise a one-line InputError when a score that takes part is not finite: the inputs
    overflowed the dtype (e.g. float32 entries of 1e30, whose products reach 1e60), and no
    softmax of such a row means anything. ``raw``: the (scaled) scores, which must be finite
    where ``keep`` is True; ``s``: after masking, where only -inf (a masked key) may appear;
    ``offset``: the (query, key) index of their first score (a block of the blocked path)."""
    bad = xp.isnan(s) | (xp.isinf(s) & (s > 0))
    raw_bad = ~xp.isfinite(raw)
    bad = bad | (raw_bad if keep is None else raw_bad & keep)
    if not bool(xp.any(bad)):
        _check_fill(problem, xp, s, keep, offset)
        return
    bad_np = to_numpy(bad)
    idx = tuple(int(i) for i in np.argwhere(bad_np)[0])
    raw_np, s_np, raw_bad_np = (np.broadcast_to(to_numpy(a), bad_np.shape) for a in (raw, s, raw_bad))
    *b, i, j = idx
    where = f"query {i + offset[0]}, key {j + offset[1]}" + (f" (batch {', '.join(map(str, b))})" if b else "")
    dtype = problem.dtype
    hint = "use --dtype float64 or rescale the inputs" if dtype != "float64" else "rescale the inputs"
    o = problem.options  # an option that took part is named: it, not the inputs, may be what overflows
    given = [f"--{n} {v:g}" for n, v in (("scale", o.scale), ("temperature", o.temperature)) if v is not None]
    hint = f"check {' and '.join(given)}, or {hint}" if given else hint
    raise InputError(f"scores overflow {dtype} at {where}: the score is "
                     f"{float(raw_np[idx]) if bool(raw_bad_np[idx]) else float(s_np[idx])} "
                     f"(largest |input| {problem.largest_input():.3g}); {hint}", problem.where("q"))


def _check_fill(problem: Problem, xp: Any, s: Any, keep: Any, offset: tuple[int, int]) -> None:
    """A finite --mask-value must be below every kept score of a row that masks a key, or the masked
    keys outweigh it (1e308 with --causal made them win). Checked over the scores at hand (on the
    blocked path: this block of keys)."""
    fill = problem.options.mask_value
    if fill is None or math.isinf(fill) or keep is None:
        return
    masks_some = xp.any(~keep, axis=-1, keepdims=True)  # (..., m, 1)
    low = keep & (s <= fill) & masks_some  # (..., m, n)
    if not bool(xp.any(low)):
        return
    low_np = to_numpy(xp.broadcast_to(low, s.shape) if hasattr(xp, "broadcast_to") else low)
    idx = tuple(int(i) for i in np.argwhere(low_np)[0])
    *b, i, j = idx
    where = f"query {i + offset[0]}, key {j + offset[1]}" + (f" (batch {', '.join(map(str, b))})" if b else "")
    score = float(np.broadcast_to(to_numpy(s), low_np.shape)[idx])
    raise InputError(f"mask value {fill:g} is not below every score: the kept score at {where} is {score:.6g}, so "
                     "masked keys would outweigh it; give a lower --mask-value or leave the default -inf", "--mask-value")


# ---- 7) select ---------------------------------------------------------------------------------


def hard(xp: Any, w: Any) -> Any:
    """Hard attention: 1 at each row's argmax (the first one on ties), 0 elsewhere; zero rows stay zero."""
    n = int(w.shape[-1])
    top = xp.argmax(w, axis=-1, keepdims=True)  # (..., m, 1), the first maximum
    one = xp.astype(xp.arange(n, device=_device(w)) == top, w.dtype)  # (n,) vs (..., m, 1) -> (..., m, n)
    alive = xp.any(w > 0, axis=-1, keepdims=True)  # (..., m, 1): fully masked rows stay zero
    return xp.where(alive, one, xp.zeros_like(one))


def dropout(be: Backend, w: Any, p: float, seed: int | None) -> Any:
    """Inverted dropout as ``nn.Dropout(p)`` in training: keep with probability 1-p, scale kept by 1/(1-p).

    keep = numpy.random.default_rng(seed).random(w.shape) >= p, drawn on the host, so numpy
    and torch drop the same weights.
    """
    keep = be.asbool(seeded_rng(seed).random(tuple(int(x) for x in w.shape)) >= p)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return be.xp.where(keep, w * scale, be.xp.zeros_like(w))


# ---- 8) sum --------------------------------------------------------------------------------------


def weighted_sum(w: Any, v: Any) -> Any:
    """output = weights · V. (..., m, n) x (..., n, d_v) -> (..., m, d_v)"""
    return w @ v


def _device(a: Any) -> Any:
    from array_api_compat import device

    return device(a)
