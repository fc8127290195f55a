"""Checking numbers someone expects against the computed ones, and naming the mistake.

    verdict = check(problem, expected, what="output", tolerance=...)

compares ``expected`` with the step ``what`` of the correct computation (cell by cell,
``|e - c| <= atol + rtol·|c|``, NaN equal to NaN), and on a mismatch tries every variant of
the catalogue in :mod:`attncli.check.variants` on the same inputs: each one that reproduces the
expected numbers within the tolerance is an explanation. Nothing here prints. The
tolerance, unless given, is inferred from how the numbers are written (attncli.check.compare).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attncli.check.compare import (
    CellNamer,
    Comparison,
    Divergence,
    Explanation,
    Tolerance,
    compare,
    decimals,
    divergence,
    errors,
    float_default,
    infer_tolerance,
    written_numbers,
)
from attncli.check.precision import FACTOR, FLOOR, naive_run
from attncli.check.variants import Context, diagnose
from attncli.core.engine import run
from attncli.core.problem import Problem
from attncli.core.trace import Trace
from attncli.errors import InputError

__all__ = ["CellNamer", "Comparison", "Divergence", "Explanation", "Precision", "Tolerance", "Verdict", "check", "decimals",
           "divergence", "fit_shape", "infer_tolerance", "written_numbers"]


@dataclass
class Precision:
    """The user's error against the float64 reference, judged against the error of a plain
    implementation in ``dtype`` (attncli.check.precision), as FlashAttention's authors judge kernels:

    - overall: the largest error at most ``FACTOR`` (2) times the plain implementation's largest error;
    - row by row: each row's RMS error at most ``FACTOR`` times the plain implementation's RMS error in
      that row (or its median row, whichever is larger), so one wrong row cannot hide under the others.
    """

    dtype: str
    source: str  # where the precision came from (--precision-of, the expected file's dtype)
    max_abs_error: float  # the user's, against the float64 reference
    naive_max_abs_error: float  # plain arithmetic in dtype, against the same reference
    rows_over: list[tuple[str, float]] = field(default_factory=list)  # (row, its error / what plain dtype explains)
    distribution: Divergence | None = None

    @property
    def ratio(self) -> float:
        if self.naive_max_abs_error > 0:
            return self.max_abs_error / self.naive_max_abs_error
        return 0.0 if self.max_abs_error == 0 else math.inf

    @property
    def consistent(self) -> bool:
        return self.max_abs_error <= FACTOR * self.naive_max_abs_error + FLOOR[self.dtype] and not self.rows_over

    def sentence(self) -> str:
        you, plain = f"{self.max_abs_error:.2g}", f"{self.naive_max_abs_error:.2g}"
        if self.consistent:
            return (f"your largest error {you} is {self.ratio:.2g}× what plain {self.dtype} arithmetic gives ({plain}): "
                    f"consistent with {self.dtype}")
        if self.max_abs_error > FACTOR * self.naive_max_abs_error + FLOOR[self.dtype]:
            ratio = f"{self.ratio:.2g}×" if math.isfinite(self.ratio) else "infinitely"
            head = (f"your largest error {you} is {ratio} what plain {self.dtype} arithmetic gives ({plain}): "
                    f"more than {self.dtype} explains")
        else:
            head = (f"your largest error {you} is {self.ratio:.2g}× what plain {self.dtype} arithmetic gives ({plain}), "
                    f"but some rows are off by more than {self.dtype} explains")
        if self.rows_over:
            head += "; look at " + ", ".join(f"row {r} ({x:.2g}× its plain {self.dtype} error)" for r, x in self.rows_over[:3])
        return head

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "source": self.source, "consistent": self.consistent,
                "max_abs_error": self.max_abs_error, "naive_max_abs_error": self.naive_max_abs_error,
                "ratio": self.ratio if math.isfinite(self.ratio) else None, "factor": FACTOR,
                "rows_over": [{"label": r, "ratio": x if math.isfinite(x) else None} for r, x in self.rows_over],
                "distribution": self.distribution.to_dict() if self.distribution else None, "sentence": self.sentence()}


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
    precision: Precision | None = None  # with --precision-of (or a half-precision expected file)
    candidates: list[Explanation] = field(default_factory=list)  # every variant (and pair) tried, with its error
    search: str = ""  # how the search for pairs of mistakes was bounded
    distribution: Divergence | None = None  # where the errors are, by row / column / head

    @property
    def match(self) -> bool:
        return self.comparison.match and (self.precision is None or self.precision.consistent)

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
            "precision": self.precision.to_dict() if self.precision else None,
            "candidates": [e.to_dict() for e in self.candidates],
            "search": self.search,
            "distribution": self.distribution.to_dict() if self.distribution else None,
            "warnings": self.warnings,
            "errors": [],
        }


def fits(expected_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return expected_shape == shape or [s for s in expected_shape if s != 1] == [s for s in shape if s != 1]


def fit_shape(expected: np.ndarray, shape: tuple[int, ...], what: str, source: str,
              trace: Trace | None = None) -> np.ndarray:
    """``expected`` in the computed ``shape``: equal, or equal once axes of length 1 are dropped; else an
    InputError naming the steps whose shape it does fit (or every step and its shape)."""
    if fits(expected.shape, shape):
        return expected.reshape(shape)
    message = f"expected numbers have shape {expected.shape}, but the computed {what} has shape {shape}"
    if trace is not None:
        steps = [(st.name, tuple(st.numpy().shape)) for st in trace.steps]
        fitting = [n for n, sh in steps if fits(expected.shape, sh)]
        if fitting:
            message += f"; they fit the step{'s' if len(fitting) > 1 else ''} {', '.join(fitting)}: use --what {fitting[0]}"
        else:
            shown = ", ".join(f"{n} {sh}" for n, sh in steps if n not in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"))
            message += f"; no step has that shape (steps: {shown[:200]})"
    else:
        message += "; give every cell of it (rows × columns)"
    raise InputError(message, source)


def check(problem: Problem, expected: Any, *, what: str = "output", tolerance: Tolerance | None = None,
          trace: Trace | None = None, source: str = "expected", explain: bool = True,
          precision: str | None = None, precision_source: str = "--precision-of", pairs: bool = True) -> Verdict:
    """Compare ``expected`` with step ``what`` of ``problem``'s computation; on a mismatch, name the variants
    of the catalogue (and pairs of them) that reproduce it (every one within the tolerance).

    ``precision`` (bfloat16, float16, float32, float64): the expected numbers come from an implementation
    in that precision; they are compared with the float64 reference and judged against the error of a
    plain implementation in that precision (:class:`Precision`), not against a fixed tolerance."""
    if problem.batched and not problem.batch_first and what == "output" and np.ndim(expected) == 3:  # (T, B, E)
        expected = np.swapaxes(np.asarray(expected), 0, 1)  # compared (and searched) batch first: (B, T, E)
        problem, trace = replace(problem, batch_first=True), None
    if trace is None:
        trace = run(problem)
    if what not in trace:
        raise InputError(f"this computation has no step {what!r}; it has {', '.join(trace.names())}", "--what")
    exp = np.asarray(expected, dtype=np.float64)
    exp = fit_shape(exp, trace[what].shape, what, source, trace)
    judged = None
    if precision is not None:
        reference = Context.of(problem, exp, what, Tolerance(0.0, 0.0, "")).ref
        computed = reference[what].astype(np.float64)
        tol, judged = _precision(exp, computed, naive_run(problem, precision)[what], precision, precision_source,
                                 CellNamer.for_step(trace, what))
    else:
        computed = trace[what].astype(np.float64)
        tol = tolerance or float_default(str(trace.meta.dtype or "float64"), source)
    namer = CellNamer.for_step(trace, what)
    comparison = compare(exp, computed, tol, namer)
    verdict = Verdict(what, tol, comparison, computed.shape, formula=trace.step(what).formula,
                      warnings=list(trace.warnings), precision=judged)
    if judged is not None:
        verdict.distribution = judged.distribution
    if verdict.match or not explain:
        return verdict
    if verdict.distribution is None:
        verdict.distribution = divergence(exp, computed, tol, namer)
    diag_tol = tol if judged is None else Tolerance(tol.atol, 0.0, tol.origin)  # variants: the overall bound
    found = diagnose(problem, exp, what, diag_tol, pairs=pairs)
    verdict.explanations, verdict.nearest = found.matches, found.nearest
    verdict.tried, verdict.skipped = found.tried, found.skipped
    verdict.candidates, verdict.search = found.candidates, found.search
    if not verdict.explanations:
        verdict.divergence = verdict.distribution
    return verdict


def _precision(exp: np.ndarray, ref: np.ndarray, naive: np.ndarray, dtype: str, source: str,
               namer: CellNamer) -> tuple[Tolerance, Precision]:
    """The tolerance and the judgement of ``exp`` against ``ref`` given the plain implementation's ``naive``."""
    err, plain = errors(exp, ref), errors(naive, ref)
    plain_max = float(plain.max()) if plain.size else 0.0
    overall = FACTOR * plain_max + FLOOR[dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        rms = np.sqrt(np.mean(np.square(err), axis=-1))  # (..., m)
        plain_rms = np.sqrt(np.mean(np.square(plain), axis=-1))
    base = np.maximum(plain_rms, np.median(plain_rms)) + FLOOR[dtype]  # (..., m)
    over = rms > FACTOR * base
    rows_over: list[tuple[str, float]] = []
    if over.any():
        ratio = np.where(over, rms / base, 0.0)
        for idx in np.argsort(-ratio, axis=None)[:5]:
            cell = np.unravel_index(int(idx), ratio.shape)
            if not over[cell]:
                break
            label = namer.label(tuple(int(i) for i in cell) + (0,)).rsplit(",", 1)[0] + "]"
            rows_over.append((label, float(ratio[cell])))
    cells = np.where(over[..., None], FACTOR * base[..., None], overall)  # a wrong row: its own, tighter bound
    tol = Tolerance(overall, 0.0, f"{source}: {FACTOR:g}× the largest error of plain {dtype} arithmetic "
                                  f"({plain_max:.2g}) against the float64 reference, as FlashAttention's tests "
                                  f"(and {FACTOR:g}× its error row by row, RMS)", cells=cells)
    judged = Precision(dtype, source, float(err.max()) if err.size else 0.0, plain_max, rows_over,
                       divergence(exp, ref, tol, namer))
    return tol, judged
