"""Explanations: the arithmetic behind one weight (``--explain QUERY,KEY``) or one query row
(``--explain-row QUERY``), written the way the notes write it::

    sim(milk, cat) = q(milk) · k(cat) = 1×2 + 3×2 = 8
    scaled: 8 / √4 = 4
    weight = exp(4) / Σ exp(row) = 54.5982 / 661.0383 = 0.0826

This module only reads numbers the engine already computed (the Trace's inputs and steps)
and writes them out as sentences; the per-score part (how one score is made from q and k)
is a registry keyed by score name, so a new score plugs in with one decorated function.

Cells are given as ``QUERY,KEY`` by label or index; with leading (batch or head) axes a
prefix picks the entry: ``0:2,1`` is batch 0, query 2, key 1, and ``1,3:it,milk`` is
batch 1, head 3. Without a prefix the first entry is explained (and the heading says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.console import Console

from attncli.core import chain, formula, ops
from attncli.core.params import Features, Rotation
from attncli.core.scoring import SCALINGS
from attncli.core.trace import KEYS, QUERIES, Trace
from attncli.errors import InputError
from attncli.render import RenderOptions
from attncli.render.numbers import num  # noqa: F401  (tests read it here: the tables' notation, one rounding everywhere)
from attncli.render.terminal import EXPLAINERS, axis_labels
from attncli.render.terms import (
    MAX_FEATURES,
    Fn,
    Formula,
    Gap,
    Label,
    Line,
    Math,
    Name,
    Num,
    Root,
    ScoreFormula,
    Sub,
    Term,
    Words,
    joined,
    vector,
)
from attncli.render.wrap import say

MAX_TERMS = 8  # products / exponentials / value rows written out before eliding the middle
OVERFLOW_SAFE = 50.0  # above this row max, exp(x) is shown only in its shifted (stable) form


def elide(terms: list[list[Term]], total: int | None = None, joiner: Term = " + ") -> list[Term]:
    """Join terms, writing only the first and last few when there are many."""
    if len(terms) <= MAX_TERMS:
        return joined(terms, joiner)
    total = total or len(terms)
    return [*joined([*terms[:4], ["…"], *terms[-2:]], joiner), Gap(), "(", Words(f"{total} terms"), ")"]


def elide_each(values: Any, fmt: Callable[[Any], list[Term]], joiner: Term = " + ") -> list[Term]:
    """:func:`elide` of ``fmt(v)`` for each value, formatting only the terms it shows (a row of 10⁵ keys: six)."""
    n = len(values)
    if n <= MAX_TERMS:
        return elide([fmt(v) for v in values], n, joiner)
    shown: list[list[Term]] = [*(fmt(v) for v in values[:4]), ["…"], *(fmt(v) for v in values[-2:])]
    return [*joined(shown, joiner), Gap(), "(", Words(f"{n} terms"), ")"]


def _pad(s: str, width: int) -> str:
    """The spaces that right-align ``s`` in ``width`` characters (as f"{s:>width}")."""
    return " " * max(0, width - len(s))


@dataclass
class Cell:
    """One (batch..., query i, key j) position of the weights, with what the explainers need."""

    trace: Trace
    batch: tuple[int, ...]
    i: int
    j: int
    precision: int = 4
    _rows: dict[str, np.ndarray | None] = field(default_factory=dict, repr=False, compare=False)

    @property
    def query(self) -> str:
        return axis_labels(self.trace, QUERIES, self.i + 1)[self.i]

    @property
    def key(self) -> str:
        return axis_labels(self.trace, KEYS, self.j + 1)[self.j]

    def input_row(self, name: str, row: int) -> np.ndarray | None:
        """Row ``row`` of input ``name`` (q, k, v) in this cell's batch entry, or None if absent."""
        a = self.input_rows(name)
        return None if a is None else a[row]

    def input_rows(self, name: str) -> np.ndarray | None:
        """Every row of input ``name`` (q, k, v) in this cell's batch entry, (T, d) as float64, or None if
        absent. Only that entry is read (and converted): a row's output reads every value row, and
        copying (B, H, T, d) once per row would cost T times the input."""
        cache = self._rows
        if name not in cache:
            cache[name] = self._entry_rows(name)
        return cache[name]

    def _entry_rows(self, name: str) -> np.ndarray | None:
        t = self.trace
        if t.meta.heads and name in t:
            return self._head_rows(name)
        if name not in t.inputs:
            return None
        a = t.inputs_numpy()[name]
        lead = t.weights.shape[:-2]
        if a.ndim - 2 > len(lead):  # more leading axes than the weights: indexed as they are
            return np.asarray(a[self.batch], dtype=np.float64)
        r = t.meta.rep
        grouped = r > 1 and name in ("k", "v") and a.ndim >= 3 and t.meta.head is None
        off = len(lead) - (a.ndim - 2)  # the input's leading axes are the weights' last ones (broadcasting)
        idx = []
        for ax, size in enumerate(a.shape[:-2]):
            b = self.batch[off + ax]
            if grouped and ax == a.ndim - 3:
                b //= r  # grouped-query: query head h reads K/V head h // r (the core's map, stages.expand_kv)
            idx.append(0 if size == 1 else b)
        return np.asarray(a[tuple(idx)], dtype=np.float64)

    def _head_rows(self, name: str) -> np.ndarray | None:
        """Multi-head: this head's slice of the projected ``name`` (q, k, v steps of width heads × d_h)."""
        t = self.trace
        axis, widths = t.meta.head_axis, t.meta.head_width or {}
        if not isinstance(axis, int) or name not in widths:
            return None
        if t.meta.head is not None:  # a view of one head (--head): the batch has no head axis
            h, rest = t.meta.head, self.batch
        elif axis < len(self.batch):
            h, rest = self.batch[axis], tuple(b for ax, b in enumerate(self.batch) if ax != axis)
        else:
            return None
        dh = int(widths[name])
        if name in ("k", "v"):
            h //= t.meta.rep  # grouped-query: query head h reads K/V head h // r
        src = f"{name}_clip" if f"{name}_clip" in t else name  # OLMo: the heads read the clamped projection
        a = np.asarray(t[src])
        if a.ndim - 2 != len(rest):
            return None
        return np.asarray(a[rest][..., h * dh:(h + 1) * dh], dtype=np.float64)  # (T, d_h)

    def vector(self, name: str, *idx: int) -> np.ndarray | None:
        """The last axis of step ``name`` at this batch entry and ``idx`` (e.g. q_proj row i, features [i, j])."""
        if name not in self.trace:
            return None
        a = np.asarray(self.trace[name])
        lead = self.trace.weights.shape[:-2]
        core = a.ndim - len(lead)
        if core != len(idx) + 1 or core < 1:
            return None
        try:
            a = np.broadcast_to(a, lead + a.shape[len(lead):] if len(lead) <= a.ndim else a.shape)
            return np.asarray(a[self.batch][idx], dtype=np.float64)  # this entry alone converted
        except (ValueError, IndexError):
            return None

    def head(self) -> int:
        """The (query) head of this cell: --head's, else the last leading axis when there are heads, else 0."""
        t = self.trace
        if t.meta.head is not None:
            return t.meta.head
        axis = t.meta.head_axis
        if isinstance(axis, int) and axis < len(self.batch):
            return self.batch[axis]
        return self.batch[-1] if self.batch and t.weights.ndim >= 3 else 0

    def scored(self, name: str, row: int) -> tuple[str, np.ndarray | None]:
        """The q (or k) row that the score read: tuned (q_temp), rotated (q_rot) or normalised (q_norm), whichever
        came last (QK-norm after RoPE), clamped (q_clip) or as projected."""
        names = self.trace.names()
        if f"{name}_temp" in names:
            return f"{name}_temp", self.vector(f"{name}_temp", row)
        done = [s for s in (f"{name}_rot", f"{name}_norm") if s in names]
        if done:
            step = max(done, key=names.index)
            return step, self.vector(step, row)
        clipped = f"{name}_clip"
        return (clipped if clipped in names else name), self.input_row(name, row)

    def step(self, name: str) -> float:
        a = self.trace[name]
        a = np.broadcast_to(a, self.trace.weights.shape)
        return float(a[self.batch][self.i, self.j])

    def row(self, name: str) -> np.ndarray:
        a = np.broadcast_to(self.trace[name], self.trace.weights.shape)
        return np.asarray(a[self.batch][self.i], dtype=np.float64)


# ---- per-score explanations: how one raw score is made --------------------------------------

ScoreExplainer = Callable[[Cell], list[Line]]
SCORE_EXPLAINERS: dict[str, ScoreExplainer] = {}


def explains(*names: str) -> Callable[[ScoreExplainer], ScoreExplainer]:
    """Register the explainer of one score's arithmetic for the scores ``names``."""

    def deco(fn: ScoreExplainer) -> ScoreExplainer:
        for n in names:
            SCORE_EXPLAINERS[n] = fn
        return fn

    return deco


def _of(name: str, label: str) -> list[Term]:
    """q(milk): a step's (or input's) row at a label."""
    return [Name(name), "(", Label(label), ")"]


def _at(fn: str, c: Cell) -> list[Term]:
    """sim(milk, cat): a function of this cell's query and key."""
    return [Fn(fn), "(", Label(c.query), ", ", Label(c.key), ")"]


def _step_formula(t: Trace, name: str) -> Formula:
    return Formula(name, t.step(name).formula)


@explains("dot", "scaled-dot")
def explain_dot(c: Cell) -> list[Line]:
    """sim(q, k) = Σ_t q_t × k_t, written term by term (terms with a zero factor left out, as the notes do)."""
    (qn, q), (kn, k), p = c.scored("q", c.i), c.scored("k", c.j), c.precision
    s = c.step("scores")
    pre = position_lines(c)
    head = [*_at("sim", c), " = ", *_of(qn, c.query), " · ", *_of(kn, c.key)]
    if q is None or k is None:
        return [*pre, Line(head, " = ", Num(s, p))]
    terms: list[list[Term]] = [[Num(a, p, True), "×", Num(b, p, True)] for a, b in zip(q, k) if a != 0 and b != 0]
    skipped = len(q) - len(terms)
    if not terms:
        return [*pre, Line(head, " = ", Num(s, p), Gap(), "(", Words("every product has a zero factor"), ")")]
    lines = [*pre, Line(head, " = ", elide(terms, len(terms)), " = ", Num(s, p))]
    if skipped:
        lines.append(Line("    (", Words(f"{skipped} of the {len(q)} products have a zero factor and are left out"), ")"))
    return lines


def position_lines(c: Cell) -> list[Line]:
    """Grouped-query heads, QK-norm and RoPE before the score: which K/V head, the normalised and rotated rows."""
    t, p = c.trace, c.precision
    lines = []
    r = t.meta.rep
    if r > 1:
        h = c.head()
        lines.append(Line(Words(f"grouped-query: query head {h} reads K/V head {h // r}"), f" (= {h} // {r})"))
    for name, row, label in (("q", c.i, c.query), ("k", c.j, c.key)):
        for step in (f"{name}_norm", f"{name}_rot", f"{name}_temp"):
            if step in t:
                v = c.vector(step, row)
                if v is not None:
                    lines.append(Line(_of(step, label), " = ", vector(v, p), Gap(), "[", _step_formula(t, step), "]"))
    rope = t.step("q_rot").params if "q_rot" in t else None
    if isinstance(rope, Rotation):
        pq = rope.q_offset + c.i
        lines.append(Line("    ", Words("query "), Label(c.query), Words(f" is at position {pq}, key "), Label(c.key),
                          Words(f" at {c.j}: the rotated score depends on "), f"{pq} - {c.j} = {pq - c.j}",
                          Words(" only")))
    return lines


def _terms(a: np.ndarray, b: np.ndarray, p: int) -> list[Term]:
    """'a1×b1 + a2×b2 + …' (products with a zero factor left out)."""
    terms: list[list[Term]] = [[Num(x, p, True), "×", Num(y, p, True)] for x, y in zip(a, b) if x != 0 and y != 0]
    return elide(terms, len(terms)) if terms else ["0"]


@explains("additive")
def explain_additive(c: Cell) -> list[Line]:
    """w_vᵀ act(q W_q + k W_k + b): the two projections, the activated sum, the dot with w_v."""
    t, p = c.trace, c.precision
    qh, kh, f = c.vector("q_proj", c.i), c.vector("k_proj", c.j), c.vector("features", c.i, c.j)
    wv = np.asarray(t.inputs_numpy()["w_v"], dtype=np.float64).ravel() if "w_v" in t.inputs else None
    if qh is None or kh is None or f is None or wv is None:
        return explain_generic(c)
    par = t.step("features").params
    feat: list[Term] = ([Fn(par.activation), "(q ", Sub("W", "q"), " + k ", Sub("W", "k"), " + b" if par.bias else "", ")"]
                        if isinstance(par, Features) else [Name("features")])
    return [Line(_of("q", c.query), " ", Sub("W", "q"), " = ", vector(qh, p)),
            Line(_of("k", c.key), " ", Sub("W", "k"), " = ", vector(kh, p)),
            Line(feat, " = ", vector(f, p), Gap(), f"(h = {len(f)})"),
            Line(_at("score", c), " = ", Sub("w", "v"), " · ", Words("that"), " = ", _terms(wv, f, p), " = ",
                 Num(c.step("scores"), p))]


@explains("general")
def explain_general(c: Cell) -> list[Line]:
    """q · (W k (+ b)): the key brought into query space, then a dot product."""
    p = c.precision
    q, kw = c.input_row("q", c.i), c.vector("k_proj", c.j)
    if q is None or kw is None:
        return explain_generic(c)
    return [Line("W ", _of("k", c.key), " = ", vector(kw, p), Gap(), "(", _step_formula(c.trace, "k_proj"), ")"),
            Line(_at("score", c), " = ", _of("q", c.query), " · W ", _of("k", c.key), " = ", _terms(q, kw, p), " = ",
                 Num(c.step("scores"), p))]


@explains("cosine")
def explain_cosine(c: Cell) -> list[Line]:
    """cos(q, k) = q·k / (‖q‖ ‖k‖)."""
    p = c.precision
    q, k = c.input_row("q", c.i), c.input_row("k", c.j)
    if q is None or k is None:
        return explain_generic(c)
    nq, nk = float(np.linalg.norm(q)), float(np.linalg.norm(k))
    qk = float(q @ k)  # (d,) x (d,) -> ()
    return [Line(_of("q", c.query), " · ", _of("k", c.key), " = ", _terms(q, k, p), " = ", Num(qk, p)),
            Line("‖", _of("q", c.query), "‖ = ", Num(nq, p), ",", Gap(2), "‖", _of("k", c.key), "‖ = ", Num(nk, p)),
            Line(_at("cos", c), " = ", Num(qk, p), " / (", Num(nq, p), " × ", Num(nk, p), ") = ",
                 Num(c.step("scores"), p))]


@explains("gaussian")
def explain_gaussian(c: Cell) -> list[Line]:
    """-‖q - k‖² / (2σ²): the squared distance, then the kernel's exponent."""
    p = c.precision
    q, k = c.input_row("q", c.i), c.input_row("k", c.j)
    if q is None or k is None or "sq_dist" not in c.trace:
        return explain_generic(c)
    d2 = c.step("sq_dist")
    diff: list[Term] = (joined([["(", Num(a, p), " − ", Num(b, p, True), ")²"] for a, b in zip(q, k)]) if len(q) <= MAX_FEATURES
            else [Sub("Σ", "t"), " (", Sub("q", "t"), " − ", Sub("k", "t"), ")²"])
    return [Line(_step_formula(c.trace, "sq_dist"), ": ‖", _of("q", c.query), " − ", _of("k", c.key), "‖² = ", diff,
                 " = ", Num(d2, p)),
            Line(_at("score", c), " = -", Num(d2, p), " / (2σ²) = ", Num(c.step("scores"), p))]


@explains("location")
def explain_location(c: Cell) -> list[Line]:
    """act(Wᵀ k + b): a score per key, the same for every query."""
    p = c.precision
    if "key_scores" not in c.trace:
        return explain_generic(c)
    return [Line(_step_formula(c.trace, "key_scores"), Words(" for key "), Label(c.key), " = ", Num(c.step("scores"), p)),
            Line("    (", Words("location-based: no query takes part; every query, "), Label(c.query),
                 Words(" included, gets this score"), ")")]


def explain_generic(c: Cell) -> list[Line]:
    """Any score without its own explainer: its formula, its intermediate steps at this cell, its value."""
    t, p = c.trace, c.precision
    lines = [Line(_at("score", c), ": ", ScoreFormula(str(t.meta.score), str(t.meta.score_formula or t.meta.score)))]
    for st in t.steps:
        if st.name == "scores":
            break
        a = st.numpy()
        if st.axes == (QUERIES, KEYS) and a.shape[-2:] == t.weights.shape[-2:]:
            x = float(np.broadcast_to(a, t.weights.shape)[c.batch][c.i, c.j])
            lines.append(Line("    ", Name(st.name), " = ", Num(x, p), Gap(), "[", _step_formula(t, st.name), "]"))
        elif a.ndim >= 3 and a.shape[-3:-1] == t.weights.shape[-2:]:  # (..., m, n, h): e.g. additive features
            v = np.asarray(a[c.batch] if a.ndim - 3 == len(c.batch) else a)[c.i, c.j]
            lines.append(Line("    ", Name(st.name), " = ", vector(v, p), Gap(), "[", _step_formula(t, st.name), "]"))
    lines.append(Line(_at("score", c), " = ", Num(c.step("scores"), p)))
    return lines


# ---- the steps every score shares: scaling, mask, softmax -----------------------------------


def _scaling_terms(name: str, s: Num, d: int, n: int) -> list[Term]:
    """The scaling rule ``name`` applied to the score ``s``, as terms (attncli.core.scoring's rules; a rule
    registered without terms here is written as its display text)."""
    if name == "none":
        return [s]
    if name == "sqrt-d":
        return [s, " / ", Root(str(d))]
    if name == "seq":
        return [s, " / (", Root(str(d)), "·", Root(str(n)), ")"]
    if name == "norm":
        return [s, " / ", Sub("‖S‖", "F")]
    return [Math(SCALINGS[name].expr(formula.Sym(s.text()), d, n))]


def scaling_lines(c: Cell) -> list[Line]:
    if "scaled" not in c.trace:
        return []
    p = c.precision
    s, x = c.step("scores"), c.step("scaled")
    info = c.trace.meta.scaling  # the rule, its factor, d and n (typed), never read back from the formula
    if info is None:
        return []
    plain = info.name == "none"  # the temperature alone
    expr: list[Term]
    if info.name == "scale":
        expr = [Num(s, p), " · ", Num(info.factor or 0.0, p)]
    else:
        expr = _scaling_terms(info.name, Num(s, p), info.d, info.n)
    if info.factor is None and not plain:  # a factor that depends on the matrix (e.g. its norm)
        expr += [" (= ", Num(s, p), " × ", Num(x / s if s else 0, p), ")"]
    if info.temperature is not None:
        t = Num(info.temperature, p)
        expr = (["(", *expr, ") / T = (", *expr, ") / ", t] if not plain
                else [Num(s, p), " / T = ", Num(s, p), " / ", t])
    return [Line(Words("scaled: "), expr, " = ", Num(x, p))]


SCORE_CHAIN = chain.LOGIT_STEPS  # the steps from the score to the softmax's input, in the chain's order


def _before(t: Trace, name: str) -> str:
    """The step of the chain just before ``name`` in this run."""
    done: list[str] = [n for n in SCORE_CHAIN if n in t.names()]
    return done[done.index(name) - 1] if name in done and done.index(name) > 0 else "scores"


def cap_lines(c: Cell) -> list[Line]:
    """Soft-capping: c·tanh(s / c) of this cell."""
    if "capped" not in c.trace:
        return []
    par = c.trace.step("capped").params  # the cap itself (chain.Cap), never read back from the formula
    p, cap = c.precision, f"{par.c:g}" if isinstance(par, chain.Cap) else "c"
    s = c.step(_before(c.trace, "capped"))
    return [Line(Words("capped: "), cap, " · ", Fn("tanh"), "(", Num(s, p), " / ", cap, ") = ", Num(c.step("capped"), p),
                 Gap(), "(", Words("soft-capping, after the scale"), ")")]


def alibi_lines(c: Cell) -> list[Line]:
    """ALiBi: the bias added to this cell, recomputed from the step's parameters in its form (chain.Alibi)."""
    if "alibi" not in c.trace:
        return []
    p = c.precision
    s, a = c.step(_before(c.trace, "alibi")), c.step("alibi")
    par = c.trace.step("alibi").params
    al = par.alibi if isinstance(par, chain.Bias) else None
    pq = (al.q_offset if al else 0) + c.i
    where: list[Term] = ["(", Words("key "), Label(c.key), Words(f" is {pq - c.j} position(s) before query "),
                         Label(c.query), ")"]
    head: list[Term] = [Words("alibi: "), Num(s, p), " + "]
    if al is None:
        return [Line(head, Words("slope"), f" · ({c.j} - {pq}) = ", Num(a, p), Gap(), where)]
    h = c.head()
    slope, b = al.slopes[h], al.value(h, c.i, c.j)
    if al.form == "relative":
        if al.r is None:
            return [Line(head, Words("slope "), Num(slope, 6), f" · ({c.j} - {pq}) = ", Num(a, p), Gap(), where)]
        term: list[Term] = [f"{slope:.9g} · ({c.j} - {pq}) / ", Math((chain.divisor(al.r),))]
        return [Line(head, term, " = ", Num(s, p), " + ", f"{b!r}", " = ", Num(a, p), Gap(), where)]
    added = Math(chain.alibi_terms(al, formula.Num(slope, ".9g"), formula.Num(c.j)))  # this head's slope, this key
    return [Line(head, added, " = ", Num(s, p), " + ", f"{b!r}", " = ", Num(a, p), Gap(), "(",
                 Words(f"ALiBi {al.form}: key "), Label(c.key),
                 Words(f" at absolute position {c.j}, the same for every query; query "), Label(c.query),
                 Words(f" is at {pq}"), ")")]


def mask_lines(c: Cell) -> list[Line]:
    if "masked" not in c.trace:
        return []
    p = c.precision
    before = c.step(_before(c.trace, "masked"))
    after = c.step("masked")
    key: list[Term] = [Words("mask: key "), Label(c.key)]
    if after == before:
        return [Line(key, Words(" takes part for query "), Label(c.query), " (", Words("unchanged: "), Num(after, p), ")")]
    if math.isinf(after) and after < 0:
        return [Line(key, Words(" is masked for query "), Label(c.query), ": ", Num(before, p), " → ", Num(after, p),
                     Words(", so its weight is exactly 0"))]
    return [Line(key, Words(" is masked for query "), Label(c.query), ": ", Num(before, p), " → ", Num(after, p))]


def row_exponentials(c: Cell) -> tuple[str, np.ndarray, float, np.ndarray, float]:
    """The softmax's input row (the step it read: masked, scaled or scores), its finite max,
    exp(x - max) (each <= 1; masked keys 0) and their sum, as the explanations write them."""
    t = c.trace
    pre = chain.softmax_input(t.names())
    x = c.row(pre)
    mx, e, z = ops.softmax_parts(np, x)  # the engine's own softmax, for one row
    return pre, x, float(mx[0]), e, float(z[0])


def _exp(*arg: Term) -> list[Term]:
    return [Fn("exp"), "(", *arg, ")"]


SUM_EXP_ROW: list[Term] = ["Σ ", *_exp(Words("row"))]


def softmax_lines(c: Cell) -> list[Line]:
    """weight = exp(x_j) / Σ_k exp(x_k), with the row's exponentials and their sum (stable form too)."""
    t, p = c.trace, c.precision
    pre, x, mx, e, z = row_exponentials(c)
    w = c.step(_softmax_step(t))
    if not np.isfinite(x).any():
        return [Line(Words("weight"), " = 0: ", Words("every key of query "), Label(c.query),
                     Words(" is masked, so the row has no weights"))]
    weight: list[Term] = [Words("weight"), " = "]
    sink = sink_logit(c)
    if sink is not None:
        top = max(mx, sink)
        es, ex = math.exp(sink - top), np.exp(np.where(np.isfinite(x), x, -np.inf) - top)
        zz = es + float(np.sum(ex))
        return [Line(weight, _exp(Num(x[c.j], p)), " / (", _exp(Words("sink")), " + ", SUM_EXP_ROW, ")",
                     Words(" with this head's sink logit "), Num(sink, p)),
                Line("    ", Words("stable form (the max "), Num(top, p), Words(" of the row and the sink subtracted): "),
                     Num(float(ex[c.j]), p), " / (", Num(es, p), " + ", Num(float(np.sum(ex)), p), ") = ", Num(w, p)),
                Line("    ", Words("the sink takes "), Num(es / zz, p), Words(" of the row: its weights sum to "),
                     Num(1 - es / zz, p))]
    xj = x[c.j]
    terms_x = elide_each(x, lambda v: _exp(Num(v, p)))
    lines = [Line(weight, _exp(Num(xj, p)), " / ", SUM_EXP_ROW, Words(f" over the {len(x)} keys of "), Label(c.query))]
    if mx <= OVERFLOW_SAFE:
        ex = np.exp(np.where(np.isfinite(x), x, -np.inf))
        total = Num(float(np.sum(ex)), p)
        lines.append(Line("    ", SUM_EXP_ROW, " = ", terms_x))
        lines.append(Line("               = ", elide_each(ex, lambda v: [Num(v, p)]), " = ", total))
        lines.append(Line("    ", weight, Num(float(ex[c.j]), p), " / ", total, " = ", Num(w, p)))
    lines.append(Line("    ", Words("stable form: the row max "), Num(mx, p),
                      Words(" is subtracted first (the weights stay the same)")))
    lines.append(Line("        ", _exp(Num(xj, p), " − ", Num(mx, p, True)), " / Σ ",
                      _exp(Words("row"), " − ", Num(mx, p, True))))
    lines.append(Line("        = ", Num(float(e[c.j]), p), " / ", Num(z, p), " = ", Num(w, p)))
    for st in _after_weights(t):
        v = float(np.broadcast_to(st.numpy(), t.weights.shape)[c.batch][c.i, c.j])
        lines.append(Line(Words("then "), _step_formula(t, st.name), ": ", Num(v, p)))
    return lines


def sink_logit(c: Cell) -> float | None:
    """This cell's head's sink logit, or None without sinks."""
    sinks = c.trace.meta.sinks
    if not sinks:
        return None
    return float(sinks[c.head() if len(sinks) > 1 else 0])


def _after_weights(t: Trace) -> list[Any]:
    """The steps after the softmax that change the weights (hard, dropout), in order."""
    return [t.step(n) for n in ("hard", "dropout") if n in t.names()]


def _softmax_step(t: Trace) -> str:
    """The softmax's step: ``softmax`` when hard attention or dropout follow it, else ``weights``."""
    return "softmax" if "softmax" in t.names() else "weights"


def _weighted_sum_step(t: Trace) -> Any:
    """The step that is weights · V for each entry of the weights' leading axes ('output', or the
    per-head output in multi-head attention), or None."""
    for name in ("head_output", "output"):
        if name in t.names():
            return t.step(name)
    return None


def explain_cell(c: Cell) -> list[Line]:
    """Every line of one cell's explanation: score arithmetic, scaling, mask, softmax."""
    score = str(c.trace.meta.score)
    fn = SCORE_EXPLAINERS.get(score, explain_generic)
    lines = fn(c)
    if fn is not explain_dot:
        lines = [*position_lines(c), *lines]
    return [*lines, *scaling_lines(c), *cap_lines(c), *alibi_lines(c), *mask_lines(c), *softmax_lines(c)]


def explain_row(c: Cell) -> list[Line]:
    """One query row: its softmax key by key, and its output as the weighted sum of value rows."""
    t, p = c.trace, c.precision
    pre, x, mx, e, z = row_exponentials(c)
    w = c.row(t.meta.weights_step or "weights")  # the weights that multiplied V
    klab = axis_labels(t, KEYS, len(x))
    lines = [Line(Words("softmax of row "), Label(c.query), " (", Name(pre), Words("; row max "), Num(mx, p),
                  Words(" subtracted, "), "Σ ", _exp("x − ", Fn("max")), " = ", Num(z, p), "):")]
    sink = sink_logit(c)
    if sink is not None:
        share = 1.0 - float(np.sum(w))
        lines[0] = Line(Words("softmax of row "), Label(c.query), Words(" with this head's sink logit "), Num(sink, p),
                        Words(" in the denominator ("), Name(pre), Words("; the sink takes "), Num(share, p),
                        Words(" of the row):"))
    top = strongest(w)
    for j in top:
        xs, es = Num(float(x[j]), p), Num(float(e[j]), p)
        lines.append(Line("    ", _pad(klab[j], 12), Label(klab[j]), ": ", Name(pre), " ", _pad(xs.text(), 10), xs, Gap(),
                          _exp("x − ", Fn("max")), " ", _pad(es.text(), 10), es, Gap(), Words("weight "),
                          Num(float(w[j]), p)))
    if len(top) < len(x):
        rest = np.delete(w, top)
        if float(np.max(rest)) == 0:
            lines.append(Line("    … ", Words(f"and {len(rest)} more keys with weight 0")))
        else:
            lines.append(Line("    … ", Words(f"and {len(rest)} more keys with smaller weights (together "),
                              Num(float(np.sum(rest)), p), Words("; each at most "), Num(float(np.max(rest)), p), ")"))
    lines.append(Line("    ", Words("the weights sum to "), Num(float(np.sum(w)), p)))
    st = _weighted_sum_step(t)
    if st is None:
        return lines
    o = st.numpy()
    out = np.asarray(np.broadcast_to(o, t.weights.shape[:-1] + o.shape[-1:])[c.batch][c.i])
    rows = c.input_rows("v")
    if rows is None:
        lines.append(Line(_of(st.name, c.query), " = ", Sub("Σ", "j"), " ", Sub("weight", "j"), " · ", Sub("v", "j"),
                          " = ", vector(out, p), Gap(), "[", _step_formula(t, st.name), "]"))
        return lines
    v = rows  # (n, d_v): this batch entry's (and head's) value rows
    nz = [j for j in range(len(w)) if w[j] != 0]
    zero = len(w) - len(nz)
    more: list[Term] = []
    if len(nz) > MAX_TERMS:  # the strongest terms, in key order, and the rest summed up
        shown_terms = [j for j in strongest(w) if w[j] != 0]
        shown_set = set(shown_terms)
        others = [j for j in nz if j not in shown_set]
        part = np.asarray(w)[others] @ v[others]  # (r,) x (r, d_v) -> (d_v,)
        more = [" + [", Words(f"{len(others)} smaller terms: "), vector(part, p), "]"]
        nz = shown_terms
    sym: list[list[Term]] = [[Num(float(w[j]), p), "·", *_of("v", klab[j])] for j in nz]
    num_terms: list[list[Term]] = [[Num(float(w[j]), p), "·", vector(v[j], p)] for j in nz]
    name = "out" if st.name == "output" else st.name
    lines.append(Line(_of(name, c.query), " = ", joined(sym) or ["0"],
                      [" + … (", Words(f"{len(w) - zero - len(nz)} more"), ")"] if more else []))
    lines.append(Line("    = ", joined(num_terms) or ["0"], more))
    lines.append(Line("    = ", vector(out, p)))
    if zero:
        lines.append(Line("    (", Words(f"{zero} keys with weight 0 are left out"), ")"))
    return lines


def strongest(w: np.ndarray) -> list[int]:
    """Every key of a short row; for a long row the MAX_TERMS - 2 largest weights, in key order."""
    if len(w) <= MAX_TERMS:
        return list(range(len(w)))
    k = MAX_TERMS - 2
    return sorted(int(j) for j in np.argsort(-np.asarray(w), kind="stable")[:k])


# ---- parsing QUERY,KEY and BATCH:QUERY ------------------------------------------------------


PLURAL = {"query": "queries", "key": "keys"}


def _index(token: str, labels: list[str], what: str, count: int, spec: str, option: str = "--explain") -> int:
    """A label (as given, then without its surrounding spaces; ␣ stands for a token's own space) or a position. A
    label that occurs more than once is ambiguous: named with its positions, never silently the first."""
    whats = PLURAL.get(what, f"{what}s")
    for name in dict.fromkeys((token, token.strip())):
        hits = [k for k, label in enumerate(labels) if name in (label, label.replace("␣", " "))]
        if len(hits) > 1:
            raise InputError(f"{spec!r}: {what} {name!r} is ambiguous: it is at positions "
                             f"{', '.join(map(str, hits[:8]))}{', …' if len(hits) > 8 else ''}; give a position",
                             option)
        if hits:
            return hits[0]
    hits = [k for k, label in enumerate(labels) if label.replace("␣", " ").strip() == token.strip()]  # cat: ␣cat
    if len(hits) > 1:
        raise InputError(f"{spec!r}: {what} {token.strip()!r} is ambiguous: it is at positions "
                         f"{', '.join(map(str, hits[:8]))}{', …' if len(hits) > 8 else ''}; give a position", option)
    if hits:
        return hits[0]
    token = token.strip()
    try:
        i = int(token)
    except ValueError:
        shown = ", ".join(labels[:12]) + (", …" if len(labels) > 12 else "")
        raise InputError(f"{spec!r}: no {what} named {token!r}; {whats} are {shown} (or an index 0..{count - 1})",
                         option) from None
    if not 0 <= i < count:
        raise InputError(f"{spec!r}: {what} index {i} is out of range (there are {count} {whats}: 0..{count - 1})",
                         option)
    return i


def _batch(prefix: str | None, lead: tuple[int, ...], spec: str, option: str = "--explain") -> tuple[int, ...]:
    if prefix is None:
        return (0,) * len(lead)
    if not lead:
        raise InputError(f"{spec!r}: a batch prefix was given but the weights have no batch axes", option)
    try:
        idx = tuple(int(x) for x in prefix.split(","))
    except ValueError:
        raise InputError(f"{spec!r}: the batch prefix {prefix!r} must be whole numbers like 0 or 0,1", option) from None
    if len(idx) != len(lead) or any(not 0 <= a < n for a, n in zip(idx, lead)):
        raise InputError(f"{spec!r}: batch index {prefix} does not fit the weights' leading axes {lead}", option)
    return idx


def parse_cell(trace: Trace, spec: str, precision: int = 4) -> Cell:
    """``QUERY,KEY`` or ``BATCH:QUERY,KEY`` (labels or indices) as a Cell; InputError if it does not exist."""
    w = trace.weights
    m, n = int(w.shape[-2]), int(w.shape[-1])
    prefix, _, rest = spec.rpartition(":")
    parts = rest.split(",")
    if len(parts) != 2:
        raise InputError(f"{spec!r}: expected QUERY,KEY such as it,milk or 2,1 (batched: 0:2,1)", "--explain")
    i = _index(parts[0], axis_labels(trace, QUERIES, m), "query", m, spec)
    j = _index(parts[1], axis_labels(trace, KEYS, n), "key", n, spec)
    return Cell(trace, _batch(prefix or None, w.shape[:-2], spec), i, j, precision)


def parse_row(trace: Trace, spec: str, precision: int = 4) -> Cell:
    """``QUERY`` or ``BATCH:QUERY`` as a Cell (key 0)."""
    w = trace.weights
    m = int(w.shape[-2])
    prefix, _, rest = spec.rpartition(":")
    i = _index(rest, axis_labels(trace, QUERIES, m), "query", m, spec, "--explain-row")
    return Cell(trace, _batch(prefix or None, w.shape[:-2], spec, "--explain-row"), i, 0, precision)


def heading(c: Cell, what: str | list[Term]) -> Line:
    """'Explain weight(it, milk) (batch 0)': ``what`` as terms (or text), and the batch entry."""
    names = c.trace.meta.batch_axes
    head: list[Term] = [Words("Explain "), *([Words(what)] if isinstance(what, str) else what)]
    if not c.batch:
        return Line(head)
    if isinstance(names, list) and len(names) == len(c.batch):
        where = ", ".join(f"{n} {i}" for n, i in zip(names, c.batch))
    else:
        where = "batch " + ", ".join(map(str, c.batch))
    return Line(head, Words(f" ({where})"))


def explanations(trace: Trace, opts: RenderOptions) -> list[dict[str, Any]]:
    """Every requested explanation as {'what', 'heading', 'lines'} (also what JSON carries)."""
    if not (opts.explain or opts.explain_rows):
        return []
    if "weights" not in trace:
        raise InputError("this run kept no weights to explain", "--explain")
    out = []
    for spec in opts.explain:
        c = parse_cell(trace, spec, opts.precision)
        out.append({"what": "cell", "spec": spec, "batch": list(c.batch), "query": c.i, "key": c.j,
                    "heading": heading(c, _at("weight", c)), "lines": explain_cell(c)})
    for spec in opts.explain_rows:
        c = parse_row(trace, spec, opts.precision)
        out.append({"what": "row", "spec": spec, "batch": list(c.batch), "query": c.i,
                    "heading": heading(c, [Words("row "), Label(c.query)]), "lines": explain_row(c)})
    return out


def attach(trace: Trace, opts: RenderOptions) -> list[dict[str, Any]]:
    """Build the explanations (checking every cell first) and keep them in ``trace.extra`` for JSON."""
    ex = explanations(trace, opts)
    if ex:
        trace.extra["explanations"] = ex
    return ex


def print_explanations(trace: Trace, opts: RenderOptions, console: Console) -> None:
    ex = trace.extra.get("explanations")
    if ex is None:
        ex = explanations(trace, opts)
    for e in ex:
        say(console, e["heading"], style="bold underline")
        for line in e["lines"]:
            say(console, line)
        console.print()


EXPLAINERS.append(print_explanations)
