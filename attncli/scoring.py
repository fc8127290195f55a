"""Scoring functions and scaling rules, as registries filled by small decorators.

A scoring function maps queries ``q (..., m, d_q)`` and keys ``k (..., n, d_k)`` to scores
``(..., m, n)``. The first line of its docstring states the formula; the CLI's ``--score``
choices are the registry's keys, so a new score needs no CLI edit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attncli.errors import InputError
from attncli.trace import Trace


@dataclass
class ScoreInput:
    """What a scoring function gets: the namespace, q, k, learned parameters, the trace."""

    xp: Any
    q: Any  # (..., m, d_q)
    k: Any  # (..., n, d_k)
    params: dict[str, Any] = field(default_factory=dict)
    trace: Trace | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def add_step(self, name: str, formula: str, values: Any, axes: tuple[str, str]) -> None:
        """Record an intermediate quantity particular to this score (shown step by step)."""
        if self.trace is not None:
            self.trace.add(name, formula, values, axes)


@dataclass(frozen=True)
class Score:
    name: str
    fn: Callable[[ScoreInput], Any]
    aliases: tuple[str, ...] = ()
    same_width: bool = True  # q and k must have the same width
    scaling: str = "none"  # default scaling rule (see SCALINGS)
    symbol: str = "Q Kᵀ"  # how the raw score matrix is written in step titles

    @property
    def formula(self) -> str:
        return (self.fn.__doc__ or self.name).strip().splitlines()[0]


SCORES: dict[str, Score] = {}
ALIASES: dict[str, str] = {}


def register(name: str, *, aliases: tuple[str, ...] = (), same_width: bool = True,
             scaling: str = "none", symbol: str = "Q Kᵀ") -> Callable[[Callable[[ScoreInput], Any]], Callable[[ScoreInput], Any]]:
    """Register a scoring function under ``name`` (and ``aliases``)."""

    def deco(fn: Callable[[ScoreInput], Any]) -> Callable[[ScoreInput], Any]:
        SCORES[name] = Score(name, fn, aliases, same_width, scaling, symbol)
        for a in aliases:
            ALIASES[a] = name
        return fn

    return deco


# --- activations of the additive and location scores ----------------------------------

ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "tanh": lambda xp, x: xp.tanh(x),
    "relu": lambda xp, x: xp.where(x > 0, x, xp.zeros_like(x)),
    "identity": lambda xp, x: x,
}
DEFAULT_ACTIVATION = "tanh"


def get_score(name: str) -> Score:
    key = ALIASES.get(name, name)
    if key not in SCORES:
        choices = ", ".join(sorted([*SCORES, *ALIASES]))
        raise InputError(f"unknown score {name!r}; choose one of {choices}", "--score")
    return SCORES[key]


def score_names() -> list[str]:
    return [*SCORES, *ALIASES]


@register("dot", symbol="Q Kᵀ")
def dot(s: ScoreInput) -> Any:
    """Dot product: s_ij = q_i · k_j. (..., m, d) x (..., n, d) -> (..., m, n)"""
    return s.q @ s.xp.matrix_transpose(s.k)  # (..., m, d) x (..., d, n) -> (..., m, n)


@register("scaled-dot", aliases=("sdpa", "scaled_dot"), scaling="sqrt-d", symbol="Q Kᵀ")
def scaled_dot(s: ScoreInput) -> Any:
    """Scaled dot product: s_ij = q_i · k_j / sqrt(d). (..., m, d) x (..., n, d) -> (..., m, n)"""
    return s.q @ s.xp.matrix_transpose(s.k)  # (..., m, d) x (..., d, n) -> (..., m, n); scaled by the engine


# --- scaling rules: each returns the factor the raw scores are multiplied by -------------


@dataclass(frozen=True)
class Scaling:
    name: str
    factor: Callable[[Any, Any, int, int], Any]  # (xp, scores, d, n) -> factor (number or array)
    describe: Callable[[int, int], str]  # (d, n) -> text used in the step formula


SCALINGS: dict[str, Scaling] = {}


def scaling(name: str, describe: Callable[[int, int], str]) -> Callable[[Callable[[Any, Any, int, int], Any]], Callable[[Any, Any, int, int], Any]]:
    def deco(fn: Callable[[Any, Any, int, int], Any]) -> Callable[[Any, Any, int, int], Any]:
        SCALINGS[name] = Scaling(name, fn, describe)
        return fn

    return deco


@scaling("none", lambda d, n: "S")
def _no_scaling(xp: Any, s: Any, d: int, n: int) -> float:
    """No scaling: S."""
    return 1.0


@scaling("sqrt-d", lambda d, n: f"S / √d = S / √{d}")
def _sqrt_d(xp: Any, s: Any, d: int, n: int) -> float:
    """Divide by the square root of the query width: S / sqrt(d)."""
    return 1.0 / math.sqrt(d)


@scaling("seq", lambda d, n: f"S / (√d·√n) = S / (√{d}·√{n})")
def _seq(xp: Any, s: Any, d: int, n: int) -> float:
    """Divide by sqrt(d)·sqrt(n), for long sequences."""
    return 1.0 / (math.sqrt(d) * math.sqrt(n))


@scaling("norm", lambda d, n: "S / ‖S‖_F")
def _norm(xp: Any, s: Any, d: int, n: int) -> Any:
    """Divide each score matrix by its Frobenius norm ‖QKᵀ‖_F."""
    finite = xp.where(xp.isfinite(s), s, xp.zeros_like(s))
    f = xp.sqrt(xp.sum(finite * finite, axis=(-2, -1), keepdims=True))  # (..., 1, 1)
    return 1.0 / xp.where(f > 0, f, xp.ones_like(f))
