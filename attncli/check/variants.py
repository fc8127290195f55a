"""The catalogue of well-known attention variants and mistakes, for ``attncli check``.

Each entry is a small function registered with ``@variant(name, explanation)``. Its docstring's
first line is the formula it computes; the explanation says, in words, what went wrong
(``{d}``, ``{sqrt_d}``, ``{d_v}``, ``{n}``, ``{m}``, ``{T}``, for multi-head ``{H}``, ``{d_model}``,
and ``{detail}`` from a :class:`Reproduced` are filled in). It takes a
:class:`Context` (the problem on numpy float64 and the correct computation) and returns the
steps it changes (``{"weights": ..., "output": ...}`` or a whole Trace from a re-run of the
engine with modified options), or :class:`Reproduced` when it fits the expected numbers
itself (dropout), or raises :class:`NotApplicable` saying why it does not apply to these
inputs. Variants reuse the engine (``engine.run`` with ``dataclasses.replace``d options,
``ops.softmax``, ``ops.scale_factor``, ``ops.merge_heads``) rather than re-implementing attention.

Add one by writing a function here (or anywhere, before ``diagnose`` runs) with the decorator;
``tests/test_variants.py`` then needs a case that computes its mistake by hand.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attncli.check.compare import Explanation, Tolerance, errors, within
from attncli.core import chain, ops
from attncli.core.backend import get_backend
from attncli.core.engine import produce, run
from attncli.core.layer import Layer, Subject
from attncli.core.options import Options
from attncli.core.plan import Plan
from attncli.core.problem import Problem
from attncli.core.scoring import get_score
from attncli.core.trace import StepName, Trace
from attncli.errors import AttnError

Result = Any  # dict[str, np.ndarray] | Trace | Reproduced | None (tried, no fit)
SUBSET_BUDGET = 2 ** 22  # rows × 2^n × d_v cells the dropout search may visit on the output
MAX_DROPOUT_KEYS = 14
MAX_SCALES = 64  # candidate scales 1/(1-p) tried on the output
MAX_PERMUTED_HEADS = 6  # heads-wrong-order tries every order of up to this many heads


class NotApplicable(Exception):
    """The variant does not apply to these inputs (the message says why)."""


@dataclass
class Reproduced:
    """A variant that fits the expected numbers by itself: its largest error and what it found."""

    max_abs_error: float
    detail: str


@dataclass(frozen=True)
class Variant:
    name: str
    fn: Callable[[Context], Result]
    explanation: str
    possible: bool = False  # reported as a possibility, not a reproduction
    pairable: bool = True  # tried as the second mistake of a pair (False: a search of its own, too costly)
    local: bool = True  # each query's row of its result depends on that query alone (screened on sampled rows)

    @property
    def formula(self) -> str:
        return (self.fn.__doc__ or self.name).strip().splitlines()[0]


VARIANTS: dict[str, Variant] = {}


VariantFn = Callable[["Context"], Result]


def variant(name: str, explanation: str, possible: bool = False, pairable: bool = True,
            local: bool = True) -> Callable[[VariantFn], VariantFn]:
    """Register a variant under ``name`` with the sentence that explains it (``local=False``: a row of its result
    depends on other queries too, so it cannot be screened on sampled rows)."""

    def deco(fn: VariantFn) -> VariantFn:
        VARIANTS[name] = Variant(name, fn, explanation, possible, pairable and not possible, local)
        return fn

    return deco


@dataclass
class Context:
    """What a variant gets: the problem (numpy, float64; single- or multi-head), the expected
    numbers, the compared step, the tolerance and (lazily) the correct computation."""

    problem: Subject  # a core Problem, or a Layer (projections and heads) that produces one
    expected: np.ndarray
    what: str
    tol: Tolerance
    _ref: Trace | None = None
    changed: Subject | None = None  # the problem the last rerun computed (a variant that is only a change)
    note: str = ""  # what a variant found (a fitted base), for its explanation's {detail}
    hint: str | None = None  # the options that make the problem match, when a variant found them
    correct: np.ndarray | None = None  # for a pair's second mistake: the correct result of the original problem
    rows: tuple[int, ...] | None = None  # only these queries are computed (a sampled screen); expected holds them
    _heads: Problem | None = None  # a Layer's heads with their numbers (heads_problem), computed once

    @classmethod
    def of(cls, subject: Subject, expected: np.ndarray, what: str, tol: Tolerance,
           rows: tuple[int, ...] | None = None) -> Context:
        o = replace(subject.options, backend="numpy", device="cpu", dtype="float64", keep_weights=True)
        return cls(replace(subject, options=o, result_dtype=None), expected, what, tol, rows=rows)

    @property
    def plan(self) -> Plan | None:
        return None if self.rows is None else Plan("explicit", self.rows)

    @property
    def ref(self) -> Trace:
        """The correct computation on numpy float64 (of the sampled rows alone with ``rows``)."""
        if self._ref is None:
            self._ref = run(self.problem, self.plan)
        return self._ref

    @property
    def heads(self) -> bool:
        return isinstance(self.problem, Layer)

    @property
    def core(self) -> Problem:
        """The problem of the attention itself: this one, or the one a Layer produces (its Q, K, V
        zeros of their shapes: for masks, scales and sizes, not numbers)."""
        return self.problem.problem() if isinstance(self.problem, Layer) else self.problem

    def single(self) -> Problem:
        """The single-head Problem, or NotApplicable for multi-head attention."""
        if isinstance(self.problem, Layer):
            raise NotApplicable("single-head attention only")
        return self.problem

    def multi(self) -> Layer:
        """The multi-head Layer (projections and heads), or NotApplicable."""
        if not isinstance(self.problem, Layer):
            raise NotApplicable("multi-head attention only")
        return self.problem

    @property
    def options(self) -> Options:
        return self.problem.options

    def rerun(self, problem: Subject | None = None, **options: Any) -> Trace:
        """The pipeline on ``problem`` (default: this one) with ``options`` replaced."""
        p = problem or self.problem
        self.changed = replace(p, options=replace(p.options, **options))
        return run(self.changed, self.plan)

    @property
    def d(self) -> int:
        """The query/key width the scaling uses (per head for multi-head)."""
        return self.problem.d_qk

    @property
    def d_v(self) -> int:
        p = self.problem
        return p.projections.d_v // p.heads if isinstance(p, Layer) else int(p.v.shape[-1])

    @property
    def m(self) -> int:
        return int(self.problem.m)

    @property
    def n(self) -> int:
        return int(self.ref["weights"].shape[-1])

    def factor(self) -> Any:
        """The factor the engine multiplies the scores by (None: no scaling)."""
        return ops.scale_factor(self.core, np, self.ref["scores"])

    def before_softmax(self) -> np.ndarray:
        """The scores the softmax gets (scaled and masked, masked entries at -inf or the mask value)."""
        if "scores" not in self.ref:
            raise NotApplicable("no scores")  # pragma: no cover
        return self.ref[chain.softmax_input(self.ref)]

    def facts(self) -> dict[str, Any]:
        o = self.options
        facts = {"d": self.d, "sqrt_d": f"{math.sqrt(self.d):.4g}", "d_v": self.d_v, "n": self.n, "m": self.m,
                 "T": f"{o.temperature:g}" if o.temperature else "1"}
        if isinstance(self.problem, Layer):
            facts.update(H=self.problem.heads, d_model=self.problem.projections.d_k)
        return facts

    def with_output(self, weights: np.ndarray) -> dict[str, np.ndarray]:
        """These weights and the output they give: weights @ V (then, for multi-head, concat and W_o)."""
        if not self.heads:
            with np.errstate(invalid="ignore", over="ignore"):  # inf weights (exp without the max) give inf/NaN
                return {"weights": weights, "output": weights @ self.single().v}  # (..., m, n) x (..., n, d_v) -> (..., m, d_v)
        return {"weights": weights, **self.finish(weights @ self.values())}  # (..., H, T, S) x (..., H, S, d_v/H)

    def values(self) -> np.ndarray:
        """Each query head's values, as the weights multiply them: (..., H, n, d_v) (per head for multi-head;
        grouped-query K/V heads repeated, as HF repeat_kv)."""
        if not self.heads:
            p = self.single()
            return np.repeat(p.v, p.n_rep, axis=-3) if p.n_rep > 1 else p.v
        v = self.ref["v_clip" if "v_clip" in self.ref else "v"]  # (B, S, G·d) or unbatched (S, G·d); OLMo: clamped
        layer = self.multi()
        G = layer.kv_heads or layer.heads  # grouped-query: G K/V heads, query head h reads K/V head h // (H / G)
        vh = ops.split_heads(np, v if v.ndim == 3 else v[None], G)  # (B, G, S, d)
        vh = np.repeat(vh, layer.heads // G, axis=1) if G != layer.heads else vh  # (B, H, S, d), as HF repeat_kv
        return vh if v.ndim == 3 else vh[0]

    def heads_problem(self) -> Problem:
        """The attention of the heads with their numbers: this single-head problem, or the core Problem a Layer
        produces (its projections computed: Q (B, H, T, d), K and V (B, G, S, d), on numpy float64)."""
        if not isinstance(self.problem, Layer):
            return self.problem
        if self._heads is None:
            self._heads = produce(self.problem)
        return self._heads

    def attend(self, problem: Problem) -> Result:
        """``problem`` (:meth:`heads_problem` changed) computed as this problem's heads: a re-run for a single-head
        problem (a change of the problem, composable into pairs); for a Layer, its heads' weights and outputs,
        concatenated and projected by W_o as the layer does (:meth:`finish`)."""
        if not isinstance(self.problem, Layer):
            return self.rerun(problem)
        t = run(problem, self.plan)
        heads = np.asarray(t["output"]).reshape(self.ref["head_output"].shape)  # (B, H, T, d_v/H); unbatched: no B
        return {"weights": np.asarray(t["weights"]).reshape(self.ref["weights"].shape), **self.finish(heads)}

    def finish(self, heads: np.ndarray, order: Any = None, transpose: bool = True) -> dict[str, np.ndarray]:
        """Multi-head: per-head outputs (..., H, T, d_v/H) concatenated (in ``order``) and projected by W_o."""
        if order is not None:
            heads = heads[..., list(order), :, :]
        H, T, dh = heads.shape[-3:]
        if transpose:
            four = heads if heads.ndim == 4 else heads[None]
            concat = ops.merge_heads(np, four)  # (B, H, T, dh) -> (B, T, d_v)
            concat = concat if heads.ndim == 4 else concat[0]
        else:
            concat = heads.reshape(heads.shape[:-3] + (T, H * dh))  # (..., H, T, dh) read as (..., T, d_v): no transpose
        out = concat
        if "gated" in self.ref:  # AFMoE / Laguna: the output gate, as the reference computed it, before W_o
            out = ops.gated(np, out, self.ref["gate"])
        sub = self.problem.sub_norm if isinstance(self.problem, Layer) else None
        if sub is not None:  # BitNet: the RMSNorm of the concatenated heads before W_o
            out = ops.rms_norm(np, out, sub.w, sub.eps)
        if "W_o" in self.ref:
            out = ops.project(np, out, self.ref["W_o"], self.ref["b_o"][0] if "b_o" in self.ref else None)
        return {"head_output": heads, "concat": concat, "output": out}

    def requires_scaling(self) -> Any:
        f = self.factor()
        if f is None:
            raise NotApplicable("the scores are not scaled here")
        return f

    def requires_sqrt_d(self) -> None:
        o = self.options
        rule = o.scaling or get_score(o.score).scaling
        if o.scale is not None or rule != "sqrt-d":
            raise NotApplicable("the scaling here is not 1/√d")

    def requires_keep_mask(self) -> None:
        p = self.problem
        o = p.options
        if p.query_limit is None and not o.causal and o.window is None and o.chunk is None and o.local_window is None \
                and (p.mask is None or p.mask.dtype != bool) and (p.padding is None or p.padding.dtype != bool):
            raise NotApplicable("no keys are masked (no valid lengths, boolean mask or causal mask)")


# ---- scaling --------------------------------------------------------------------------

@variant("no-scaling", "the scores were not scaled: softmax was applied to QKᵀ without dividing by √d = {sqrt_d}")
def no_scaling(c: Context) -> Result:
    """softmax(QKᵀ)·V"""
    c.requires_scaling()
    return c.rerun(scale=None, scaling="none")


@variant("scaled-unscaled-score", "the scores were divided by √d = {sqrt_d} although this score is not scaled")
def extra_scaling(c: Context) -> Result:
    """softmax(QKᵀ / √d)·V for a score without scaling"""
    if c.factor() is not None:
        raise NotApplicable("the scores are already scaled")
    if not get_score(c.options.score).same_width:
        raise NotApplicable("not a dot-product score")
    return c.rerun(scaling="sqrt-d")


@variant("scale-by-d", "the scores were divided by d = {d} instead of √d = {sqrt_d}")
def scale_by_d(c: Context) -> Result:
    """softmax(QKᵀ / d)·V"""
    c.requires_sqrt_d()
    if c.d == 1:
        raise NotApplicable("d = 1, so d = √d")
    return c.rerun(scale=1.0 / c.d)


@variant("sqrt-value-width", "√d was taken from the value width d_v = {d_v} instead of the query/key width d = {d}")
def sqrt_value_width(c: Context) -> Result:
    """softmax(QKᵀ / √d_v)·V"""
    c.requires_sqrt_d()
    if c.d_v == c.d:
        raise NotApplicable("V has the same width as Q and K")
    return c.rerun(scale=1.0 / math.sqrt(c.d_v))


@variant("sqrt-key-count", "the scores were divided by √n = √{n}, the number of keys (the wrong axis of K), "
                           "instead of √d = {sqrt_d}")
def sqrt_key_count(c: Context) -> Result:
    """softmax(QKᵀ / √n)·V"""
    c.requires_sqrt_d()
    if c.n == c.d:
        raise NotApplicable("n equals d")
    return c.rerun(scale=1.0 / math.sqrt(c.n))


@variant("scale-after-softmax", "the scaling was applied after the softmax instead of to the scores: "
                                "softmax(QKᵀ) and the output were divided by √d = {sqrt_d}")
def scale_after_softmax(c: Context) -> Result:
    """softmax(QKᵀ)·V / √d"""
    o = c.options
    if o.scale is None and (o.scaling or get_score(o.score).scaling) == "none":
        raise NotApplicable("the scores are not scaled here")
    t = c.rerun(scale=None, scaling="none")
    f = ops.scale_factor(c.core, np, t["scores"])  # the rerun's raw scores are the reference's: no reference run
    return c.with_output(t["weights"] * f)  # (W·f)·V = (W·V)·f


@variant("temperature-multiplied", "the scores were multiplied by the temperature T = {T} instead of divided by it")
def temperature_multiplied(c: Context) -> Result:
    """softmax(S · T)·V"""
    t = c.options.temperature
    if t is None or t == 1:
        raise NotApplicable("no temperature (or T = 1)")
    return c.rerun(temperature=1.0 / t)


# ---- softmax --------------------------------------------------------------------------

@variant("softmax-over-queries", "the softmax ran over the wrong axis: over the queries (columns of each key "
                                 "sum to 1) instead of over the keys", local=False)
def softmax_over_queries(c: Context) -> Result:
    """softmax(QKᵀ / √d, axis=queries)·V"""
    if c.m == 1:
        raise NotApplicable("a single query: the softmax over queries is constant")
    s = c.before_softmax()
    w = np.swapaxes(ops.softmax(np, np.swapaxes(s, -1, -2)), -1, -2)
    return c.with_output(w)


@variant("q-k-swapped", "Q and K were swapped: the weights are softmax(K Qᵀ / √d), the transposed scores, "
                        "normalised over the queries' positions")
def q_k_swapped(c: Context) -> Result:
    """softmax(K Qᵀ / √d)·V"""
    if c.heads:  # self-attention: swapping Q and K is swapping W_q and W_k
        mh = c.multi()
        proj = mh.projections
        if proj.latent is not None:
            raise NotApplicable("multi-head latent attention: Q and K come from different latents")
        if mh.memory is not mh.x or proj.W_q.shape != proj.W_k.shape:
            raise NotApplicable("cross-attention: Q and K come from different inputs")
        swapped = replace(proj, W_q=proj.W_k, W_k=proj.W_q, b_q=proj.b_k, b_k=proj.b_q)
        return c.rerun(replace(mh, projections=swapped))
    p = c.single()
    if p.m != p.n:
        raise NotApplicable("Q and K have different numbers of rows, so K Qᵀ does not fit V")
    if p.q.shape == p.k.shape and np.array_equal(p.q, p.k):
        raise NotApplicable("Q and K are the same matrix")
    return c.rerun(replace(p, q=p.k, k=p.q))


@variant("unnormalised-weights", "the weights were not normalised: exp(scores) was used without dividing by "
                                 "the row sums")
def unnormalised(c: Context) -> Result:
    """exp(QKᵀ / √d)·V"""
    with np.errstate(over="ignore"):
        return c.with_output(np.exp(c.before_softmax()))


@variant("no-softmax", "the softmax was left out: the (scaled) scores were used as weights")
def no_softmax(c: Context) -> Result:
    """(QKᵀ / √d)·V"""
    s = c.before_softmax()
    return c.with_output(np.where(np.isinf(s), 0.0, s))


# ---- masks ----------------------------------------------------------------------------

@variant("mask-inverted", "the mask's meaning was inverted: {flipped}")
def mask_inverted(c: Context) -> Result:
    """softmax(S + (1 - M)·-inf)·V"""
    p = c.problem
    mask = p.mask
    if (mask is None or mask.dtype != bool) and p.padding is not None and p.padding.dtype == bool:
        return c.rerun(replace(p, padding=~p.padding))  # True = keep instead of ignore
    if mask is None or np.asarray(mask).dtype != bool:
        raise NotApplicable("no boolean mask")
    return c.rerun(mask_convention="drop" if c.options.mask_convention == "keep" else "keep")


@variant("key-padding-inverted", "the key padding mask's meaning was inverted: its True entries (ignore, as PyTorch) "
                                 "were kept and the others ignored")
def key_padding_inverted(c: Context) -> Result:
    """softmax(S with the padding keys kept and the others masked)·V"""
    p = c.problem
    if p.padding is None or p.padding.dtype != bool:
        raise NotApplicable("no boolean key padding mask")
    if p.mask is None or p.mask.dtype != bool:
        raise NotApplicable("the only mask: mask-inverted covers it")
    return c.rerun(replace(p, padding=~p.padding))


def _valid_lens_shifted(c: Context, by: int) -> Result:
    p = c.problem
    if p.query_limit is None:
        raise NotApplicable("no valid lengths")
    limit = np.clip(p.query_limit + by, 0, p.n)
    if np.array_equal(limit, p.query_limit):
        raise NotApplicable(f"valid lengths {by:+d} change nothing here")
    return c.rerun(replace(p, valid_lens=np.broadcast_to(limit, p.batch_shape + (p.m,))))  # the limit itself


@variant("valid-lens-plus-one", "the valid lengths were off by one: one key more than the valid length took part "
                                "(e.g. <= instead of < in the mask)")
def valid_lens_plus_one(c: Context) -> Result:
    """softmax(S masked at keys j > valid_len)·V"""
    return _valid_lens_shifted(c, +1)


@variant("valid-lens-minus-one", "the valid lengths were off by one: one key fewer than the valid length took part")
def valid_lens_minus_one(c: Context) -> Result:
    """softmax(S masked at keys j >= valid_len - 1)·V"""
    return _valid_lens_shifted(c, -1)


@variant("mask-value-1e6", "masked scores were set to a large negative number (-1e6 as d2l, -1e9, or "
                           "torch.finfo(dtype).min) instead of -inf: rows with every key masked (padding rows) got "
                           "uniform weights instead of zeros")
def mask_value_1e6(c: Context) -> Result:
    """softmax(S with masked entries at -1e6)·V"""
    c.requires_keep_mask()
    mv = c.options.mask_value
    if mv is not None and not math.isinf(mv):
        raise NotApplicable("a finite mask value is already used")
    return c.rerun(mask_value=-1e6)


@variant("mask-value-inf", "masked scores were set to -inf (weights 0 on fully masked rows) instead of the "
                           "finite mask value given")
def mask_value_inf(c: Context) -> Result:
    """softmax(S with masked entries at -inf)·V, zero rows where every key is masked"""
    c.requires_keep_mask()
    mv = c.options.mask_value
    if mv is None or math.isinf(mv):
        raise NotApplicable("the mask value is already -inf")
    return c.rerun(mask_value=None)


@variant("nan-on-fully-masked", "masked scores were set to -inf without guarding rows with every key masked: "
                                "their softmax is NaN (as torch.softmax gives)")
def nan_rows(c: Context) -> Result:
    """softmax(S with masked entries at -inf)·V, NaN rows where every key is masked"""
    c.requires_keep_mask()
    s = c.before_softmax()
    dead = np.all(np.isneginf(s), axis=-1, keepdims=True)  # (..., m, 1)
    if not dead.any():
        raise NotApplicable("no row has every key masked")
    w = np.where(dead, np.nan, c.ref["weights"])
    return c.with_output(w)


def _keep_changes(c: Context, problem: Subject) -> bool:
    """Whether ``problem``'s keep-mask differs from this problem's."""
    core = problem.problem() if isinstance(problem, Layer) else problem
    a, _ = ops.keep_mask(c.core, c.problem.n)
    b, _ = ops.keep_mask(core, problem.n)
    shape = c.problem.batch_shape + (c.problem.m, c.problem.n)
    a = np.ones(shape, bool) if a is None else np.broadcast_to(a, shape)
    b = np.ones(shape, bool) if b is None else np.broadcast_to(b, shape)
    return not np.array_equal(a, b)


def _remask(c: Context, problem: Subject) -> Result:
    if not _keep_changes(c, problem):
        raise NotApplicable("it masks the same keys here")
    return c.rerun(problem)


def _with(c: Context, **options: Any) -> Subject:
    return replace(c.problem, options=replace(c.options, **options))


@variant("causal-missing", "the causal mask was left out: every query saw the keys after it too")
def causal_missing(c: Context) -> Result:
    """softmax(S)·V without the causal mask"""
    if not c.options.causal:
        raise NotApplicable("no causal mask here")
    return _remask(c, _with(c, causal=False))


@variant("causal-added", "a causal mask was applied (top-left, as SDPA is_causal) that this attention does not have")
def causal_added(c: Context) -> Result:
    """softmax(S masked at keys j > i)·V"""
    if c.options.causal:
        raise NotApplicable("the causal mask is already there")
    return _remask(c, _with(c, causal=True, causal_align="top-left"))


@variant("causal-added-bottom-right", "a causal mask was applied (bottom-right, as a KV cache: query i sees keys "
                                      "j <= i + {n} - {m}) that this attention does not have")
def causal_added_bottom_right(c: Context) -> Result:
    """softmax(S masked at keys j > i + n - m)·V"""
    if c.options.causal:
        raise NotApplicable("the causal mask is already there")
    if c.m == c.n:
        raise NotApplicable("as many queries as keys: the same as causal-added")
    return _remask(c, _with(c, causal=True, causal_align="bottom-right"))


@variant("causal-bottom-right", "the causal mask was aligned bottom-right (as a KV cache: query i sees keys "
                                "j <= i + {n} - {m}) instead of top-left (SDPA is_causal)")
def causal_bottom_right(c: Context) -> Result:
    """softmax(S masked at keys j > i + n - m)·V"""
    if not c.options.causal or c.options.causal_align == "bottom-right":
        raise NotApplicable("no top-left causal mask here")
    return _remask(c, _with(c, causal_align="bottom-right"))


@variant("valid-lens-ignored", "the valid lengths were ignored: the padding keys after each valid length took part")
def valid_lens_ignored(c: Context) -> Result:
    """softmax(S)·V without the valid lengths"""
    p = c.problem
    if p.query_limit is None:
        raise NotApplicable("no valid lengths")
    return _remask(c, replace(p, valid_lens=None))


@variant("key-padding-ignored", "the key padding mask was ignored: the padding keys took part")
def key_padding_ignored(c: Context) -> Result:
    """softmax(S)·V without the key padding mask"""
    return _without(c, "padding", "no key padding mask")


@variant("mask-ignored", "the mask was not applied: every key it masks took part")
def mask_ignored(c: Context) -> Result:
    """softmax(S)·V without the mask"""
    return _without(c, "mask", "no mask")


def _without(c: Context, name: str, why: str) -> Result:
    """The problem run without its mask ``name`` (mask or padding): a float one is simply not added,
    a boolean one leaves the other masks to say which keys are dropped."""
    p = c.problem
    given = getattr(p, name)
    if given is None:
        raise NotApplicable(why)
    without = replace(p, mask=None) if name == "mask" else replace(p, padding=None)
    return c.rerun(without) if given.dtype != bool else _remask(c, without)


@variant("softmax-in-float16", "the softmax was computed in float16: the scores rounded to float16 (and beyond "
                               "65504 overflowed to inf), the weights too")
def softmax_in_float16(c: Context) -> Result:
    """softmax(float16(S))·V"""
    from attncli.check.precision import softmax_in

    return c.with_output(softmax_in(ops.softmax, c.before_softmax(), "float16"))


@variant("scale-ignored", "the scale given (--scale {scale}, e.g. Gemma's query_pre_attn_scalar^-½) was not used: "
                          "the scores were divided by √d = {sqrt_d}, the head width")
def scale_ignored(c: Context) -> Result:
    """softmax(QKᵀ / √d)·V instead of softmax(QKᵀ · scale)·V"""
    if c.options.scale is None:
        raise NotApplicable("no scale given")
    if abs(c.options.scale * math.sqrt(c.d) - 1) < 1e-12:
        raise NotApplicable("the scale given is 1/√d")
    return c.rerun(scale=None, scaling="sqrt-d")


@variant("query-pre-attn-scalar", "the scores were scaled by (d_model/H)^-½ = {pre_attn}^-½ (Gemma 2's "
                                  "query_pre_attn_scalar, the model width per head) instead of the head width's √{d}")
def query_pre_attn_scalar(c: Context) -> Result:
    """softmax(QKᵀ / √(d_model/H))·V"""
    mh = c.multi()
    c.requires_sqrt_d()
    width = int(mh.x.shape[-1]) / mh.heads
    if width == c.d:
        raise NotApplicable("the model width per head is the head width")
    return c.rerun(scale=1.0 / math.sqrt(width))


# ---- dropout --------------------------------------------------------------------------

@variant("dropout-at-eval", "dropout was left on at evaluation time: {detail}", possible=True)
def dropout_at_eval(c: Context) -> Result:
    """(W ⊙ M)·V / (1 - p), M a 0/1 mask of kept weights"""
    w = c.ref["weights"]
    if c.what == "weights":
        return _dropout_weights(c, w)
    if c.what == "output":
        return _dropout_output(c, w)
    raise NotApplicable(f"dropout does not change the {c.what}")


def _dropout_detail(kept: int, total: int, scale: float) -> str:
    return (f"the expected numbers equal the weights with {total - kept} of {total} entries zeroed and the rest "
            f"multiplied by 1/(1-p) = {scale:.4g} (p ≈ {1 - 1 / scale:.3g}), as nn.Dropout does in training mode")


def _common_scale(e: np.ndarray, y: np.ndarray, tol: Tolerance) -> float | None:
    """The middle of the scales c with |e - c·y| <= atol + rtol·|e| in every cell, or None if there is none.

    Each cell bounds c to an interval; the expected numbers are rounded, so an estimate such as
    least squares can miss by more than the tolerance where the intervals still meet."""
    t = tol.atol + tol.rtol * np.abs(e)
    zero = y == 0
    if np.any(np.abs(e[zero]) > t[zero]):
        return None
    if zero.all():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        b1, b2 = (e - t)[~zero] / y[~zero], (e + t)[~zero] / y[~zero]
    lo, hi = float(np.max(np.minimum(b1, b2))), float(np.min(np.maximum(b1, b2)))
    return (lo + hi) / 2 if lo <= hi else None


def _dropout_weights(c: Context, w: np.ndarray) -> Result:
    """Every expected weight is 0 or c·w with one c > 1 for all, and some nonzero weight was zeroed."""
    e, tol = c.expected, c.tol
    if not np.all(np.isfinite(e)):
        raise NotApplicable("expected holds NaN or infinities")
    big = (np.abs(e) > tol.atol) & (w > 0)
    if not big.any():
        raise NotApplicable("no kept weights to measure the scale from")
    zero_ok = within(e, np.zeros_like(e), tol)
    scale = _common_scale(e[~zero_ok], w[~zero_ok], tol)  # every entry that is not ~0 is c·w
    if scale is None or not scale > 1 + 1e-9:
        return None  # tried: no single scale c > 1 fits the kept weights
    kept_ok = within(e, w * scale, tol)
    dropped = zero_ok & ~kept_ok
    if not np.all(zero_ok | kept_ok) or not dropped.any():
        return None  # tried: zeroing and one scale do not reproduce the weights
    fitted = np.where(dropped, 0.0, w * scale)
    return Reproduced(float(errors(e, fitted).max()), _dropout_detail(int((~dropped).sum()), w.size, scale))


def _dropout_output(c: Context, w: np.ndarray) -> Result:
    """Each expected output row of each head is c·Σ_{j kept} w_ij v_j for one c > 1 (:func:`_dropout_rows`). A
    layer's output is its heads' outputs concatenated and projected by W_o (+ b_o): where W_o keeps every direction
    of the concatenated heads (rank d_v), the expected output is traced back to each head's (least squares), the
    kept weights searched there, and the fit projected forward again and judged on the output itself."""
    e, tol = c.expected, c.tol
    if not np.all(np.isfinite(e)):
        raise NotApplicable("expected holds NaN or infinities")
    v = c.values()  # (..., H, n, d_v): each query head's values
    if not c.heads:
        fit = _dropout_rows(w, v, e, tol, c.d_v)
        if fit is None:
            return None
        rows, kept, scale = fit
        return Reproduced(float(errors(e, scale * rows).max()), _dropout_detail(kept, w.size, scale))
    ref = c.ref
    if "gated" in ref or "sub_norm" in ref:
        raise NotApplicable("an output gate or a norm of the heads before W_o: the heads' outputs cannot be traced back")
    heads = np.asarray(ref["head_output"])  # (..., H, T, d_v/H)
    H = int(heads.shape[-3])
    concat = e if "W_o" not in ref else e - (np.asarray(ref["b_o"])[0] if "b_o" in ref else 0.0)  # (..., T, E)
    gain = 1.0
    if "W_o" in ref:
        w_o = np.asarray(ref["W_o"], dtype=np.float64)  # (d_v, E)
        if np.linalg.matrix_rank(w_o) < w_o.shape[0]:
            raise NotApplicable("W_o loses directions of the concatenated heads: their outputs cannot be traced back")
        pinv = np.linalg.pinv(w_o)  # (E, d_v)
        concat = concat @ pinv  # (..., T, E) x (E, d_v) -> (..., T, d_v)
        gain = float(np.linalg.norm(pinv, 2)) * math.sqrt(w_o.shape[1])  # a cell's error of the output, at most, traced back
    four = concat if concat.ndim == 3 else concat[None]
    eh = ops.split_heads(np, four, H)  # (B, T, d_v) -> (B, H, T, d_v/H)
    eh = eh if concat.ndim == 3 else eh[0]
    bound = (tol.atol + tol.rtol * float(np.abs(e).max())) * gain
    fit = _dropout_rows(w, v, eh, Tolerance(bound, 0.0, tol.origin), c.d_v)
    if fit is None:
        return None
    rows = fit[0].reshape(heads.shape)  # each head's rows, the dropped weights left out, not yet scaled
    b = c.finish(np.zeros_like(heads))["output"]  # b_o alone
    y = c.finish(rows)["output"] - b  # the output is b + scale·y: the scale fitted again on the output itself
    refit = _common_scale(e - b, y, tol) if y.shape == e.shape else None
    if refit is None or not refit > 1 + 1e-9:
        return None  # tried: the heads' fit, projected forward, is not within the tolerance of the output
    return Reproduced(float(errors(e, b + refit * y).max()), _dropout_detail(fit[1], w.size, refit))


def _dropout_rows(w: np.ndarray, v: np.ndarray, e: np.ndarray, tol: Tolerance,
                  d_v: int) -> tuple[np.ndarray, int, float] | None:
    """Each expected row e_i (..., m, d_v) as c·Σ_{j kept} w_ij v_j for one c > 1: search the kept subsets of
    each row; (the rows Σ_{j kept} w_ij v_j, unscaled; the weights kept; c) or None when no choice of dropped weights and scale
    reproduces them."""
    n = int(w.shape[-1])
    shape = w.shape[:-1]  # (..., m)
    v = np.broadcast_to(v, shape[:-1] + v.shape[-2:])  # (..., n, d_v)
    rows = int(np.prod(shape))
    if n > MAX_DROPOUT_KEYS or rows * 2 ** n * d_v > SUBSET_BUDGET:
        raise NotApplicable(f"too many keys ({n}) or rows to search the dropped weights")
    subsets = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(np.float64)  # (2^n, n)
    contrib = w[..., :, None] * v[..., None, :, :]  # (..., m, n, 1) x (..., 1, n, d_v) -> (..., m, n, d_v)
    contrib = contrib.reshape(rows, n, -1)
    ys = np.einsum("sn,rnd->rsd", subsets, contrib)  # (2^n, n) x (R, n, d) -> (R, 2^n, d)
    er = e.reshape(rows, -1)  # (R, d)
    # candidate scales: least-squares c for each (row, subset), from rows that are not ~0
    yy = np.einsum("rsd,rsd->rs", ys, ys)
    ey = np.einsum("rd,rsd->rs", er, ys)
    with np.errstate(divide="ignore", invalid="ignore"):
        cs = np.where(yy > 0, ey / yy, np.nan)
    size = np.abs(er).max(axis=1)
    if not (size > tol.atol).any():
        raise NotApplicable("the expected output is zero")
    r0 = int(np.argmax(size))  # the most informative row proposes the scales
    with np.errstate(invalid="ignore"):
        resid0 = np.abs(er[r0] - cs[r0][:, None] * ys[r0]).max(axis=1)  # (2^n,): row r0 at its own best scale
    loose = 10 * (tol.atol + tol.rtol * float(size[r0]))
    good = np.isfinite(cs[r0]) & (cs[r0] > 1 + 1e-9) & (resid0 <= loose)  # subsets that could explain row r0
    for c0 in np.unique(np.round(cs[r0][good], 6))[:MAX_SCALES]:
        # each row's best subset at this scale, then one least-squares scale for all rows
        choice = np.argmin(np.abs(er[:, None, :] - c0 * ys).max(axis=2), axis=1)  # (R,)
        y = ys[np.arange(rows), choice]  # (R, d)
        found = _common_scale(er, y, tol)
        if found is None or not found > 1 + 1e-9:
            continue
        scale = found
        fit = np.asarray(within(er[:, None, :], scale * ys, tol).all(axis=2))  # (R, 2^n)
        if not fit.any(axis=1).all():
            continue
        full = fit[:, -1]  # the subset with every key kept
        if full.all():
            continue  # the output times a constant, nothing dropped: not dropout
        resid = np.where(fit, np.abs(er[:, None, :] - scale * ys).max(axis=2), np.inf)  # (R, 2^n)
        choice = np.where(full, 2 ** n - 1, np.argmin(resid, axis=1))  # the closest of the subsets that fit
        return ys[np.arange(rows), choice].reshape(e.shape), int(subsets[choice].sum()), scale
    return None


# ---- additive -------------------------------------------------------------------------

@variant("activation-missing", "the activation ({act}) of the additive score was left out: "
                               "w_vᵀ(W_q q + W_k k) instead of w_vᵀ {act}(W_q q + W_k k)")
def activation_missing(c: Context) -> Result:
    """softmax(w_vᵀ (W_q q + W_k k))·V"""
    o = c.options
    if get_score(o.score).name not in ("additive", "location") or not hasattr(o, "activation"):
        raise NotApplicable("not an additive score")
    if (o.activation or "tanh") == "identity":
        raise NotApplicable("the activation is already the identity")
    return c.rerun(activation="identity")


# ---- multi-head ---------------------------------------------------------------------------

@variant("sqrt-model-width", "√d was taken from the model width d_k = {d_model} instead of the head width "
                             "d_k/H = {d} ({H} heads)")
def sqrt_model_width(c: Context) -> Result:
    """concat_h softmax(Q_h K_hᵀ / √d_model)·V_h, then W_o"""
    mh = c.multi()
    c.requires_sqrt_d()
    if mh.heads == 1:
        raise NotApplicable("one head: the head width is the model width")
    return c.rerun(scale=1.0 / math.sqrt(mh.projections.d_k))


@variant("heads-not-transposed", "the heads were concatenated without transposing back: the (heads, tokens, "
                                 "width) array was reshaped straight to (tokens, heads·width)", local=False)
def heads_not_transposed(c: Context) -> Result:
    """reshape(head outputs (H, T, d_v/H) -> (T, d_v))·W_o, without the transpose"""
    if c.multi().heads == 1:
        raise NotApplicable("one head")
    return c.finish(c.ref["head_output"], transpose=False)


@variant("heads-wrong-order", "the heads were concatenated in the wrong order: {detail}", pairable=False)
def heads_wrong_order(c: Context) -> Result:
    """concat(head_{π(0)}, …, head_{π(H-1)})·W_o for a permutation π of the heads"""
    H = c.multi().heads
    if H == 1:
        raise NotApplicable("one head")
    if H > MAX_PERMUTED_HEADS:
        raise NotApplicable(f"{H} heads: too many orders to try")
    if c.what not in ("output", "concat"):
        raise NotApplicable(f"the order of the heads does not change the {c.what}")
    heads = c.ref["head_output"]
    for order in itertools.permutations(range(H)):
        if list(order) == list(range(H)):
            continue
        got = c.finish(heads, order=order)[c.what]
        if got.shape == c.expected.shape and within(c.expected, got, c.tol).all():
            return Reproduced(float(errors(c.expected, got).max()), "head " + ", head ".join(map(str, order)) +
                              " instead of head " + ", head ".join(map(str, range(H))))
    return None


@variant("output-projection-missing", "the output projection W_o (and b_o) was left out: the concatenated heads "
                                      "are the expected output")
def output_projection_missing(c: Context) -> Result:
    """concat(head_0, …, head_{H-1}), without W_o"""
    c.multi()
    if "W_o" not in c.ref or "concat" not in c.ref:
        raise NotApplicable("there is no output projection")
    return {"output": c.ref["concat"]}


# ---- today's models: the classic mistakes of grouped heads, RoPE, windows, soft-capping, sinks ----------

@variant("kv-heads-tiled", "the K/V heads were tiled instead of repeated: query head h read K/V head h % {G} "
                           "(torch .repeat) instead of h // {r} (repeat_interleave, HF repeat_kv, SDPA enable_gqa)")
def kv_heads_tiled(c: Context) -> Result:
    """K/V head h % G for query head h"""
    p = c.problem
    if p.n_rep == 1:
        raise NotApplicable("K and V have as many heads as Q")
    if isinstance(p, Layer):  # W_k's (and W_v's) head blocks side by side r times: block h is h % G
        r, proj = p.n_rep, p.projections
        blocks: dict[str, Any] = {n: np.tile(a, (1, r) if a.ndim == 2 else (r,)) for n in ("W_k", "W_v", "b_k", "b_v")
                                  if (a := getattr(proj, n)) is not None}
        tiled = replace(proj, **blocks)
        return c.rerun(replace(p, projections=tiled), kv_heads=None)
    if p.n_rep == 1:
        raise NotApplicable("K and V have as many heads as Q")
    reps = (1,) * (p.k.ndim - 3) + (p.n_rep, 1, 1)
    return c.rerun(replace(p, k=np.tile(p.k, reps), v=np.tile(p.v, reps)))


def _window_shifted(c: Context, by: int) -> Result:
    w = c.options.window
    if w is None or w + by < 1:
        raise NotApplicable("no sliding window" if w is None else "a window of one key cannot be one smaller")
    return c.rerun(window=w + by)


@variant("window-off-by-one", "the sliding window kept W + 1 = {W1} keys (i - j <= W, as attention-gym's sliding "
                              "window) instead of W = {W} (i - j < W, HF sliding_window, FlashAttention (W-1, 0))")
def window_plus_one(c: Context) -> Result:
    """softmax(S masked outside i - W <= j <= i)·V"""
    return _window_shifted(c, +1)


@variant("window-one-short", "the sliding window kept W - 1 keys instead of W = {W} (each query sees W keys, "
                             "itself included)")
def window_minus_one(c: Context) -> Result:
    """softmax(S masked outside i - W + 1 < j <= i)·V"""
    return _window_shifted(c, -1)


def _local_shifted(c: Context, by: int) -> Result:
    r = c.options.local_window
    if r is None or r + by < 0:
        raise NotApplicable("no local window" if r is None else "a local window of radius 0 cannot be one smaller")
    return c.rerun(local_window=r + by)


@variant("local-window-off-by-one", "the local window kept the keys within R + 1 = {R1} positions on either side "
                                    "instead of |j - i| <= R = {R} (HF sliding_window_bidirectional_overlay)")
def local_window_plus_one(c: Context) -> Result:
    """softmax(S masked where |j - i| > R + 1)·V"""
    return _local_shifted(c, +1)


@variant("local-window-one-short", "the local window kept |j - i| < R = {R} (an exclusive bound, as a window handed "
                                   "to FlashAttention without HF ModernBERT's + 1) instead of |j - i| <= R")
def local_window_minus_one(c: Context) -> Result:
    """softmax(S masked where |j - i| >= R)·V"""
    return _local_shifted(c, -1)


@variant("rope-other-convention", "RoPE rotated the other pairs of features: {rope_other} instead of {rope} (HF's "
                                  "rotate_half pairs feature k with k + d/2, GPT-J and Meta pair 2k with 2k+1; HF's "
                                  "converter permutes W_q and W_k to switch)")
def rope_other_convention(c: Context) -> Result:
    """softmax(rotate_other(Q)·rotate_other(K)ᵀ / √d)·V"""
    if c.options.rope is None:
        raise NotApplicable("no rotary position embedding")
    return c.rerun(rope="interleaved" if c.options.rope == "half" else "half")


@variant("alibi-added", "ALiBi (the paper's slopes, -slope_h·(i - j)) was added although this problem has none")
def alibi_added(c: Context) -> Result:
    """softmax(S - slope_h·(i - j))·V for a problem without ALiBi"""
    if c.options.alibi or c.problem.alibi_slopes is not None:
        raise NotApplicable("ALiBi is there already")
    return c.rerun(alibi=True)


@variant("rope-missing", "the rotary position embedding was left out: q and k were not rotated")
def rope_missing(c: Context) -> Result:
    """softmax(QKᵀ / √d)·V without RoPE"""
    if c.options.rope is None:
        raise NotApplicable("no rotary position embedding")
    return c.rerun(rope=None, rotary_dim=None, rope_scaling=None)


@variant("q-offset-missing", "the new queries were put at positions 0..m-1 instead of {P}..{P}+m-1 (a KV-cache "
                             "step without cache_position): causal mask, window and rotations top-left")
def q_offset_missing(c: Context) -> Result:
    """query i at position i instead of P + i"""
    if c.problem.query_offset == 0:
        raise NotApplicable("the queries start at position 0")
    return c.rerun(q_offset=0, causal_align="top-left")


@variant("softcap-missing", "the soft-capping c·tanh(s / c) with c = {cap} was left out")
def softcap_missing(c: Context) -> Result:
    """softmax(QKᵀ / √d)·V without c·tanh(s / c)"""
    if c.options.softcap is None:
        raise NotApplicable("no soft-capping")
    return c.rerun(softcap=None)


@variant("sinks-missing", "the attention sinks were left out: each row's weights sum to 1 instead of leaving the "
                          "sink its share")
def sinks_missing(c: Context) -> Result:
    """softmax over the keys alone, without the sink column"""
    if c.problem.sinks is None:
        raise NotApplicable("no attention sinks")
    return c.rerun(replace(c.problem, sinks=None))


@variant("bias-missing", "the relative position bias was not added: T5's b_h[bucket(j - i)] was left out of the "
                         "scores")
def bias_missing(c: Context) -> Result:
    """softmax(QKᵀ)·V without the relative position bias"""
    if c.problem.relative_bias is None:
        raise NotApplicable("no relative position bias")
    return c.rerun(replace(c.problem, relative_bias=None))


def rotated(c: Context, q_at: np.ndarray | None = None, k: bool = True, v: bool = False) -> Result:
    """The heads computed with RoPE changed: the chain's stages on q and k (QK-norm, RoPE, Llama 4's tuning of q) applied
    here in the problem's order, the queries rotated at positions ``q_at`` (default P + i), the keys (at j) unless
    ``k`` is False, the values too (at their key positions) with ``v``; then attended as this problem's heads
    (:meth:`Context.attend`): one rule for single-head problems, 4-D (B, H, T, d) inputs, grouped-query heads and
    layers (given by flags or read from a checkpoint)."""
    p = c.heads_problem()
    if p.options.rope is None:
        raise NotApplicable("no rotary position embedding")
    be = get_backend("numpy", "cpu")
    rope = ops.rope_of(p)  # the engine's tables (its --rope-freqs, rounding, dtype, scaling, width)
    # (..., H, m, d), (..., G, n, d), (..., G, n, d_v): held in the computing dtype first, as the engine's be.asarray
    # (check computes in float64: a float32 or half input is rotated in float64, as the reference rotates it)
    q, kk, v0 = (np.asarray(a, dtype=p.dtype) for a in (p.q, p.k, p.v))
    for st in chain.needed(p):
        if st.qk is None:
            continue
        if st.name == StepName.Q_ROT:
            q = rope.rotate(np, q, p.query_offset + np.arange(p.m) if q_at is None else q_at)
            kk = rope.rotate(np, kk, np.arange(p.n)) if k else kk
        else:
            q, kk = st.qk(p, be, q, kk)
    vv = rope.rotate(np, v0, np.arange(p.n)) if v else p.v  # (..., G, n, d_v)
    o = replace(p.options, rope=None, rotary_dim=None, rope_scaling=None, qk_norm=None, tuning_scale=None)
    return c.attend(replace(p, q=q, k=kk, v=vv, options=o))  # every stage on q and k done above


@variant("rope-q-only", "RoPE rotated the queries but not the keys: scores q_rot·k instead of q_rot·k_rot")
def rope_q_only(c: Context) -> Result:
    """softmax(rotate(Q)·Kᵀ / √d)·V"""
    return rotated(c, k=False)


@variant("rope-on-v", "RoPE rotated the values too (at their key positions): only q and k are rotated")
def rope_on_v(c: Context) -> Result:
    """softmax(rotate(Q)·rotate(K)ᵀ / √d)·rotate(V)"""
    if c.options.rope is not None and c.d_v != c.d:
        raise NotApplicable("V's width differs from the rotated width")
    return rotated(c, v=True)


@variant("rope-base-default", "RoPE used the default base 10000 instead of the model's {base} (config rope_theta "
                              "not read)")
def rope_base_default(c: Context) -> Result:
    """θ = position · 10000^(-2k/d) instead of base^(-2k/d)"""
    if c.options.rope is None:
        raise NotApplicable("no rotary position embedding")
    if c.problem.rope_settings()[0] == 10000.0:
        raise NotApplicable("the base is 10000 already")
    sc = dict(c.options.rope_scaling or {})
    sc.pop("rope_theta", None)
    return c.rerun(rope_base=10000.0, rope_scaling=sc or None)


def _freqs_in(c: Context, precision: str) -> Result:
    if c.options.rope is None:
        raise NotApplicable("no rotary position embedding")
    if c.options.rope_freqs == precision:
        raise NotApplicable(f"the frequencies are {precision} already")
    return c.rerun(rope_freqs=precision)


@variant("rope-freqs-bfloat16", "RoPE's inverse frequencies were rounded to bfloat16, as model.to(torch.bfloat16) "
                                "leaves transformers' inv_freq buffer (from_pretrained(dtype=...) keeps it float32): "
                                "angles off by up to 2^-9 of position · frequency")
def rope_freqs_bfloat16(c: Context) -> Result:
    """θ = position · bfloat16(inv_freq)"""
    return _freqs_in(c, "bfloat16")


@variant("rope-freqs-float16", "RoPE's inverse frequencies were rounded to float16, as model.half() leaves "
                               "transformers' inv_freq buffer (from_pretrained(dtype=...) keeps it float32): angles "
                               "off by up to 2^-11 of position · frequency")
def rope_freqs_float16(c: Context) -> Result:
    """θ = position · float16(inv_freq)"""
    return _freqs_in(c, "float16")


@variant("window-not-causal", "the sliding window was not combined with the causal mask: each query saw the keys "
                              "within {W} positions on both sides, the later ones too")
def window_not_causal(c: Context) -> Result:
    """softmax(S masked where |i - j| >= W)·V"""
    return _remask(c, _with_window_mask(c, lambda i, j, w: np.abs(i - j) < w))  # both sides of the query


def _with_window_mask(c: Context, keep_of: Callable[[np.ndarray, np.ndarray, int], np.ndarray]) -> Subject:
    """The problem with its sliding window (and causal mask) replaced by the boolean keep-mask
    ``keep_of(i, j, W)`` (query positions i (m, 1), key positions j (1, n)), ANDed with a boolean keep-mask given."""
    p, w = c.problem, c.options.window
    if w is None:
        raise NotApplicable("no sliding window")
    if p.mask is not None and (p.mask.dtype != bool or c.options.mask_convention != "keep"):
        raise NotApplicable("a mask of another kind is there too")
    i, j = p.query_offset + np.arange(p.m)[:, None], np.arange(p.n)[None, :]
    keep = keep_of(i, j, int(w))  # (m, n)
    mask = keep if p.mask is None else p.mask & keep
    return replace(p, mask=mask, options=replace(c.options, window=None, causal=False))


@variant("window-not-causal-off-by-one", "the sliding window was not combined with the causal mask and its bound was "
                                         "inclusive: each query saw the keys with |i - j| <= W = {W} on both sides "
                                         "(HF's sliding_window_bidirectional_mask_function(W): window-not-causal "
                                         "plus window-off-by-one) instead of the W keys up to itself")
def window_not_causal_off_by_one(c: Context) -> Result:
    """softmax(S masked where |i - j| > W)·V"""
    return _remask(c, _with_window_mask(c, lambda i, j, w: np.abs(i - j) <= w))


@variant("window-causal-bound-dropped", "the sliding window's causal bound was dropped: each query saw the keys "
                                        "j > i - W (W = {W}), the W - 1 before it, itself and every later key "
                                        "(HF's sliding_window_overlay without causal_mask_function)")
def window_causal_bound_dropped(c: Context) -> Result:
    """softmax(S masked where j <= i - W)·V"""
    return _remask(c, _with_window_mask(c, lambda i, j, w: j > i - w))


@variant("softcap-after-mask", "the soft-cap c·tanh(s / c) (c = {cap}) was applied after the mask: masked scores "
                               "became -c instead of -inf, so masked keys kept some weight")
def softcap_after_mask(c: Context) -> Result:
    """softmax(c·tanh(masked(S) / c))·V"""
    cap = c.options.softcap
    if cap is None:
        raise NotApplicable("no soft-capping")
    if c.problem.sinks is not None:
        raise NotApplicable("with sinks")
    t = c.rerun(softcap=None)
    if "masked" not in t:
        raise NotApplicable("no keys are masked")
    return c.with_output(ops.softmax(np, ops.softcap(np, t["masked"], cap)))


@variant("qk-norm-model-width", "QK-norm took the mean of squares over all the heads' features (the model width) "
                                "instead of over each head's {d}")
def qk_norm_model_width(c: Context) -> Result:
    """q / sqrt(mean over every head of q²) · w (w tiled over the heads) instead of over each head's features"""
    o, p = c.options, c.problem
    if o.qk_norm is None:
        raise NotApplicable("no QK-norm")
    if o.qk_norm not in ("rms", "rms1p"):
        raise NotApplicable(f"QK-norm {o.qk_norm}: not a per-head RMSNorm")
    H, G = p.head_count, p.kv_heads or p.head_count
    if H == 1:
        raise NotApplicable("one head: its width is the model width")
    if isinstance(p, Problem) and p.k.ndim < 3:
        raise NotApplicable("K has no head axis")
    d, plus = c.d, o.qk_norm == "rms1p"

    def wide(w: np.ndarray | None, heads: int) -> np.ndarray | None:
        """The per-head weight as a port writes it for the H·d width: tiled over the heads ((d,) -> (heads, d)),
        1 + w for rms1p (rms-full multiplies by the weight itself)."""
        if w is None:
            return None if not plus else np.ones((heads, d))
        w = np.asarray(w, dtype=np.float64)
        w = 1.0 + w if plus else w
        return np.broadcast_to(w.reshape(-1, d), (heads, d)).copy()

    return c.rerun(replace(p, q_norm=wide(p.q_norm, H), k_norm=wide(p.k_norm, G)), qk_norm="rms-full")


@variant("qk-norm-other-side-of-rope", "the QK-norm was applied on the other side of RoPE (Qwen3, Gemma 3 and OLMo 2 "
                                       "normalise q and k before rotating them; HunYuan and nanochat after)")
def qk_norm_other_side_of_rope(c: Context) -> Result:
    """rotate(norm(q)) instead of norm(rotate(q)), or the other way round"""
    o = c.options
    if o.qk_norm is None or o.rope is None:
        raise NotApplicable("no QK-norm with RoPE")
    return c.rerun(qk_norm_at="before-rope" if o.qk_norm_at == "after-rope" else "after-rope")


@variant("qk-norm-per-head", "QK-norm took the mean of squares over each head's {d} features instead of over the "
                             "token's every head at once (OLMo 2 normalises the full width before the head split)")
def qk_norm_per_head(c: Context) -> Result:
    """q / sqrt(mean over each head's features of q²) instead of over every head's"""
    o = c.options
    if o.qk_norm != "rms-full":
        raise NotApplicable("no QK-norm over the full width")
    if c.problem.head_count == 1:
        raise NotApplicable("one head: its width is the model width")
    return c.rerun(qk_norm="rms")  # the (H·d,) weights held (H, d): each head with its own slice


# ---- diagnosis ------------------------------------------------------------------------

NEAREST_FACTOR = 4.0  # a near miss is shown only when its largest error is this many times smaller than no change's
# variants that are an option the user did not give (or gave wrongly): the words that make the problem match
OPTION_HINTS: dict[str, str] = {
    "causal-added": "--causal", "alibi-added": "--alibi", "causal-added-bottom-right": "--causal --causal-align bottom-right",
    "causal-missing": "without --causal", "causal-bottom-right": "--causal-align bottom-right",
    "no-scaling": "--scaling none", "scaled-unscaled-score": "--scaling sqrt-d", "scale-by-d": "--scale 1/d",
    "rope-missing": "without --rope", "rope-other-convention": "the other --rope",
    "window-off-by-one": "--window W+1", "window-one-short": "--window W-1", "q-offset-missing": "--q-offset 0",
    "kv-heads-tiled": "K/V heads tiled (no option: fix the code)", "mask-inverted": "the other --mask-convention",
    "rope-freqs-bfloat16": "--rope-freqs bfloat16", "rope-freqs-float16": "--rope-freqs float16",
}
MAX_OPTION_SETS = 64  # sets of forgotten options tried at most (each one run of the pipeline)
MAX_PAIR_RUNS = 600  # pairs of mistakes tried at most (each one run of the pipeline, or one variant on it)
PAIR_CELL_BUDGET = 1 << 25  # ...and at most this many score cells computed over all of them


@dataclass
class Diagnosis:
    """The variants that reproduce the expected numbers, the nearest ones, and what was tried."""

    matches: list[Explanation] = field(default_factory=list)
    nearest: list[Explanation] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    candidates: list[Explanation] = field(default_factory=list)  # every variant (and pair) tried, with its error
    search: str = ""  # how the pairs were searched
    baseline: float = 0.0  # the largest error of no change at all (the correct computation)


def _explain(v: Variant, c: Context, err: float, detail: str = "") -> Explanation:
    facts = c.facts()
    o = c.options
    other = "keep" if o.mask_convention == "drop" else "drop"
    flipped = f"its 1/True entries were taken as '{other}' (as --mask-convention {other})"
    if c.problem.mask is None and c.problem.padding is not None:
        flipped = "the key padding mask's True entries were kept instead of ignored"
    pre_attn = f"{int(c.problem.x.shape[-1]) / c.problem.heads:g}" if isinstance(c.problem, Layer) else ""
    facts.update(detail=detail, act=getattr(o, "activation", None) or "tanh", flipped=flipped,
                 scale=f"{o.scale:.4g}" if o.scale is not None else "", pre_attn=pre_attn,
                 G=c.problem.kv_heads or 1, r=c.problem.n_rep, W=o.window, W1=(o.window or 0) + 1, rope=o.rope,
                 R=o.local_window, R1=(o.local_window or 0) + 1,
                 rope_other="interleaved" if o.rope == "half" else "half", P=c.problem.query_offset, cap=o.softcap,
                 base=f"{c.problem.rope_settings()[0]:g}", rope_added=detail.split(",")[0],
                 H4=detail)
    return Explanation(v.name, v.formula, v.explanation.format(**facts), err, v.possible)


@dataclass
class _Try:
    """One variant tried on one context: its explanation and whether it reproduces the expected numbers."""

    explanation: Explanation | None = None
    match: bool = False
    skipped: str | None = None  # why it was not tried
    changed: Subject | None = None  # the variant is this change of the problem alone (composable)


def _try(v: Variant, c: Context) -> _Try:
    expected, what, tol = c.expected, c.what, c.tol
    c.changed, c.note, c.hint = None, "", None
    try:
        result = v.fn(c)
    except NotApplicable as e:
        return _Try(skipped=str(e))
    except AttnError as e:  # the variant's inputs are invalid (e.g. a shifted mask): it cannot be it
        return _Try(skipped=f"not computable here ({e})")
    except Exception as e:  # a bug in one variant must not hide the verdict; say so instead
        return _Try(skipped=f"failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
    changed = c.changed if isinstance(result, Trace) else None
    if result is None:
        return _Try()
    if isinstance(result, Reproduced):
        return _Try(_explain(v, c, result.max_abs_error, result.detail), True)
    arrays = result.arrays() if isinstance(result, Trace) else result
    if what not in arrays:
        return _Try(skipped=f"it does not change the {what}")
    got = np.asarray(arrays[what], dtype=np.float64)
    if got.shape != expected.shape:
        return _Try(skipped=f"it gives shape {got.shape}")
    for correct in (c.ref[what], c.correct):
        if correct is not None and within(got, np.asarray(correct, dtype=np.float64), tol).all():
            return _Try(skipped=f"it changes nothing here: its {what} equals the correct one within the tolerance")
    err = float(errors(expected, got).max())
    ex = _explain(v, c, err, c.note)
    ex.option = c.hint or OPTION_HINTS.get(v.name)
    return _Try(ex, bool(within(expected, got, tol).all()), changed=changed)


SCREEN_CELLS = 1 << 22  # score cells (batch × m × n) beyond which the catalogue is screened on sampled rows first
SCREEN_ROWS = 32  # ...rows spread evenly over the queries, and as many of the rows where no change errs most
SAMPLE_CELLS = 1 << 21  # ...fewer (at least MIN_SCREEN_ROWS of each) when the sample's scores (batch × rows × n) would
MIN_SCREEN_ROWS = 4  # exceed this: every step of a sampled run is one (batch, rows, n) array, held explicitly; then the
# survivors are confirmed in blocks of SAMPLE_CELLS scores too (else SCREEN_CELLS)


def sample_rows(p: Subject) -> int:
    """How many rows a screen samples of each kind (spread, worst): ``SCREEN_ROWS``, fewer when the sample's
    scores (every batch entry and head × 2·rows × n keys) would pass ``SAMPLE_CELLS`` (32 heads × 2048 keys × batch
    2: 8 of each, so a sampled run's steps stay 16 MB each in float64: a layer's check peaked at 1.6 GB with 32)."""
    per_row = max(1, int(np.prod(p.batch_shape)) * p.n)
    return max(MIN_SCREEN_ROWS, min(SCREEN_ROWS, SAMPLE_CELLS // (2 * per_row)))


@dataclass
class _Screen:
    """A large problem's search: every candidate is first computed on a sample of query rows (``rows``: spread over
    the queries, plus the rows where the correct result errs most, so the sample holds the worst cell). A candidate
    can match only if it matches on the sample, and be a near miss only if its sampled error is
    ``NEAREST_FACTOR``× below no change's: the others are ruled out exactly (each row of a local variant depends
    on its own query alone). Survivors are computed in full: a change of the problem on the output-only path,
    any other in blocks of rows."""

    full: Context  # the whole problem (its reference is never run explicitly)
    sample: Context
    correct: np.ndarray  # the correct output of the whole problem (output-only path)
    baseline: float
    survivors: int = 0
    ruled_out: int = 0
    each: int = SCREEN_ROWS  # rows spread over the queries, and as many where no change errs most

    @classmethod
    def of(cls, c: Context) -> _Screen | None:
        p = c.problem
        cells = int(np.prod(p.batch_shape)) * p.m * p.n
        if c.what != "output" or cells <= SCREEN_CELLS or p.m <= 2 * SCREEN_ROWS:
            return None
        correct = np.asarray(run(replace(p, options=replace(p.options, keep_weights=False)))["output"], dtype=np.float64)
        if correct.shape != c.expected.shape:
            return None
        err = errors(c.expected, correct)
        by_row = np.moveaxis(np.nan_to_num(err, nan=np.inf), -2, 0).reshape(p.m, -1).max(axis=1)  # (m,)
        each = sample_rows(p)
        spread = np.linspace(0, p.m - 1, each).round().astype(int)
        worst = np.argsort(-by_row, kind="stable")[:each]
        rows = tuple(int(i) for i in np.unique(np.concatenate([spread, worst])))
        sample = Context.of(p, np.take(c.expected, rows, axis=-2), c.what, c.tol, rows=rows)
        return cls(c, sample, correct, float(err.max()), each=each)

    def survives(self, t: _Try) -> bool:
        e = t.explanation
        keep = e is not None and (t.match or e.max_abs_error * NEAREST_FACTOR <= self.baseline)
        self.survivors += keep
        self.ruled_out += not keep
        return keep

    def confirm(self, v: Variant, t: _Try, base: Subject | None = None) -> _Try:
        """``t`` (tried on the sample) computed on every row: ``base`` is the problem it was tried on."""
        c = self.full
        if isinstance(t.explanation, Explanation) and t.explanation.possible:
            return t  # a fit of its own (dropout): judged on the sample
        if t.changed is not None:  # a change of the problem: its output on the output-only path
            p = t.changed
            got = np.asarray(run(replace(p, options=replace(p.options, keep_weights=False)))[c.what], dtype=np.float64)
        else:
            p = base or c.problem
            per_row = max(1, int(np.prod(p.batch_shape)) * p.n)
            step = max(1, (SCREEN_CELLS if self.each == SCREEN_ROWS else SAMPLE_CELLS) // per_row)
            parts = []
            for i in range(0, p.m, step):
                rows = tuple(range(i, min(p.m, i + step)))
                ctx = Context(p, np.take(c.expected, rows, axis=-2), c.what, c.tol, rows=rows)
                r = v.fn(ctx)
                if not isinstance(r, (dict, Trace)):
                    return t  # a fit (Reproduced) or nothing: as on the sample
                parts.append(np.asarray((r.arrays() if isinstance(r, Trace) else r)[c.what], dtype=np.float64))
            got = np.concatenate(parts, axis=-2)
        if got.shape != c.expected.shape:
            return _Try(skipped=f"it gives shape {got.shape}")
        if within(got, self.correct, c.tol).all():
            return _Try(skipped=f"it changes nothing here: its {c.what} equals the correct one within the tolerance")
        assert t.explanation is not None
        ex = replace(t.explanation, max_abs_error=float(errors(c.expected, got).max()))
        return _Try(ex, bool(within(c.expected, got, c.tol).all()), changed=t.changed)

    def sentence(self, variants: int, pairs: int) -> str:
        return (f"searched {variants} variants and {pairs} pairs on {len(self.sample.rows or ())} sampled rows of "
                f"{self.full.problem.m} ({self.each} spread over the queries and the {self.each} where no change errs "
                f"most); {self.ruled_out} ruled out there (no match possible, not {NEAREST_FACTOR:g}× closer than no "
                f"change), {self.survivors} checked in full")


def diagnose(problem: Subject, expected: np.ndarray, what: str, tol: Tolerance, nearest: int = 3,
             pairs: bool = True) -> Diagnosis:
    """Try every catalogued variant on ``problem``; report each that reproduces ``expected`` within ``tol``.

    When none does (and ``pairs``), two mistakes together: each variant that is a change of the
    problem alone (its options, masks or inputs: a re-run of the pipeline) is applied, and every other
    variant is tried on the changed problem; bounded by ``MAX_PAIR_RUNS`` and ``PAIR_CELL_BUDGET``.
    A large problem is screened on sampled rows first (:class:`_Screen`)."""
    c = Context.of(problem, expected, what, tol)
    screen = _Screen.of(c)
    work = screen.sample if screen is not None else c
    out = Diagnosis()
    misses: list[Explanation] = []
    changes: list[tuple[Variant, Subject]] = []
    no_change = float(errors(work.expected, work.ref[what]).max())
    for v in VARIANTS.values():
        if screen is not None and not v.local:
            out.skipped[v.name] = "not tried at this size: a row of its result depends on every query"
            continue
        t = _try(v, work)
        if t.skipped is not None:
            out.skipped[v.name] = t.skipped
            continue
        out.tried.append(v.name)
        if t.changed is not None and t.explanation is not None and t.explanation.max_abs_error != no_change:
            changes.append((v, t.changed))  # a change that changes nothing here makes no pair
        if screen is not None:
            if not screen.survives(t):
                continue
            t = screen.confirm(v, t)
            if t.skipped is not None:
                continue
        if t.explanation is None:
            continue
        out.candidates.append(t.explanation)
        if t.match:
            out.matches.append(t.explanation)
        elif not v.possible:
            misses.append(t.explanation)
    runs = 0
    if not out.matches and pairs:
        runs = _pairs(work, changes, out, misses, screen)
    if not out.matches and pairs:  # options forgotten together that no pair of entries reproduces (rope-added fits
        forgotten = _forgotten(work, out, screen)  # its base alone, so it is no second mistake of a pair)
        out.search = "; ".join(x for x in (out.search, forgotten) if x)
    if screen is not None:
        out.search = screen.sentence(len(out.tried), runs) + (f"; {out.search}" if out.search else "")
    out.candidates.sort(key=lambda e: e.max_abs_error)
    if not out.matches:  # only what is clearly closer than no change at all
        base = screen.baseline if screen is not None else float(errors(expected, np.asarray(c.ref[what], dtype=np.float64)).max())
        out.nearest = sorted((e for e in misses if e.max_abs_error * NEAREST_FACTOR <= base),
                             key=lambda e: e.max_abs_error)[:nearest]
        out.baseline = base
    return out


@dataclass(frozen=True)
class Forgotten:
    """One option a problem could have been computed with: the words that say it, the change of the options, and
    the catalogue entry that is this option alone (with the detail its sentence takes)."""

    words: str
    change: dict[str, Any]
    entry: str
    detail: str = ""


def option_groups(c: Context) -> list[list[Forgotten]]:
    """The options this problem could have been computed with and was not (or the other way round), one group per
    option, each a list of its alternatives (RoPE at the problem's base, ALiBi with the paper's slopes)."""
    o, p = c.options, c.problem
    groups: list[list[Forgotten]] = []
    if not o.causal:
        alts = [Forgotten("--causal", {"causal": True, "causal_align": "top-left"}, "causal-added")]
        if p.m != p.n:
            alts.append(Forgotten("--causal --causal-align bottom-right", {"causal": True, "causal_align": "bottom-right"},
                                  "causal-added-bottom-right"))
        groups.append(alts)
    elif o.window is None and o.chunk is None:
        alts = [Forgotten("without --causal", {"causal": False}, "causal-missing")]
        if o.causal_align == "top-left" and p.m != p.n:
            alts.append(Forgotten("--causal-align bottom-right", {"causal_align": "bottom-right"}, "causal-bottom-right"))
        groups.append(alts)
    if o.rope is None:
        if c.d % 2 == 0:
            base = f"{p.rope_settings()[0]:g}"
            groups.append([Forgotten(f"--rope {mode}", {"rope": mode}, "rope-added", f"{mode} pairs, base {base}")
                           for mode in ("half", "interleaved")])
    else:
        alts = [Forgotten("without --rope", {"rope": None, "rotary_dim": None, "rope_scaling": None}, "rope-missing")]
        if o.rope in ("half", "interleaved"):
            other = "interleaved" if o.rope == "half" else "half"
            alts.append(Forgotten(f"--rope {other}", {"rope": other}, "rope-other-convention"))
        groups.append(alts)
    if o.scale is None and (o.scaling or get_score(o.score).scaling) == "sqrt-d":
        groups.append([Forgotten("--scaling none", {"scaling": "none"}, "no-scaling")])
    if not o.alibi and p.alibi_slopes is None:
        groups.append([Forgotten("--alibi", {"alibi": True}, "alibi-added")])
    return groups


def _forgotten(c: Context, out: Diagnosis, screen: _Screen | None = None) -> str:
    """Several forgotten options at once: every set of two or more of :func:`option_groups` (at most one alternative
    of each), smallest sets first, one run each; the sets of the smallest size that reproduces the numbers are
    named, as 'a + b + ...' of their catalogue entries with the options that make the problem match (so each option
    named is needed: no smaller set reproduced them). Bounded by ``MAX_OPTION_SETS`` runs and ``PAIR_CELL_BUDGET``
    score cells. Returns how the search went ('' when there was nothing to combine)."""
    groups = option_groups(c)
    if len(groups) < 2:
        return ""
    p = c.problem
    cells = max(1, int(np.prod(p.batch_shape)) * len(c.rows or range(p.m)) * p.n)
    budget = min(MAX_OPTION_SETS, PAIR_CELL_BUDGET // cells)
    sets = [combo for size in range(2, len(groups) + 1) for chosen in itertools.combinations(groups, size)
            for combo in itertools.product(*chosen)]
    runs, found_size = 0, 0
    for combo in sets:
        if runs >= budget or (found_size and len(combo) > found_size):
            break
        runs += 1
        words = " ".join(f.words for f in combo)
        change: dict[str, Any] = {}
        for f in combo:
            change.update(f.change)
        changed = replace(p, options=replace(c.options, **change))

        def with_options(ctx: Context, q: Subject = changed) -> Result:
            return ctx.rerun(q)

        with_options.__doc__ = f"this problem computed with {words}"
        v = Variant("forgotten-options", with_options, "", pairable=False)
        t = _try(v, c)
        if screen is not None and t.explanation is not None:
            t = screen.confirm(v, t) if screen.survives(t) else _Try()  # a change: its output computed in full
        if t.explanation is None or not t.match:
            continue
        found_size = len(combo)
        err = t.explanation.max_abs_error
        each = [_explain(VARIANTS[f.entry], c, err, f.detail) for f in combo]
        ex = Explanation(" + ".join(e.name for e in each), ", and ".join(e.formula for e in each),
                         f"{len(combo)} options forgotten (or given wrongly) together: "
                         + "; ".join(e.explanation for e in each), err, option=words)
        out.matches.append(ex)
        out.candidates.append(ex)
    out.tried.append("forgotten-options")
    return (f"forgotten options together: {runs} of {len(sets)} sets tried (every set of two or more of "
            f"{', '.join(' | '.join(f.words for f in g) for g in groups)}; at most {MAX_OPTION_SETS} sets and "
            f"{PAIR_CELL_BUDGET:.3g} score cells)")


def _pairs(c: Context, changes: list[tuple[Variant, Subject]], out: Diagnosis, misses: list[Explanation],
           screen: _Screen | None = None) -> int:
    """Two mistakes: the change of ``a`` (a re-run) with every other pairable variant ``b`` on top of it."""
    order = list(VARIANTS)
    p = c.problem
    cells = max(1, int(np.prod(p.batch_shape)) * len(c.rows or range(p.m)) * p.n)
    budget = min(MAX_PAIR_RUNS, PAIR_CELL_BUDGET // cells)
    second = [v for v in VARIANTS.values() if v.pairable and (screen is None or v.local)]
    composable = {x.name for x, _ in changes}

    def new(a: Variant, b: Variant) -> bool:  # a change with an earlier change: the same pair the other way round
        return b.name != a.name and not (b.name in composable and order.index(b.name) < order.index(a.name))

    total = sum(1 for a, _ in changes for b in second if new(a, b))
    runs = 0
    for a, changed in changes:
        ca = Context(changed, c.expected, c.what, c.tol, correct=c.ref[c.what], rows=c.rows)
        for b in second:
            if not new(a, b):
                continue
            if runs >= budget:
                break
            runs += 1
            t = _try(b, ca)
            if t.explanation is None:
                continue
            if screen is not None:
                if not screen.survives(t):
                    continue
                t = screen.confirm(b, t, changed)
                if t.explanation is None:
                    continue
            e = t.explanation
            assert e is not None
            first = _explain(a, c, e.max_abs_error)
            hints = (OPTION_HINTS.get(a.name), e.option)
            pair = Explanation(f"{a.name} + {b.name}", f"{a.formula}, and {b.formula}",
                               f"two mistakes together: {first.explanation}; and {e.explanation}", e.max_abs_error,
                               option=" ".join(h for h in hints if h) if all(hints) else None)
            if t.match:
                out.matches.append(pair)
                out.candidates.append(pair)
            else:
                misses.append(pair)
    out.search = (f"pairs of mistakes: {runs} of {total} tried (each of the {len(changes)} variants that only change the "
                  f"problem, re-run once, with every other variant on top; at most {MAX_PAIR_RUNS} pairs and "
                  f"{PAIR_CELL_BUDGET:.3g} score cells in all)")
    return runs

