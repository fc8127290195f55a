"""The catalogue of well-known attention variants and mistakes, for ``attncli check``.

Each entry is a small function registered with ``@variant(name, explanation)``. Its docstring's
first line is the formula it computes; the explanation says, in words, what went wrong
(``{d}``, ``{sqrt_d}``, ``{d_v}``, ``{n}``, ``{m}``, ``{T}`` are filled in). It takes a
:class:`Context` (the problem on numpy float64 and the correct computation) and returns the
steps it changes (``{"weights": ..., "output": ...}`` or a whole Trace from a re-run of the
engine with modified options), or :class:`Reproduced` when it fits the expected numbers
itself (dropout), or raises :class:`NotApplicable` saying why it does not apply to these
inputs. Variants reuse the engine (``engine.run`` with ``dataclasses.replace``d options,
``engine.softmax``, ``engine.scale_factor``) rather than re-implementing attention.

Add one by writing a function here (or anywhere, before ``diagnose`` runs) with the decorator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attncli.check import Explanation, Tolerance, errors, within
from attncli.engine import run, scale_factor, softmax
from attncli.problem import Problem
from attncli.scoring import get_score
from attncli.trace import Trace

Result = Any  # dict[str, np.ndarray] | Trace | Reproduced | None (tried, no fit)
SUBSET_BUDGET = 2 ** 22  # rows × 2^n × d_v cells the dropout search may visit on the output
MAX_DROPOUT_KEYS = 14


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

    @property
    def formula(self) -> str:
        return (self.fn.__doc__ or self.name).strip().splitlines()[0]


VARIANTS: dict[str, Variant] = {}


VariantFn = Callable[["Context"], Result]


def variant(name: str, explanation: str, possible: bool = False) -> Callable[[VariantFn], VariantFn]:
    """Register a variant under ``name`` with the sentence that explains it."""

    def deco(fn: VariantFn) -> VariantFn:
        VARIANTS[name] = Variant(name, fn, explanation, possible)
        return fn

    return deco


@dataclass
class Context:
    """What a variant gets: the problem (numpy, float64), the expected numbers and the correct trace."""

    problem: Problem
    expected: np.ndarray
    what: str
    tol: Tolerance
    _ref: Trace | None = None

    @classmethod
    def of(cls, problem: Problem, expected: np.ndarray, what: str, tol: Tolerance) -> Context:
        o = replace(problem.options, backend="numpy", device="cpu", dtype="float64")
        return cls(replace(problem, options=o), expected, what, tol)

    @property
    def ref(self) -> Trace:
        """The correct computation on numpy float64."""
        if self._ref is None:
            self._ref = run(self.problem)
        return self._ref

    def rerun(self, problem: Problem | None = None, **options: Any) -> Trace:
        """The engine on ``problem`` (default: this one) with ``options`` replaced."""
        p = problem or self.problem
        return run(replace(p, options=replace(p.options, **options)))

    @property
    def d(self) -> int:
        return int(self.problem.q.shape[-1])

    @property
    def d_v(self) -> int:
        return int(self.problem.v.shape[-1])

    def factor(self) -> Any:
        """The factor the engine multiplies the scores by (None: no scaling)."""
        return scale_factor(self.problem, np, self.ref["scores"])[0]

    def before_softmax(self) -> np.ndarray:
        """The scores the softmax gets (scaled and masked, masked entries at -inf or the mask value)."""
        for name in ("masked", "scaled", "scores"):
            if name in self.ref:
                return self.ref[name]
        raise NotApplicable("no scores")  # pragma: no cover

    def facts(self) -> dict[str, Any]:
        o = self.problem.options
        return {"d": self.d, "sqrt_d": f"{math.sqrt(self.d):.4g}", "d_v": self.d_v, "n": self.problem.n,
                "m": self.problem.m, "T": f"{o.temperature:g}" if o.temperature else "1"}

    def with_output(self, weights: np.ndarray) -> dict[str, np.ndarray]:
        """These weights and the output they give: weights @ V."""
        return {"weights": weights, "output": weights @ self.problem.v}  # (..., m, n) x (..., n, d_v) -> (..., m, d_v)

    def requires_scaling(self) -> Any:
        f = self.factor()
        if f is None:
            raise NotApplicable("the scores are not scaled here")
        return f

    def requires_sqrt_d(self) -> None:
        o = self.problem.options
        rule = o.scaling or get_score(o.score).scaling
        if o.scale is not None or rule != "sqrt-d":
            raise NotApplicable("the scaling here is not 1/√d")

    def requires_keep_mask(self) -> None:
        p = self.problem
        if p.query_limit is None and not p.options.causal and (p.mask is None or p.mask.dtype != bool):
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
    if not get_score(c.problem.options.score).same_width:
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
    if c.problem.n == c.d:
        raise NotApplicable("n equals d")
    return c.rerun(scale=1.0 / math.sqrt(c.problem.n))


@variant("scale-after-softmax", "the scaling was applied after the softmax instead of to the scores: "
                                "softmax(QKᵀ) and the output were divided by √d = {sqrt_d}")
def scale_after_softmax(c: Context) -> Result:
    """softmax(QKᵀ)·V / √d"""
    f = c.requires_scaling()
    t = c.rerun(scale=None, scaling="none")
    return c.with_output(t["weights"] * f)  # (W·f)·V = (W·V)·f


@variant("temperature-multiplied", "the scores were multiplied by the temperature T = {T} instead of divided by it")
def temperature_multiplied(c: Context) -> Result:
    """softmax(S · T)·V"""
    t = c.problem.options.temperature
    if t is None or t == 1:
        raise NotApplicable("no temperature (or T = 1)")
    return c.rerun(temperature=1.0 / t)


# ---- softmax --------------------------------------------------------------------------

@variant("softmax-over-queries", "the softmax ran over the wrong axis: over the queries (columns of each key "
                                 "sum to 1) instead of over the keys")
def softmax_over_queries(c: Context) -> Result:
    """softmax(QKᵀ / √d, axis=queries)·V"""
    if c.problem.m == 1:
        raise NotApplicable("a single query: the softmax over queries is constant")
    s = c.before_softmax()
    w = np.swapaxes(softmax(np, np.swapaxes(s, -1, -2)), -1, -2)
    return c.with_output(w)


@variant("q-k-swapped", "Q and K were swapped: the weights are softmax(K Qᵀ / √d), the transposed scores, "
                        "normalised over the queries' positions")
def q_k_swapped(c: Context) -> Result:
    """softmax(K Qᵀ / √d)·V"""
    p = c.problem
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

@variant("mask-inverted", "the mask's convention was inverted: its 1/True entries were {flipped} "
                          "(try --mask-convention {other})")
def mask_inverted(c: Context) -> Result:
    """softmax(S + (1 - M)·-inf)·V"""
    p = c.problem
    if p.mask is None or p.mask.dtype != bool:
        raise NotApplicable("no boolean mask")
    return c.rerun(mask_convention="drop" if p.options.mask_convention == "keep" else "keep")


def _valid_lens_shifted(c: Context, by: int) -> Result:
    p = c.problem
    if p.query_limit is None:
        raise NotApplicable("no valid lengths")
    limit = np.clip(p.query_limit + by, 0, p.n)
    if np.array_equal(limit, p.query_limit):
        raise NotApplicable(f"valid lengths {by:+d} change nothing here")
    return c.rerun(replace(p, query_limit=limit))


@variant("valid-lens-plus-one", "the valid lengths were off by one: one key more than the valid length took part "
                                "(e.g. <= instead of < in the mask)")
def valid_lens_plus_one(c: Context) -> Result:
    """softmax(S masked at keys j > valid_len)·V"""
    return _valid_lens_shifted(c, +1)


@variant("valid-lens-minus-one", "the valid lengths were off by one: one key fewer than the valid length took part")
def valid_lens_minus_one(c: Context) -> Result:
    """softmax(S masked at keys j >= valid_len - 1)·V"""
    return _valid_lens_shifted(c, -1)


@variant("mask-value-1e6", "masked scores were set to -1e6 (as d2l) instead of -inf: rows with every key masked "
                           "got uniform weights instead of zeros")
def mask_value_1e6(c: Context) -> Result:
    """softmax(S with masked entries at -1e6)·V"""
    c.requires_keep_mask()
    mv = c.problem.options.mask_value
    if mv is not None and not math.isinf(mv):
        raise NotApplicable("a finite mask value is already used")
    return c.rerun(mask_value=-1e6)


@variant("mask-value-inf", "masked scores were set to -inf (weights 0 on fully masked rows) instead of the "
                           "finite mask value given")
def mask_value_inf(c: Context) -> Result:
    """softmax(S with masked entries at -inf)·V, zero rows where every key is masked"""
    c.requires_keep_mask()
    mv = c.problem.options.mask_value
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


def _dropout_weights(c: Context, w: np.ndarray) -> Result:
    """Every expected weight is 0 or c·w with one c > 1 for all, and some nonzero weight was zeroed."""
    e, tol = c.expected, c.tol
    if not np.all(np.isfinite(e)):
        raise NotApplicable("expected holds NaN or infinities")
    big = (np.abs(e) > tol.atol) & (w > 0)
    if not big.any():
        raise NotApplicable("no kept weights to measure the scale from")
    scale = float(np.median(e[big] / w[big]))
    if not scale > 1 + 1e-9:
        raise NotApplicable("the kept weights are not scaled up")
    zero_ok = within(e, np.zeros_like(e), tol)
    kept_ok = within(e, w * scale, tol)
    dropped = zero_ok & ~kept_ok
    if not np.all(zero_ok | kept_ok) or not dropped.any():
        return None  # tried: zeroing and one scale do not reproduce the weights
    fitted = np.where(dropped, 0.0, w * scale)
    return Reproduced(float(errors(e, fitted).max()), _dropout_detail(int((~dropped).sum()), w.size, scale))


def _dropout_output(c: Context, w: np.ndarray) -> Result:
    """Each expected output row is c·Σ_{j kept} w_ij v_j for one c > 1; search the kept subsets of each row."""
    p, e, tol = c.problem, c.expected, c.tol
    n = p.n
    shape = w.shape[:-1]  # (..., m)
    v = np.broadcast_to(p.v, shape[:-1] + p.v.shape[-2:])  # (..., n, d_v)
    rows = int(np.prod(shape))
    if n > MAX_DROPOUT_KEYS or rows * 2 ** n * c.d_v > SUBSET_BUDGET:
        raise NotApplicable(f"too many keys ({n}) or rows to search the dropped weights")
    if not np.all(np.isfinite(e)):
        raise NotApplicable("expected holds NaN or infinities")
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
    informative = np.asarray(np.abs(er).max(axis=1) > tol.atol)
    if not informative.any():
        raise NotApplicable("the expected output is zero")
    r0 = int(np.argmax(informative))
    for scale in np.unique(np.round(cs[r0][np.isfinite(cs[r0]) & (cs[r0] > 1 + 1e-9)], 9)):
        fit = np.asarray(within(er[:, None, :], scale * ys, tol).all(axis=2))  # (R, 2^n)
        if not fit.any(axis=1).all():
            continue
        full = fit[:, -1]  # the subset with every key kept
        if full.all():
            continue  # the output times a constant, nothing dropped: not dropout
        choice = np.where(full, 2 ** n - 1, np.argmax(fit, axis=1))
        fitted = scale * ys[np.arange(rows), choice]
        kept = int(subsets[choice].sum())
        return Reproduced(float(errors(er, fitted).max()), _dropout_detail(kept, rows * n, float(scale)))
    return None  # tried: no choice of dropped weights and scale 1/(1-p) reproduces the output


# ---- additive -------------------------------------------------------------------------

@variant("activation-missing", "the activation ({act}) of the additive score was left out: "
                               "w_vᵀ(W_q q + W_k k) instead of w_vᵀ {act}(W_q q + W_k k)")
def activation_missing(c: Context) -> Result:
    """softmax(w_vᵀ (W_q q + W_k k))·V"""
    o = c.problem.options
    if get_score(o.score).name not in ("additive", "location") or not hasattr(o, "activation"):
        raise NotApplicable("not an additive score")
    if (o.activation or "tanh") == "identity":
        raise NotApplicable("the activation is already the identity")
    return c.rerun(activation="identity")


# ---- diagnosis ------------------------------------------------------------------------

@dataclass
class Diagnosis:
    """The variants that reproduce the expected numbers, the nearest ones, and what was tried."""

    matches: list[Explanation] = field(default_factory=list)
    nearest: list[Explanation] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _explain(v: Variant, c: Context, err: float, detail: str = "") -> Explanation:
    facts = c.facts()
    o = c.problem.options
    facts.update(detail=detail, act=getattr(o, "activation", None) or "tanh",
                 flipped="taken as 'keep'" if o.mask_convention == "drop" else "taken as 'drop'",
                 other="keep" if o.mask_convention == "drop" else "drop")
    return Explanation(v.name, v.formula, v.explanation.format(**facts), err, v.possible)


def diagnose(problem: Problem, expected: np.ndarray, what: str, tol: Tolerance, nearest: int = 3) -> Diagnosis:
    """Try every catalogued variant on ``problem``; report each that reproduces ``expected`` within ``tol``."""
    c = Context.of(problem, expected, what, tol)
    out = Diagnosis()
    misses: list[tuple[float, Explanation]] = []
    for v in VARIANTS.values():
        try:
            result = v.fn(c)
        except NotApplicable as e:
            out.skipped[v.name] = str(e)
            continue
        out.tried.append(v.name)
        if result is None:
            continue
        if isinstance(result, Reproduced):
            out.matches.append(_explain(v, c, result.max_abs_error, result.detail))
            continue
        arrays = result.arrays() if isinstance(result, Trace) else result
        if what not in arrays:
            out.tried.pop()
            out.skipped[v.name] = f"it does not change the {what}"
            continue
        got = np.asarray(arrays[what], dtype=np.float64)
        if got.shape != expected.shape:
            out.tried.pop()
            out.skipped[v.name] = f"it gives shape {got.shape}"
            continue
        err = float(errors(expected, got).max())
        if within(expected, got, tol).all():
            out.matches.append(_explain(v, c, err))
        elif not v.possible:
            misses.append((err, _explain(v, c, err)))
    if not out.matches:
        out.nearest = [e for _, e in sorted(misses, key=lambda t: t[0])[:nearest]]
    return out
