"""The terms of an explanation line: typed data (words, numbers, labels, step names, functions, a step's
formula, vectors) that each renderer formats in its own way, so that no renderer reads math back out of text.

A :class:`Line` is a ``str`` (its text is what ``--explain`` prints, what the HTML page shows and what JSON
carries) that also keeps its terms; render/latex.py writes the same terms as LaTeX math. A plain ``str``
among the terms is symbols and punctuation only (``" = "``, ``"×"``, ``"("``, ``"σ²"``, spaces).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attncli.core import formula
from attncli.render.numbers import num

MAX_FEATURES = 6  # vector entries written out before eliding the middle


@dataclass(frozen=True)
class Words:
    """Prose: 'scaled:', 'is masked for query'."""

    text: str


@dataclass(frozen=True)
class Num:
    """A number written at ``precision`` (attncli.render.numbers.num); ``factor``: a negative in parentheses."""

    value: float
    precision: int = 4
    factor: bool = False

    def text(self) -> str:
        t = num(self.value, self.precision)
        return f"({t})" if self.factor and t.startswith("-") else t


@dataclass(frozen=True)
class Label:
    """A query's or key's label: data from a file, written as text whatever its characters."""

    text: str


@dataclass(frozen=True)
class Name:
    """A step's or an input's name: q_rot, scores, v."""

    text: str


@dataclass(frozen=True)
class Fn:
    """A function's name before its parenthesis: exp, tanh, sim, weight."""

    text: str


@dataclass(frozen=True)
class Sub:
    """A symbol with a subscript: Σ_j, weight_j, q_t."""

    base: str
    sub: str


@dataclass(frozen=True)
class Formula:
    """The formula of step ``step`` of the trace: its display text in the terminal, its typed rendering elsewhere."""

    step: str
    text: str


@dataclass(frozen=True)
class ScoreFormula:
    """The formula of the run's score ``name`` (dot, additive, ...): its display text, or its typed rendering."""

    name: str
    text: str


@dataclass(frozen=True)
class Math:
    """A piece of a step's formula (attncli.core.formula terms), e.g. ALiBi's term at one head and key:
    its text in the terminal, its typed rendering elsewhere."""

    terms: tuple[formula.Term, ...]


@dataclass(frozen=True)
class Root:
    """√4: the square root of a whole number."""

    arg: str


@dataclass(frozen=True)
class Vector:
    """(1.25, 2.75), the middle elided for long vectors."""

    values: tuple[float, ...]
    precision: int = 4

    def items(self) -> list[str]:
        items = [num(x, self.precision) for x in self.values]
        return [*items[:3], "…", *items[-2:]] if len(items) > MAX_FEATURES else items


@dataclass(frozen=True)
class Gap:
    """Space between the columns of a line (three spaces in the terminal)."""

    width: int = 3


Term = str | Words | Num | Label | Name | Fn | Sub | Formula | ScoreFormula | Math | Root | Vector | Gap


def term_text(t: Term) -> str:
    """A term as the terminal writes it."""
    if isinstance(t, str):
        return t
    if isinstance(t, (Words, Label, Name, Fn)):
        return t.text
    if isinstance(t, Num):
        return t.text()
    if isinstance(t, Sub):
        return f"{t.base}_{t.sub}"
    if isinstance(t, (Formula, ScoreFormula)):
        return t.text
    if isinstance(t, Math):
        return formula.text(t.terms)
    if isinstance(t, Root):
        return f"√{t.arg}"
    if isinstance(t, Vector):
        return "(" + ", ".join(t.items()) + ")"
    return " " * t.width


class Line(str):
    """One line of an explanation: its text, and its terms (``.terms``) for the renderers that write math."""

    terms: tuple[Term, ...]

    def __new__(cls, *terms: Term | Sequence[Term]) -> Line:
        flat: list[Term] = []
        for t in terms:
            if isinstance(t, (list, tuple)):
                flat.extend(t)
            else:
                flat.append(t)  # type: ignore[arg-type]
        obj = super().__new__(cls, "".join(term_text(t) for t in flat))
        obj.terms = tuple(flat)
        return obj


def vector(v: Any, p: int = 4) -> Vector:
    """A 1-D array (or sequence) of numbers as a Vector term."""
    return Vector(tuple(float(x) for x in v), p)


def joined(items: Sequence[Sequence[Term]], joiner: Term = " + ") -> list[Term]:
    """The term lists ``items`` with ``joiner`` between them."""
    out: list[Term] = []
    for k, it in enumerate(items):
        if k:
            out.append(joiner)
        out.extend(it)
    return out
