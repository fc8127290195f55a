"""The chain of attention's stages, written once: :data:`STAGES` in order, :func:`needed` per problem, :func:`logits`.

Beside nanoGPT's ``CausalSelfAttention``::

    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))     # 1) score  2) scale
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))  # 5) mask
    att = F.softmax(att, dim=-1)                                         # 6) softmax

:data:`STAGES` is the whole pipeline between the projections and the weighted sum, each entry a typed stage that
computes its part: on each head's q and k before the scores (``qk``: QK-norm, RoPE, Llama 4's tuning of q), on the
scores of a block of queries against a block of keys (``fn``: 2) scale, 3) soft-capping, 4) ALiBi and T5's relative
position bias, 5) the mask), the sinks (the softmax's extra logit: ops.softmax_of, ops.OnlineSoftmax.add_sinks), and
on the weights (``weights``: hard attention, dropout). :func:`needed` puts the stages a problem needs in the order its
options decide (QK-norm after RoPE is a parameter of the QK-norm stage, ``after``, not a branch of the engine).

The explicit path (attncli.core.engine) is "one block, every step recorded"; the blocked path (attncli.core.blocked)
is "many blocks, online softmax"; PyTorch's fused kernel runs where every needed stage says ``sdpa``. Each stage says
whether the blocked path and the fused kernel compute it: :func:`supports` derives from it which paths may run a
problem, so a stage added here is computed by every path or refuses it. The softmax (exact and online), its sinks and
the dead-row and overflow rules are attncli.core.ops's, shared by every path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np

    from attncli.core.problem import Problem
else:
    from attncli.lazy import numpy as np

from attncli.core import alibi, heads, ops
from attncli.core.backend import Backend
from attncli.core.formula import Fn, Formula, Name, Num, Root, Sub, Sym, Term, Words, formula, terms
from attncli.core.ops import Rows
from attncli.core.scoring import CONSTANT_SCALINGS, SCALINGS, get_score
from attncli.core.trace import StepName as N
from attncli.core.trace import Trace

# Scores whose raw value is q_i · k_j: the scale can go into q (one pass less) and SDPA applies.
DOT_SCORES = {"dot", "scaled-dot"}
# ... and those whose factor needs the whole score matrix: the blocked path's first pass for each
# (attncli.core.blocked registers them).
WHOLE_MATRIX_SCALINGS: dict[str, Callable[..., Any]] = {}


# ---- the typed parameters of the steps: what a renderer or a check reads (never the formula text) ----


class Scale(NamedTuple):
    """scaled = scores · factor / temperature (``factor`` None: no rule; an array for 'norm')."""

    factor: Any
    temperature: float | None
    name: str = "none"  # the rule: a key of attncli.core.scoring.SCALINGS, or "scale" (--scale)
    d: int = 0  # the widths the rule reads
    n: int = 0

    @property
    def rule(self) -> tuple[Term, ...]:
        """The rule, e.g. S / √d = S / √4."""
        return scale_rule(self.name, self.factor, self.d, self.n)

    def formula(self) -> Formula:
        t, rule = self.temperature, self.rule
        if t is None:
            return formula([Name("scaled"), " = ", rule])
        if self.factor is not None:
            return formula([Name("scaled"), " = (", rule, ") / T = (", rule, ") / ", Num(t)])
        return formula([Name("scaled"), " = S / T = S / ", Num(t)])


class Cap(NamedTuple):
    """capped = c · tanh(s / c)."""

    c: float
    before: str = "scaled"

    def formula(self) -> Formula:
        c = Num(self.c)
        return formula([Name("capped"), " = ", c, " · ", Fn("tanh"), "(", Name(self.before), " / ", c, ")"],
                       [": ", Words("scores squashed into "), "(-", c, ", ", c, ")"])


class Alibi(NamedTuple):
    """ALiBi's bias in the form ``form`` (attncli.core.alibi.FORMS): slope_h · (j - (P + i)) per query head h,
    query i at position P + i, or a model's rounding of slope_h · j; ``r``: what it is divided by when the model
    adds it before the scale (--alibi-scaled: the scale's reciprocal, √d for Falcon), else None."""

    slopes: tuple[float, ...]
    q_offset: int
    given: bool = False  # the slopes came with the input (else the form's for the head count)
    form: str = "relative"
    r: float | None = None

    def value(self, h: int, i: int, j: int) -> float:
        """The bias added at query head ``h``, query ``i``, key ``j`` (recomputed, for explanations)."""
        b = alibi.bias(self.form, [self.slopes[h]], [self.q_offset + i], [j], 1.0 if self.r is None else self.r)
        return float(b[0, 0, 0])


class RelativeBias(NamedTuple):
    """T5's bias b[bucket(j - (P + i)), h] of each query head h."""

    heads: int
    num_buckets: int
    max_distance: int
    bidirectional: bool
    q_offset: int = 0


class Bias(NamedTuple):
    """The biases added to the scores: ALiBi and/or T5's relative position bias."""

    alibi: Alibi | None = None
    relative: RelativeBias | None = None
    before: str = "scaled"

    def formula(self) -> Formula:
        prev, al = Name(self.before), self.alibi
        if self.relative is None and al is not None:
            given = ", slopes given" if al.given else ""
            scaled = [] if al.r is None else [Words("; the model adds it to q·k before its scale, so it is divided here by "),
                                              divisor(al.r), Words(" after the rounding (a float32 division)")
                                              if al.form != "relative" else None]
            if al.form == "relative":
                over = [" / ", divisor(al.r)] if al.r is not None else []
                return formula([Name("alibi"), " = ", prev, " + ", alibi_terms(al), " = ", prev, " - ",
                                Sub("slope", "h"), " · distance", over], [Words(f" (ALiBi{given})"), scaled])
            return formula([Name("alibi"), " = ", prev, " + ", alibi_terms(al)],
                           [": ", Words(f"ALiBi with key j at its absolute position, as {alibi.FORMS[al.form].source}"),
                            scaled, Words(f"{given}; the same weights as "), Sub("slope", "h"),
                            Words(" · (j - i) up to that rounding")])
        added = [" + ", alibi_terms(al)] if al is not None else []
        return formula([Name("bias"), " = ", prev, added, " + ", Sub("b", "h"), "[", Fn("bucket"), "(j - i)]"],
                       [": ", Words(f"T5's relative position bias ({self.relative.num_buckets if self.relative else 0} "
                                    "buckets)")])


class Mask(NamedTuple):
    """masked = s (+ float mask), the keys that no mask keeps at ``fill``."""

    fill: float
    float_mask: bool
    window: int | None
    causal: bool
    chunk: int | None = None  # chunked attention: keys of the query's own chunk of C positions only
    local: int | None = None  # local window on both sides: keys with |j - (P + i)| <= R only
    before: str = "scores"

    def formula(self) -> Formula:
        prev = self.before if self.before in (N.CAPPED, N.ALIBI, N.BIAS) else N.SCORES
        w, c, r = self.window, self.chunk, self.local
        window = [Words(f"; the sliding window keeps the {w} keys up to each query")] if w is not None else []
        chunk = [Words(f"; chunked: query i sees key j only when j // {c} == (P + i) // {c}, its own chunk of {c} "
                       "positions, up to itself")] if c is not None else []
        local = [Words(f"; the local window keeps the keys within {r} positions on either side, |j - (P + i)| <= {r} "
                       f"({2 * r + 1} keys, itself included, fewer at the ends)")] if r is not None else []
        return formula([Name("masked"), " = ", Name(str(prev)), Words(" with masked keys set to "), Num(self.fill)],
                       [Words(" (+ float mask)") if self.float_mask else None, window, chunk, local])


# ---- what a block of queries brings: its masks and biases, computed once per block of rows ----


@dataclass(frozen=True)
class Block:
    """The queries ``i`` (indices into the problem's m) against the keys ``j``, with their keep-mask,
    float mask and bias terms broadcastable to (..., b, n_c) on the backend, and ``c``, the number the
    scores are multiplied by (factor / temperature), when known before the scores (else None)."""

    p: Problem
    be: Backend
    i: np.ndarray  # (b,) query indices
    j: np.ndarray  # (n_c,) key indices
    keep: Any = None
    bias: Any = None  # the float mask (and float key padding)
    alibi: Any = None  # (H, b, n_c) or (b, n_c)
    relative: Any = None  # (H, b, n_c) or (b, n_c)
    c: Any = None

    def cols(self, cols: slice) -> Block:
        """The same queries against the keys ``cols`` only."""
        if cols == slice(None):
            return self

        def chunk(a: Any) -> Any:
            return a if a is None or a.shape[-1] == 1 else a[..., cols]

        return replace(self, j=self.j[cols], keep=chunk(self.keep), bias=chunk(self.bias), alibi=chunk(self.alibi),
                       relative=chunk(self.relative))


def block(p: Problem, be: Backend, rows: Rows = None, c: Any = None) -> Block:
    """The :class:`Block` of the queries ``rows`` (all, i0..i1-1, or an index array) against every key."""
    i = np.arange(*rows) if isinstance(rows, tuple) else np.arange(p.m) if rows is None else np.asarray(rows)
    keep, bias = ops.masks(p, be, rows=rows)
    ab = ops.alibi_rows(p, rows, alibi_divisor(p) or 1.0)
    rb = relative_rows(p, i)
    return Block(p, be, i, np.arange(p.n), keep, bias, None if ab is None else be.asarray(ab, p.dtype),
                 None if rb is None else be.asarray(rb, p.dtype), c)


def relative_rows(p: Problem, i: np.ndarray) -> np.ndarray | None:
    """T5's relative position bias of the queries ``i`` against every key: (H, b, n), (b, n) with one head."""
    rb = p.relative_bias
    if rb is None:
        return None
    rel = np.arange(p.n)[None, :] - (p.query_offset + i)[:, None]  # (1, n) - (b, 1) -> (b, n)
    bucket = heads.t5_bucket(rel, rb.bidirectional, rb.num_buckets, rb.max_distance)  # (b, n)
    b = np.moveaxis(np.asarray(rb.table, dtype=np.float64)[bucket], -1, 0)  # (b, n, H) -> (H, b, n)
    return b if p.batch_shape else b[0]


# ---- the stages: one entry each, in the pipeline's order ------------------------------------------

Support = bool | Callable[["Problem"], bool]
StageFn = Callable[[Block, Any], tuple[Any, Any]]  # (block, s) -> (s, the step's parameters)
QKFn = Callable[["Problem", Backend, Any, Any], tuple[Any, Any]]  # (problem, backend, q, k) -> (q, k)
WeightsFn = Callable[["Problem", Backend, Any], Any]  # (problem, backend, weights) -> weights


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline. ``fn``: its part of the chain before the softmax (None: a stage
    applied before it, on q and k, or after it, on the weights). ``blocked`` / ``sdpa``: whether the
    blocked path / PyTorch's fused kernel computes it (for the problems it applies to). ``bounded``:
    it keeps |s| within the Cauchy–Schwarz bound of the dot product (the blocked path's softmax may
    then skip the running max)."""

    name: N
    applies: Callable[[Problem], bool]
    fn: StageFn | None = None
    blocked: Support = True
    sdpa: Support = True
    bounded: bool = False
    qk: QKFn | None = None  # a stage on each head's q and k, before the scores (every path: computed once)
    weights: WeightsFn | None = None  # a stage on the softmax's weights (the explicit path only)
    after: Callable[[Problem], N | None] | None = None  # the stage it follows for this problem (else its place here)

    def step(self, p: Problem) -> N:
        """The name of its step for ``p`` (the bias step is 'alibi' when ALiBi is the only bias)."""
        if self.name == N.BIAS and p.relative_bias is None:
            return N.ALIBI
        return self.name


def _ok(support: Support, p: Problem) -> bool:
    return support if isinstance(support, bool) else support(p)


# 0) on q and k: QK-norm, RoPE, Llama 4's tuning of q (the problem's options say which and in what order)


def norm_param(be: Backend, a: Any, dt: str) -> Any:
    """A QK-norm weight or bias as it broadcasts over (..., H, T, d): (d,) as is, (H, d) as (H, 1, d)."""
    x = be.asarray(a, dt)
    return be.xp.reshape(x, (int(x.shape[0]), 1, int(x.shape[1]))) if np.ndim(a) == 2 else x


def qk_norm_weights(p: Problem, name: str) -> tuple[Any, Any]:
    """The QK-norm weight of ``name`` (q or k) on the host (ones, zeros for rms1p, where none is given) and its bias."""
    wt = getattr(p, f"{name}_norm")
    return (np.full(p.d_qk, 0.0 if p.options.qk_norm == "rms1p" else 1.0) if wt is None else wt,
            getattr(p, f"{name}_norm_bias"))


def _normalise(p: Problem, be: Backend, q: Any, k: Any) -> tuple[Any, Any]:
    o = p.options

    def norm(name: str, a: Any) -> Any:  # (..., H, T, d) -> (..., H, T, d)
        wt, bias = qk_norm_weights(p, name)
        b = None if bias is None else norm_param(be, bias, p.dtype)
        return ops.qk_norm(be.xp, a, str(o.qk_norm), norm_param(be, wt, p.dtype), b, o.norm_eps, o.rms_wide)

    return norm("q", q), norm("k", k)


def _rotary(p: Problem, be: Backend, q: Any, k: Any) -> tuple[Any, Any]:
    rope = ops.rope_of(p)  # q at positions P + i, k at j
    return rope.rotate(be.xp, q, p.query_offset + np.arange(p.m)), rope.rotate(be.xp, k, np.arange(p.n))


def query_factors(p: Problem) -> np.ndarray:
    o = p.options
    assert o.tuning_scale is not None
    return ops.tuning_factors(p.query_offset + np.arange(p.m), o.tuning_scale, o.tuning_floor)  # (m,)


def _tune(p: Problem, be: Backend, q: Any, k: Any) -> tuple[Any, Any]:
    return ops.tuned(be.xp, q, query_factors(p)), k  # (..., m, d) * (m,) -> (..., m, d)


def _norm_after(p: Problem) -> N | None:
    return N.Q_ROT if p.options.qk_norm_at == "after-rope" else None


# 7) on the weights: hard attention, dropout


def _one_hot(p: Problem, be: Backend, w: Any) -> Any:
    return ops.hard(be.xp, w)


def _drop(p: Problem, be: Backend, w: Any) -> Any:
    return ops.dropout(be, w, p.options.dropout, p.options.seed)


# 2) scale


def scaling_name(p: Problem) -> str:
    o = p.options
    return SCALINGS[o.scaling or get_score(o.score).scaling].name


def constant_scale(p: Problem) -> bool:
    return p.options.scale is not None or scaling_name(p) in CONSTANT_SCALINGS


def constant_factor(p: Problem) -> float:
    """The number the raw scores are multiplied by when it depends on d and n only: the rule (or
    --scale) over the temperature."""
    o = p.options
    c = o.scale if o.scale is not None else float(SCALINGS[scaling_name(p)].factor(np, None, p.d_qk, p.n))
    return c / o.temperature if o.temperature is not None else c


def _scale(b: Block, s: Any) -> tuple[Any, Scale]:
    t = b.p.options.temperature
    if b.c is not None:  # known before the scores (the blocked path): factor / T
        return s * b.c, Scale(None, t)
    factor = ops.scale_factor(b.p, b.be.xp, s)
    c = factor if t is None else (1.0 / t if factor is None else factor / t)
    return s * c, Scale(factor, t, scale_name(b.p), b.p.d_qk, b.p.n)


def scale_name(p: Problem) -> str:
    """The scaling rule of ``p``: a key of SCALINGS, or "scale" for --scale."""
    return "scale" if p.options.scale is not None else scaling_name(p)


def scale_rule(name: str, factor: Any, d: int, n: int) -> tuple[Term, ...]:
    """The rule ``name`` (--scale's "scale": S times ``factor``) in symbols, e.g. S / √d = S / √4."""
    if name == "scale":
        return terms("S · ", Num(float(factor)))
    return SCALINGS[name].describe(d, n)


# 3) cap


def _cap(b: Block, s: Any) -> tuple[Any, Cap]:
    c = float(b.p.options.softcap)  # type: ignore[arg-type]
    return ops.softcap(b.be.xp, s, c), Cap(c)


# 4) bias


def _has_bias(p: Problem) -> bool:
    return p.slopes() is not None or p.relative_bias is not None


def alibi_divisor(p: Problem) -> float | None:
    """What ALiBi that the model adds before the scale (--alibi-scaled) is divided by, added after attncli's scale
    step: 1 / the scale (√d for Falcon's 1/√d; in float32 exactly √d for every d below 2^17); else None."""
    if not p.options.alibi_scaled:
        return None
    return 1.0 / constant_factor(p)  # Problem checked that the scale is constant (_Draft._check_alibi_form)


def _bias(b: Block, s: Any) -> tuple[Any, Bias]:
    p = b.p
    P = p.query_offset
    ab = rel = None
    if b.alibi is not None:
        s = s + b.alibi  # (..., H, b, n_c) + (H, b, n_c)
        sl = p.slopes()
        assert sl is not None
        ab = Alibi(tuple(float(x) for x in sl), P, p.alibi_slopes is not None, p.options.alibi_form,
                   alibi_divisor(p))
    if b.relative is not None:
        s = s + b.relative  # (..., H, b, n_c) + (H, b, n_c)
        rb = p.relative_bias
        assert rb is not None
        rel = RelativeBias(int(np.shape(rb.table)[-1]), rb.num_buckets, rb.max_distance, rb.bidirectional, P)
    return s, Bias(ab, rel)


def divisor(r: float) -> Term:
    """The divisor of a form added before the scale as the scale's rule writes it: 8, √12, 0.5."""
    sq = round(r * r)
    return Num(r) if r == round(r) or abs(r * r - sq) > 1e-9 * sq else Root(str(sq))


def alibi_terms(a: Alibi, slope: Term = Sub("slope", "h"), key: Term = Sym("j")) -> tuple[Term, ...]:
    """What ALiBi adds, in symbols, e.g. fl32(fl32(slope_h) · j), fl32(bf16(bf16(slope_h) · bf16(j)) / √8); at one
    head and key with ``slope`` and ``key`` given (the explanations' numbers)."""
    if a.form == "relative":
        t = terms(slope, " · (", key, " - ", f"({a.q_offset} + i)" if a.q_offset else "i", ")")
        return t if a.r is None else terms(t, " / ", divisor(a.r))
    t = alibi.FORMS[a.form].terms(slope, key)
    return t if a.r is None else terms(Fn("fl32"), "(", t, " / ", divisor(a.r), ")")


# 5) mask


def _has_mask(p: Problem) -> bool:
    o = p.options
    return (p.query_limit is not None or o.causal or o.window is not None or o.chunk is not None
            or o.local_window is not None or p.mask is not None or p.padding is not None)


def _mask(b: Block, s: Any) -> tuple[Any, Mask]:
    o = b.p.options
    fill = ops.fill_value(b.p)
    return ops.apply_mask(b.be.xp, s, b.keep, b.bias, fill), Mask(fill, b.bias is not None, o.window, o.causal,
                                                                      o.chunk, o.local_window)


# which paths: the conditions of the score and the scale


def _row_separable(p: Problem) -> bool:
    return bool(getattr(get_score(p.options.score).fn, "row_separable", True))


def _dot(p: Problem) -> bool:
    return get_score(p.options.score).name in DOT_SCORES


def _blocked_scale(p: Problem) -> bool:
    return constant_scale(p) or scaling_name(p) in WHOLE_MATRIX_SCALINGS


def _sdpa_mask(p: Problem) -> bool:
    return p.options.mask_value is None  # SDPA masks at -inf only


def _scale_applies(p: Problem) -> bool:
    o = p.options
    return o.scale is not None or scaling_name(p) != "none" or o.temperature is not None


STAGES: tuple[Stage, ...] = (
    # on q and k, before either path; QK-norm after RoPE where the options say so (HunYuan, nanochat, Llama 4)
    Stage(N.Q_NORM, lambda p: p.options.qk_norm is not None, bounded=True, qk=_normalise, after=_norm_after),
    Stage(N.Q_ROT, lambda p: p.options.rope is not None, bounded=True, qk=_rotary),
    Stage(N.Q_TEMP, lambda p: p.options.tuning_scale is not None, bounded=True, qk=_tune),  # a factor per query, on q
    Stage(N.SCORES, lambda p: True, blocked=_row_separable, sdpa=_dot, bounded=True),  # 1) score: logits' first line
    Stage(N.SCALED, _scale_applies, _scale, blocked=_blocked_scale, sdpa=constant_scale, bounded=True),
    Stage(N.CAPPED, lambda p: p.options.softcap is not None, _cap, sdpa=False, bounded=True),
    Stage(N.BIAS, _has_bias, _bias, sdpa=False),
    Stage(N.MASKED, _has_mask, _mask, sdpa=_sdpa_mask, bounded=True),
    # the softmax's extra logit: computed by the softmax of each path (ops.softmax_of, OnlineSoftmax.add_sinks)
    Stage(N.SINK, lambda p: p.sinks is not None, sdpa=False),
    Stage(N.HARD, lambda p: p.options.hard, blocked=False, sdpa=False, weights=_one_hot),
    Stage(N.DROPOUT, lambda p: p.options.dropout > 0, blocked=False, sdpa=False, weights=_drop),
)


# the names of the steps from the score to the softmax's input, in the chain's order (the bias step is
# 'alibi' when ALiBi is its only term)
LOGIT_STEPS: tuple[N, ...] = tuple(n for st in STAGES if st.name == N.SCORES or st.fn is not None
                                   for n in ((N.ALIBI, N.BIAS) if st.name == N.BIAS else (st.name,)))


def softmax_input(names: Any) -> N:
    """The last step of the chain among ``names``: what the softmax took."""
    return [n for n in LOGIT_STEPS if n in names][-1]


def needed(p: Problem) -> list[Stage]:
    """The stages ``p`` needs, in the order its options decide (a stage whose ``after`` names another needed stage
    comes right after it: QK-norm after RoPE)."""
    out = [st for st in STAGES if st.applies(p)]
    for st in list(out):
        follows = None if st.after is None else st.after(p)
        if follows is not None and any(t.name == follows for t in out):
            out.remove(st)
            out.insert(next(i for i, t in enumerate(out) if t.name == follows) + 1, st)
    return out


def supports(p: Problem, path: str) -> bool:
    """Whether the path ('blocked' or 'sdpa') computes every stage ``p`` needs."""
    return all(_ok(getattr(st, path), p) for st in needed(p))


def bounded(p: Problem) -> bool:
    """Whether every stage ``p`` needs keeps the scores within the dot product's bound."""
    return all(st.bounded for st in needed(p))


# ---- the chain ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Logits:
    """What :func:`logits` returns: ``s`` the scores the softmax takes (..., b, n_c), ``keep`` the keys kept
    (or None), ``unmasked`` s before the mask, ``raw`` the score itself (times c when ``folded``)."""

    s: Any
    keep: Any
    unmasked: Any
    raw: Any
    folded: bool


Record = Callable[[Stage, Any, Any], None]  # (stage, its value, its parameters)


def logits(p: Problem, q: Any, k: Any, params: dict[str, Any], b: Block, record: Record | None = None,
           trace: Trace | None = None) -> Logits:
    """Everything before the softmax for the queries ``q`` (..., b, d) against the keys ``k`` (..., n_c, d)
    of the block ``b``: the stages of :data:`STAGES` that have a part here, in order. ``record`` hears
    each stage's value and parameters (the explicit path's steps); ``trace``: the score's own steps."""
    fold = record is None and b.c is not None and _dot(p)  # (c·q)·k = c·(q·k): one multiply on (b, d), not (b, n)
    if fold:
        q = q * b.c
    s = ops.score(p, b.be.xp, q, k, params, trace)  # 1) score: (..., b, d) x (..., n_c, d) -> (..., b, n_c)
    raw, unmasked = s, s
    if record is not None:
        record(next(st for st in STAGES if st.name == N.SCORES), s, None)
    for st in STAGES:  # 2) scale, 3) cap, 4) bias, 5) mask, and any stage registered between them
        if st.fn is None or not st.applies(p) or (fold and st.name == N.SCALED):
            continue
        if st.name == N.MASKED:
            unmasked = s
        s, par = st.fn(b, s)
        if record is not None:
            record(st, s, par)
    if not any(st.name == N.MASKED and st.applies(p) for st in STAGES):
        unmasked = s
    return Logits(s, b.keep, unmasked, raw, fold)
