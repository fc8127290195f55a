"""Checking numbers someone expects against the computed ones, and naming the mistake.

    verdict = check(problem, expected, what="output", tolerance=...)

compares ``expected`` with the step ``what`` of the correct computation (cell by cell,
``|e - c| <= atol + rtol·|c|``, NaN equal to NaN), and on a mismatch tries every variant of
the catalogue in :mod:`attncli.variants` on the same inputs: each one that reproduces the
expected numbers within the tolerance is an explanation. Nothing here prints.

Tolerance, unless given: inferred from how the expected numbers are written. Numbers
written with D decimals (the most any of them has; ``1.5e-3`` counts as 4) match within
half a unit of the D-th decimal, ``atol = 0.5·10^-D`` (plus a hair for float rounding).
When the computation runs in float32, its rounding is allowed too (``rtol 1.3e-6``).
Numbers that are all whole, and binary files (.npy/.npz/.pt), carry no written precision
and get the defaults of ``torch.testing.assert_close`` for their float type: float32
``rtol 1.3e-6, atol 1e-5``; float64 ``rtol 1e-7, atol 1e-7``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attncli.compare import (
    CellNamer,
    Comparison,
    Divergence,
    Explanation,
    Tolerance,
    compare,
    decimals,
    divergence,
    float_default,
    infer_tolerance,
    written_numbers,
)
from attncli.engine import run
from attncli.errors import InputError
from attncli.problem import Problem
from attncli.trace import Trace
from attncli.variants import diagnose

__all__ = ["CellNamer", "Comparison", "Divergence", "Explanation", "Tolerance", "Verdict", "check", "decimals",
           "divergence", "fit_shape", "infer_tolerance", "written_numbers"]


@dataclass
class Verdict:
    """What ``attncli check`` reports: match or not, errors, explanations, divergence."""

    what: str
    tolerance: Tolerance
    comparison: Comparison
    shape: tuple[int, ...]
    explanations: list[Explanation] = field(default_factory=list)
    nearest: list[Explanation] = field(default_factory=list)  # closest variants when none match
    divergence: Divergence | None = None
    tried: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it was not tried
    formula: str = ""  # how the compared step is computed
    warnings: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return self.comparison.match

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": "match" if self.match else "mismatch",
            "match": self.match,
            "what": self.what,
            "formula": self.formula,
            "shape": list(self.shape),
            "tolerance": self.tolerance.to_dict(),
            **self.comparison.to_dict(),
            "explanations": [e.to_dict() for e in self.explanations],
            "nearest": [e.to_dict() for e in self.nearest],
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "variants_tried": self.tried,
            "variants_skipped": self.skipped,
            "warnings": self.warnings,
            "errors": [],
        }


def fit_shape(expected: np.ndarray, shape: tuple[int, ...], what: str, source: str) -> np.ndarray:
    """``expected`` in the computed ``shape``: equal, or equal once axes of length 1 are dropped."""
    if expected.shape == shape:
        return expected
    if [s for s in expected.shape if s != 1] == [s for s in shape if s != 1]:
        return expected.reshape(shape)
    raise InputError(f"expected numbers have shape {expected.shape}, but the computed {what} has shape {shape}; "
                     "give every cell of it (rows × columns)", source)


def check(problem: Problem, expected: Any, *, what: str = "output", tolerance: Tolerance | None = None,
          trace: Trace | None = None, source: str = "expected", explain: bool = True) -> Verdict:
    """Compare ``expected`` with step ``what`` of ``problem``'s computation; on a mismatch, name the variants
    of the catalogue that reproduce it (every one within the tolerance)."""
    if trace is None:
        trace = run(problem)
    if what not in trace:
        raise InputError(f"this computation has no step {what!r}; it has {', '.join(trace.names())}", "--what")
    computed = trace[what].astype(np.float64)
    exp = np.asarray(expected, dtype=np.float64)
    exp = fit_shape(exp, computed.shape, what, source)
    tol = tolerance or float_default(str(trace.meta.get("dtype", "float64")), source)
    namer = CellNamer.for_step(trace, what)
    comparison = compare(exp, computed, tol, namer)
    verdict = Verdict(what, tol, comparison, computed.shape, formula=trace.step(what).formula,
                      warnings=list(trace.warnings))
    if comparison.match or not explain:
        return verdict
    found = diagnose(problem, exp, what, tol)
    verdict.explanations, verdict.nearest = found.matches, found.nearest
    verdict.tried, verdict.skipped = found.tried, found.skipped
    if not verdict.explanations:
        verdict.divergence = divergence(exp, computed, tol, namer)
    return verdict
