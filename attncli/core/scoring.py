"""Scoring functions and scaling rules, as registries filled by small decorators.

A scoring function maps queries ``q (..., m, d_q)`` and keys ``k (..., n, d_k)`` to scores
``(..., m, n)``. The first line of its docstring states the formula; the CLI's ``--score``
choices are the registry's keys, so a new score needs no CLI edit. A score's learned
parameters are declared in the registry (:class:`Param`: name, shape in ``d_q``, ``d_k``,
``h``, PyTorch names), so loading, checking and initialising them is generic
(``attncli.core.weights``). Each score records its own intermediates with
:meth:`ScoreInput.add_step` (``q_proj``, ``features``, ``sq_dist``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from attncli.core.formula import Fn, Hat, Name, Root, Sub, Term, terms, text
from attncli.core.trace import FEATURES, KEYS, QUERIES, Trace
from attncli.errors import InputError

HIDDEN = "hidden"  # axis name of the hidden width h of projected queries and keys
QK = terms(Name("Q"), " ", Name("K"), "ᵀ")  # the raw score matrix Q Kᵀ


class ScoreOptions(Protocol):
    """The options a score may read (:class:`attncli.core.options.Options` has them)."""

    @property
    def activation(self) -> str | None: ...

    @property
    def bandwidth(self) -> float | None: ...


@dataclass(frozen=True)
class NoOptions:
    activation: str | None = None
    bandwidth: float | None = None


@dataclass
class ScoreInput:
    """What a scoring function gets: the namespace, q, k, learned parameters, the trace."""

    xp: Any
    q: Any  # (..., m, d_q)
    k: Any  # (..., n, d_k)
    params: dict[str, Any] = field(default_factory=dict)
    trace: Trace | None = None
    options: ScoreOptions = field(default_factory=NoOptions)

    def add_step(self, name: str, params: Any, values: Any, axes: tuple[str, str], notes: list[str] | None = None) -> None:
        """Record an intermediate quantity particular to this score (shown step by step; ``params`` its typed
        parameters, which write its formula: attncli.core.params)."""
        if self.trace is not None:
            self.trace.add(name, values, axes, notes, params)


@dataclass(frozen=True)
class Param:
    """A learned parameter of a score, in the textbook convention (``q @ W_q``).

    ``shape`` is written in the symbols ``d_q`` (query width), ``d_k`` (key width) and ``h``
    (hidden width). ``fan_in`` names the symbol that bounds its ``nn.Linear``-style
    initialisation; an optional parameter is never initialised (it is absent unless given).
    ``torch`` lists the PyTorch state-dict names it may come from instead, and ``convert``
    how they become this parameter (a key of ``attncli.core.weights.CONVERSIONS``).
    """

    name: str
    shape: tuple[str, ...]
    fan_in: str = ""
    optional: bool = False
    torch: tuple[str, ...] = ()
    convert: str = "as_is"
    scalar_ok: bool = False  # a single number may stand for the whole vector (broadcast)

    def shape_text(self) -> str:
        return "(" + ", ".join(self.shape) + ("," if len(self.shape) == 1 else "") + ")"


@dataclass(frozen=True)
class Score:
    name: str
    fn: Callable[[ScoreInput], Any]
    aliases: tuple[str, ...] = ()
    same_width: bool = True  # q and k must have the same width
    scaling: str = "none"  # default scaling rule (see SCALINGS)
    symbol: tuple[Term, ...] = QK  # how the raw score matrix is written in its step's formula
    params: tuple[Param, ...] = ()  # learned parameters (checked and initialised generically)
    options: tuple[str, ...] = ()  # the score-specific Options fields it reads (see SCORE_OPTIONS)

    @property
    def formula(self) -> str:
        return (self.fn.__doc__ or self.name).strip().splitlines()[0]


SCORES: dict[str, Score] = {}
ALIASES: dict[str, str] = {}
SCORE_OPTIONS = ("activation", "bandwidth", "hidden")  # options that only some scores read


def register(name: str, *, aliases: tuple[str, ...] = (), same_width: bool = True, scaling: str = "none",
             symbol: tuple[Term, ...] = QK, params: tuple[Param, ...] = (),
             options: tuple[str, ...] = ()) -> Callable[[Callable[[ScoreInput], Any]], Callable[[ScoreInput], Any]]:
    """Register a scoring function under ``name`` (and ``aliases``)."""

    def deco(fn: Callable[[ScoreInput], Any]) -> Callable[[ScoreInput], Any]:
        SCORES[name] = Score(name, fn, aliases, same_width, scaling, symbol, params, options)
        for a in aliases:
            ALIASES[a] = name
        return fn

    return deco


def get_score(name: str) -> Score:
    key = ALIASES.get(name, name)
    if key not in SCORES:
        choices = ", ".join(sorted([*SCORES, *ALIASES]))
        raise InputError(f"unknown score {name!r}; choose one of {choices}", "--score")
    return SCORES[key]


def score_names() -> list[str]:
    return [*SCORES, *ALIASES]


def _params() -> Any:
    import attncli.core.params as params  # here: `attncli --help` lists the scores without defining every step's type

    return params


# --- activations of the additive and location scores ----------------------------------

ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "tanh": lambda xp, x: xp.tanh(x),
    "relu": lambda xp, x: xp.where(x > 0, x, xp.zeros_like(x)),
    "identity": lambda xp, x: x,
}
DEFAULT_ACTIVATION = "tanh"
DEFAULT_BANDWIDTH = 1.0


def _activation(s: ScoreInput) -> tuple[str, Callable[[Any, Any], Any]]:
    name = s.options.activation or DEFAULT_ACTIVATION
    return name, ACTIVATIONS[name]


def _row_norms(xp: Any, a: Any) -> Any:
    """‖a_i‖ over the last axis, kept as (..., r, 1); a zero row gets 1 so that it stays zero.

    Each row is divided by its largest |entry| before squaring, so the norm of a row of 1e30
    (or 1e-30) in float32 neither overflows nor underflows: cosine stays scale-invariant."""
    mx = xp.max(xp.abs(a), axis=-1, keepdims=True)  # (..., r, 1)
    mx = xp.where(mx > 0, mx, xp.ones_like(mx))
    b = a / mx
    n = xp.sqrt(xp.sum(b * b, axis=-1, keepdims=True)) * mx  # (..., r, 1)
    return xp.where(n > 0, n, xp.ones_like(n))


# --- the scores ---------------------------------------------------------------------------


@register("dot")
def dot(s: ScoreInput) -> Any:
    """Dot product: s_ij = q_i · k_j. (..., m, d) x (..., n, d) -> (..., m, n)"""
    return s.q @ s.xp.matrix_transpose(s.k)  # (..., m, d) x (..., d, n) -> (..., m, n)


@register("scaled-dot", aliases=("sdpa", "scaled_dot"), scaling="sqrt-d")
def scaled_dot(s: ScoreInput) -> Any:
    """Scaled dot product: s_ij = q_i · k_j / sqrt(d). (..., m, d) x (..., n, d) -> (..., m, n)"""
    return s.q @ s.xp.matrix_transpose(s.k)  # (..., m, d) x (..., d, n) -> (..., m, n); scaled by the engine


@register("general", aliases=("bilinear",), same_width=False, symbol=terms("Q W ", Name("K"), "ᵀ"), params=(
    Param("W", ("d_q", "d_k"), fan_in="d_k", torch=("W.weight",)),
    Param("b", ("d_q",), optional=True, torch=("W.bias",)),
))
def general(s: ScoreInput) -> Any:
    """General (bilinear): s_ij = q_iᵀ W k_j (+ q_i·b). (..., m, d_q) x (d_q, d_k) x (..., n, d_k) -> (..., m, n)

    ``W`` is what Luong's ``nn.Linear(d_k, d_q)``, applied to the keys (``score = q ·
    attn(k)``), stores as ``W.weight``: used as is. Its optional bias ``b`` adds ``q_i·b`` to
    every score of row i. The notes' bilinear model ``x_iᵀ W q`` is this with W transposed.
    """
    xp, p = s.xp, s.params
    kw = s.k @ xp.matrix_transpose(p["W"])  # (..., n, d_k) x (d_k, d_q) -> (..., n, d_q)
    if "b" in p:
        kw = kw + p["b"]  # (..., n, d_q) + (d_q,)
    s.add_step("k_proj", _params().KeyInQuerySpace("b" in p), kw, (KEYS, FEATURES))
    return s.q @ xp.matrix_transpose(kw)  # (..., m, d_q) x (..., d_q, n) -> (..., m, n)


@register("additive", aliases=("concat", "bahdanau"), same_width=False,
          symbol=terms(Sub("w", "v"), "ᵀ ", Fn("act"), "(", Sub("W", "q"), " q + ", Sub("W", "k"), " k)"),
          options=("activation", "hidden"), params=(
    Param("W_q", ("d_q", "h"), fan_in="d_q", torch=("W_q.weight",), convert="transpose"),
    Param("W_k", ("d_k", "h"), fan_in="d_k", torch=("W_k.weight",), convert="transpose"),
    Param("w_v", ("h",), fan_in="h", torch=("w_v.weight",), convert="flatten"),
    Param("b", ("h",), optional=True, torch=("W_q.bias", "W_k.bias"), convert="sum"),
))
def additive(s: ScoreInput) -> Any:
    """Additive: s_ij = w_vᵀ act(q_i W_q + k_j W_k + b). (..., m, d_q), (..., n, d_k) -> (..., m, n, h) -> (..., m, n)

    As d2l's ``AdditiveAttention``: queries and keys are projected to the hidden width h,
    every (query, key) pair is summed (a (..., m, n, h) tensor), passed through the
    activation (tanh by default) and reduced to one number by ``w_v``.
    """
    xp, p = s.xp, s.params
    act_name, act = _activation(s)
    qh = s.q @ p["W_q"]  # (..., m, d_q) x (d_q, h) -> (..., m, h)
    kh = s.k @ p["W_k"]  # (..., n, d_k) x (d_k, h) -> (..., n, h)
    s.add_step("q_proj", _params().Projected("q"), qh, (QUERIES, HIDDEN))
    s.add_step("k_proj", _params().Projected("k"), kh, (KEYS, HIDDEN))
    f = qh[..., :, None, :] + kh[..., None, :, :]  # (..., m, 1, h) + (..., 1, n, h) -> (..., m, n, h)
    if "b" in p:
        f += p["b"]  # (..., m, n, h) + (h,), in place
    f = act(xp, f)
    s.add_step("features", _params().Features(act_name, "b" in p), f, (KEYS, HIDDEN),
               notes=[f"shape {tuple(f.shape)} = (..., queries, keys, h): one table per query (the last index of each "
                      "caption), rows keys, columns hidden units"])
    return f @ p["w_v"]  # (..., m, n, h) x (h,) -> (..., m, n)


@register("cosine", symbol=terms(Hat("Q"), " ", Hat("K"), "ᵀ"))
def cosine(s: ScoreInput) -> Any:
    """Cosine: s_ij = (q_i/‖q_i‖) · (k_j/‖k_j‖). (..., m, d) x (..., n, d) -> (..., m, n)

    Rows are normalised first (a zero row stays zero, so its scores are 0); ``--scale`` or
    ``--temperature`` then sharpen the scores, which otherwise lie in [-1, 1].
    """
    xp = s.xp
    qn = s.q / _row_norms(xp, s.q)  # (..., m, d) / (..., m, 1)
    kn = s.k / _row_norms(xp, s.k)  # (..., n, d) / (..., n, 1)
    s.add_step("q_normalised", _params().UnitRows("q"), qn, (QUERIES, FEATURES))
    s.add_step("k_normalised", _params().UnitRows("k"), kn, (KEYS, FEATURES))
    return qn @ xp.matrix_transpose(kn)  # (..., m, d) x (..., d, n) -> (..., m, n)


@register("gaussian", aliases=("nadaraya-watson",), symbol=terms("-‖q - k‖² / (2σ²)"), options=("bandwidth",),
          params=(Param("w", ("d_q",), optional=True, scalar_ok=True),))
def gaussian(s: ScoreInput) -> Any:
    """Gaussian kernel: s_ij = -‖q_i - k_j‖²/(2σ²), or -‖(q_i - k_j)⊙w‖²/2 (learned w). (..., m, d) x (..., n, d) -> (..., m, n)

    The softmax of these scores is Nadaraya-Watson kernel regression. With d2l's learned
    ``w`` (one number, or one per feature) the score is ``-((q - k) w)² / 2``, i.e. σ = 1/w.
    Squared distances are expanded as ‖q‖² + ‖k‖² - 2 q·k after centring on the keys' mean
    (a shift changes no distance and keeps the expansion accurate): no (m, n, d) tensor.
    """
    xp = s.xp
    c = xp.mean(s.k, axis=-2, keepdims=True)  # (..., 1, d)
    q, k = s.q - c, s.k - c
    if "w" in s.params:
        q, k = q * s.params["w"], k * s.params["w"]  # (..., r, d) ⊙ (d,) or a scalar
        half, sigma = 0.5, None
    else:
        sigma = s.options.bandwidth or DEFAULT_BANDWIDTH
        half = 1.0 / (2.0 * sigma * sigma)
    qq = xp.sum(q * q, axis=-1)[..., :, None]  # (..., m, 1)
    kk = xp.sum(k * k, axis=-1)[..., None, :]  # (..., 1, n)
    d2 = qq + kk - 2.0 * (q @ xp.matrix_transpose(k))  # (..., m, d) x (..., d, n) -> (..., m, n)
    d2 = xp.where(d2 < 0, xp.zeros_like(d2), d2)  # rounding can leave tiny negatives; NaN (overflow) stays NaN
    s.add_step("sq_dist", _params().SquaredDistance(sigma), d2, (QUERIES, KEYS))
    return -half * d2


@register("location", aliases=("location-based",), same_width=False, symbol=terms(Fn("act"), "(K W + b)"),
          options=("activation",), params=(
    Param("W", ("d_k",), fan_in="d_k", torch=("W.weight",), convert="flatten"),
    Param("b", (), optional=True, torch=("W.bias",), convert="flatten"),
))
def location(s: ScoreInput) -> Any:
    """Location-based: s_ij = act(Wᵀ k_j + b), the same for every query i. (..., n, d_k) x (d_k,) -> (..., m, n)

    No query takes part: one row of scores over the keys is computed and repeated for each
    of the m queries (and broadcast over the batch axes of Q and K), so every query gets the
    same weights; Q only sets the number of queries and the batch.
    """
    xp, p = s.xp, s.params
    act_name, act = _activation(s)
    r = s.k @ p["W"]  # (..., n, d_k) x (d_k,) -> (..., n)
    if "b" in p:
        r = r + p["b"]
    r = act(xp, r)[..., None, :]  # (..., 1, n)
    s.add_step("key_scores", _params().KeyScores(act_name, "b" in p), r, ("", KEYS))
    return r + xp.zeros_like(s.q[..., :1])  # (..., 1, n) + (..., m, 1) -> (..., m, n), a new array


# --- scaling rules: each returns the factor the raw scores are multiplied by -------------


@dataclass(frozen=True)
class Scaling:
    name: str
    factor: Callable[[Any, Any, int, int], Any]  # (xp, scores, d, n) -> factor (number or array)
    generic: tuple[Term, ...]  # the rule in symbols, e.g. S / √d
    expr: Callable[[Term, int, int], tuple[Term, ...]]  # (the scores, d, n) -> the rule applied, e.g. 8 / √4

    def describe(self, d: int, n: int) -> tuple[Term, ...]:
        """The rule in the step's formula, e.g. S / √d = S / √4."""
        applied = self.expr(Name("S"), d, n)
        return self.generic if text(applied) == text(self.generic) else terms(self.generic, " = ", applied)


SCALINGS: dict[str, Scaling] = {}
# Scaling rules whose factor depends only on d and n, not on the scores themselves.
CONSTANT_SCALINGS = {"none", "sqrt-d", "seq"}


ScalingFn = Callable[[Any, Any, int, int], Any]
S = Name("S")  # the raw scores in a rule


def scaling(name: str, generic: tuple[Term, ...], expr: Callable[[Term, int, int], tuple[Term, ...]]
            ) -> Callable[[ScalingFn], ScalingFn]:
    def deco(fn: ScalingFn) -> ScalingFn:
        SCALINGS[name] = Scaling(name, fn, generic, expr)
        return fn

    return deco


@scaling("none", terms(S), lambda x, d, n: (x,))
def _no_scaling(xp: Any, s: Any, d: int, n: int) -> float:
    """No scaling: S."""
    return 1.0


@scaling("sqrt-d", terms(S, " / ", Root("d")), lambda x, d, n: terms(x, " / ", Root(str(d))))
def _sqrt_d(xp: Any, s: Any, d: int, n: int) -> float:
    """Divide by the square root of the query width: S / sqrt(d)."""
    return 1.0 / math.sqrt(d)


@scaling("seq", terms(S, " / (", Root("d"), "·", Root("n"), ")"), lambda x, d, n: terms(x, " / (", Root(str(d)), "·",
                                                                                       Root(str(n)), ")"))
def _seq(xp: Any, s: Any, d: int, n: int) -> float:
    """Divide by sqrt(d)·sqrt(n), for long sequences."""
    return 1.0 / (math.sqrt(d) * math.sqrt(n))


@scaling("norm", terms(S, " / ", Sub("‖S‖", "F")), lambda x, d, n: terms(x, " / ", Sub("‖S‖", "F")))
def _norm(xp: Any, s: Any, d: int, n: int) -> Any:
    """Divide each score matrix by its Frobenius norm ‖QKᵀ‖_F."""
    finite = xp.where(xp.isfinite(s), s, xp.zeros_like(s))
    f = xp.sqrt(xp.sum(finite * finite, axis=(-2, -1), keepdims=True))  # (..., 1, 1)
    return 1.0 / xp.where(f > 0, f, xp.ones_like(f))
