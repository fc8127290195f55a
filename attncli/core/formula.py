"""A step's formula as data: typed terms that each output writes in its own way.

Every step's typed parameters (attncli.core.params, attncli.core.chain) say what the step computed; their
``formula()`` writes it once, as a :class:`Formula` of terms, and nothing else writes it: the plain text (JSON, NPZ,
the terminal, ``check``) is :func:`text` here, LaTeX and HTML are attncli.render's writers of the same terms. No
module reads a formula back out of its text.

    Sym     symbols and punctuation as written: " = ", " · ", "(", "²", "[-2, 2]"
    Name    a step's or an input's symbol: q_rot, scores, X, W_q (LaTeX: q_{rot}; HTML: q<sub>rot</sub>)
    Sub     a symbol with a subscript: slope_h, w_q[h] (base w, sub q, then "[h]" as Sym)
    Sup     a power: 10000^(-2k/8)
    Root    a square root: √d, √4
    Hat     a symbol with a hat: Q̂
    Fn      a function's name before its parenthesis: tanh, softmax, sqrt, clamp
    Num     a number, written with ``%g`` (or the format given)
    Words   prose: "the sliding window keeps the", "keys up to each query"
    Data    text from a file (a tensor's name): shown as it is, escaped for every output
    Head    one head's symbol: head_h, or head_2 in a view of head 2

A :class:`Formula` is its equation (``eq``) and a remark after it (``remark``: ": scores squashed into (-c, c)",
" (RoPE, half)"): the text is the two side by side; LaTeX sets the equation as math and the remark as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, TypeAlias


class Sym(NamedTuple):
    text: str


class Name(NamedTuple):
    text: str


class Sub(NamedTuple):
    base: str
    sub: str


class Sup(NamedTuple):
    base: str
    exp: str


class Root(NamedTuple):
    """A square root: √4, √d."""

    arg: str


class Hat(NamedTuple):
    """A symbol with a hat: Q̂ (unit rows)."""

    base: str


class Fn(NamedTuple):
    text: str


class Num(NamedTuple):
    value: float
    fmt: str = "g"

    def text(self) -> str:
        return format(self.value, self.fmt)


class Words(NamedTuple):
    text: str


class Data(NamedTuple):
    text: str


class Head(NamedTuple):
    """One head's symbol (head_h): its index in a view of one head."""


Term = Sym | Name | Sub | Sup | Root | Hat | Fn | Num | Words | Data | Head
# what :func:`terms` takes: terms, plain strs (symbols), None (left out) and sequences of these, nested
Piece: TypeAlias = "Term | str | None | Sequence[Piece]"


def terms(*parts: Piece) -> tuple[Term, ...]:
    """The terms ``parts`` flattened: a plain str is a :class:`Sym`, None and empty pieces are left out."""
    out: list[Term] = []
    for p in parts:
        if p is None or p == "":
            continue
        if isinstance(p, str):
            out.append(Sym(p))
        elif isinstance(p, (Sym, Name, Sub, Sup, Root, Hat, Fn, Num, Words, Data, Head)):
            out.append(p)
        else:
            out.extend(terms(*p))
    return tuple(out)


class Formula(NamedTuple):
    """A step's formula: ``eq`` the equation, ``remark`` what follows it (prose, with its leading separator)."""

    eq: tuple[Term, ...]
    remark: tuple[Term, ...] = ()

    @property
    def terms(self) -> tuple[Term, ...]:
        return self.eq + self.remark


def formula(eq: Piece, remark: Piece = None) -> Formula:
    """A :class:`Formula` from pieces (plain strs are symbols)."""
    return Formula(terms(eq), terms(remark))


def term_text(t: Term, head: int | None = None) -> str:
    """One term as plain text (``head``: the head a view of one head shows, for :class:`Head`)."""
    if isinstance(t, (Sym, Name, Fn, Words, Data)):
        return t.text
    if isinstance(t, Sub):
        return f"{t.base}_{t.sub}"
    if isinstance(t, Sup):
        return f"{t.base}^({t.exp})"
    if isinstance(t, Num):
        return t.text()
    if isinstance(t, Root):
        return f"√{t.arg}"
    if isinstance(t, Hat):
        return t.base + "\u0302"
    return "head_h" if head is None else f"head_{head}"


def text(f: Formula | Iterable[Term], head: int | None = None) -> str:
    """The formula (or terms) as plain text: what JSON's and NPZ's ``formula``, the terminal and ``check`` show."""
    return "".join(term_text(t, head) for t in (f.terms if isinstance(f, Formula) else f))


def plus(b: str | None) -> tuple[Term, ...]:
    """" + b" for a bias that is there, nothing without one."""
    return () if b is None else (Sym(" + "), Name(b))
