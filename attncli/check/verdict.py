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

from attncli.check import mistakes_port  # noqa: F401  (registers its entries in the catalogue)
from attncli.check.compare import (
    CellNamer,
    Comparison,
    Divergence,
    Explanation,
    Tolerance,
    binary_decimals,
    compare,
    decimal_tolerance,
    decimals,
    divergence,
    errors,
    float_default,
    infer_tolerance,
    written_numbers,
)
from attncli.check.precision import FACTOR, FLOOR, HEAD_FACTOR, HEAD_RCOND, ROW_FACTOR, SCALED_HEAD_MIN, SCALED_HEAD_Z, naive_step
from attncli.check.variants import NEAREST_FACTOR, Context, diagnose
from attncli.core import chain
from attncli.core.engine import run
from attncli.core.layer import Layer, Subject
from attncli.core.plan import Plan
from attncli.core.trace import StepName, Trace
from attncli.errors import InputError

__all__ = ["CellNamer", "Comparison", "Divergence", "Explanation", "Precision", "Steps", "Tolerance", "Verdict",
           "absent_step", "check",
           "decimals", "default_judgement", "divergence", "fit_shape", "infer_tolerance", "written_numbers"]

OWN_PRECISIONS = ("float32", "float16", "bfloat16")  # judged by their own precision; float64 stays strict


def default_judgement(expected: np.ndarray, written: list[str] | None, half: str | None, computed_dtype: str,
                      source: str, given: dict[str, float] | None = None,
                      precision: str | None = None) -> tuple[Tolerance, str | None, str]:
    """How expected numbers are judged when the user says nothing else: (the tolerance, the precision whose
    plain arithmetic they are judged against or None, where that precision came from).

    - ``--atol/--rtol`` given: that tolerance, no precision;
    - ``--precision-of`` given (``precision``): that precision;
    - numbers written as text (YAML, JSON, CSV, inline) or binary floats rounded to k decimals: half a unit of
      their last decimal;
    - binary float32, float16, bfloat16 (``half``): the error of the same computation done plainly in that
      dtype (:class:`Precision`: overall and row by row), whatever the size of the values;
    - binary float64 (and whole numbers): torch.testing's strict float default."""
    if given:
        atol, rtol = given.get("atol", 0.0), given.get("rtol", 0.0)
        return Tolerance(atol, rtol, f"given: --atol {atol:g} --rtol {rtol:g}"), None, ""
    dtype = "float32" if "float32" in (str(expected.dtype), computed_dtype) else "float64"
    places = binary_decimals(expected) if written is None else None
    if places is not None:
        tol = decimal_tolerance(places, dtype, f"inferred: every number of {source} is a float rounded to {places} "
                                               f"decimal{'s' if places > 1 else ''} (half a unit of the last)")
    else:
        tol = infer_tolerance(written, dtype, source)
    if precision is not None:
        return tol, precision, "--precision-of"
    own = half or (str(expected.dtype) if written is None and places is None else None)
    if own in OWN_PRECISIONS:
        return tol, own, f"{source} holds {own} numbers"
    return tol, None, ""


@dataclass
class Precision:
    """The user's error against the float64 reference, judged against the error of a plain
    implementation in ``dtype`` (attncli.check.precision), as FlashAttention's authors judge kernels:

    - overall: the largest error at most ``FACTOR`` (2) times the plain implementation's largest error;
    - row by row: each row's RMS error at most ``ROW_FACTOR`` (4) times the plain implementation's RMS error in
      that row (or its median row, whichever is larger), so one wrong row cannot hide under the others;
    - head by head (a layer with W_o): each head's RMS error traced back through W_o (without the directions W_o
      shrinks below ``HEAD_RCOND``, 5% of its largest gain) at most ``HEAD_FACTOR`` (3) times the plain
      implementation's in that head (``heads_over``), and no head's output off by a factor 1 + α
      beyond rounding: |α| at most ``SCALED_HEAD_Z`` (5) times the scale plain rounding gives that head, nor more
      than ``SCALED_HEAD_MIN`` (0.5%) (:attr:`heads_scaled`; :func:`_scaled_heads`).
    """

    dtype: str
    source: str  # where the precision came from (--precision-of, the expected file's dtype)
    max_abs_error: float  # the user's, against the float64 reference
    naive_max_abs_error: float  # plain arithmetic in dtype, against the same reference
    rows_over: list[tuple[str, float]] = field(default_factory=list)  # (row, its error / what plain dtype explains)
    distribution: Divergence | None = None
    heads_over: list[tuple[str, float]] = field(default_factory=list)  # (head, its error / what plain dtype explains)
    # every head's output fitted as off by a factor 1 + α: (head, α in %, |α| / the scale rounding gives that head)
    head_fits: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def heads_scaled(self) -> list[tuple[str, float, float]]:
        """The heads whose output is off by a factor beyond rounding (and not already named by their RMS error),
        most evident first: |α| > ``SCALED_HEAD_Z`` times the scale rounding gives the head, and > ``SCALED_HEAD_MIN``."""
        named = {h for h, _ in self.heads_over}
        return sorted([f for f in self.head_fits if f[0] not in named and f[2] > SCALED_HEAD_Z
                       and abs(f[1]) > 100 * SCALED_HEAD_MIN], key=lambda f: -f[2])

    @property
    def ratio(self) -> float:
        if self.naive_max_abs_error > 0:
            return self.max_abs_error / self.naive_max_abs_error
        return 0.0 if self.max_abs_error == 0 else math.inf

    @property
    def consistent(self) -> bool:
        return self.max_abs_error <= FACTOR * self.naive_max_abs_error + FLOOR[self.dtype] and not self.rows_over \
            and not self.heads_over and not self.heads_scaled

    @property
    def rule(self) -> str:
        """Which rule decided: 'overall' (the largest error against 2× plain), 'per-row' (a row's RMS error
        against 4× plain in that row, the overall bound holding), 'per-head' (a head's RMS error, traced back
        through W_o, against 3× plain in that head, or its output off by a factor beyond rounding), or 'both' when
        the numbers are consistent."""
        if self.max_abs_error > FACTOR * self.naive_max_abs_error + FLOOR[self.dtype]:
            return "overall"
        return "per-row" if self.rows_over else "per-head" if self.heads_over or self.heads_scaled else "both"

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
            some = "rows" if self.rows_over else "heads"
            head = (f"your largest error {you} is {self.ratio:.2g}× what plain {self.dtype} arithmetic gives ({plain}), "
                    f"but some {some} are off by more than {self.dtype} explains")
        if self.rows_over:
            head += "; look at " + ", ".join(f"row {r} ({x:.2g}× its plain {self.dtype} error)" for r, x in self.rows_over[:3])
        if self.heads_over:
            head += "; look at " + ", ".join(f"{h} ({x:.2g}× its plain {self.dtype} error, RMS through W_o)"
                                             for h, x in self.heads_over[:3])
        if self.heads_scaled:
            head += "; " + ", ".join(f"{h}'s output is off by a factor {1 + a / 100:.4g} ({z:.3g}× the scale plain "
                                     f"{self.dtype} rounding gives that head)" for h, a, z in self.heads_scaled[:3])
        return head

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "source": self.source, "consistent": self.consistent, "rule": self.rule,
                "max_abs_error": self.max_abs_error, "naive_max_abs_error": self.naive_max_abs_error,
                "ratio": self.ratio if math.isfinite(self.ratio) else None, "factor": FACTOR, "row_factor": ROW_FACTOR,
                "rows_over": [{"label": r, "ratio": x if math.isfinite(x) else None} for r, x in self.rows_over],
                "head_factor": HEAD_FACTOR,
                "scaled_head_z": SCALED_HEAD_Z, "scaled_head_min": SCALED_HEAD_MIN,
                # every head named, by either head rule: its RMS error ("rms": ratio = that / plain's in the head), or
                # its output off by a factor ("scale": ratio = |α| / the scale rounding gives, scale = 1 + α)
                "heads_over": [{"label": r, "rule": "rms", "ratio": x if math.isfinite(x) else None}
                               for r, x in self.heads_over]
                + [{"label": r, "rule": "scale", "ratio": z, "scale": 1 + a / 100} for r, a, z in self.heads_scaled],
                "head_fits": [{"label": r, "scale": 1 + a / 100, "ratio": z} for r, a, z in self.head_fits],
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
    baseline: float = 0.0  # the largest error of the correct computation (no change), which a near miss must beat
    searched: bool = False  # the catalogue was searched (not with --no-search, nor on a match)

    @property
    def match(self) -> bool:
        return self.comparison.match and (self.precision is None or self.precision.consistent)

    @property
    def rule(self) -> str:
        """The rule that decided: 'tolerance' (a fixed |e - c| <= atol + rtol·|c|), or the precision's
        'overall' / 'per-row' (both held: 'precision')."""
        if self.precision is None:
            return "tolerance"
        r = self.precision.rule
        return "precision" if r == "both" else r

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": "match" if self.match else "mismatch",
            "match": self.match,
            "rule": self.rule,
            "what": self.what,
            "formula": self.formula,
            "shape": list(self.shape),
            "tolerance": self.tolerance.to_dict(),
            **self.comparison.to_dict(),
            "explanations": [e.to_dict() for e in self.explanations],
            "nearest": [e.to_dict() for e in self.nearest],
            "nearest_factor": NEAREST_FACTOR,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "variants_tried": self.tried,
            "variants_skipped": self.skipped,
            "precision": self.precision.to_dict() if self.precision else None,
            "candidates": [e.to_dict() for e in self.candidates],
            "search": self.search,
            "searched": self.searched,
            "distribution": self.distribution.to_dict() if self.distribution else None,
            "warnings": self.warnings,
            "errors": [],
        }


@dataclass
class Steps:
    """Several expected steps of one problem file (scores, weights, output, ...), each with its own verdict."""

    verdicts: list[Verdict]

    @property
    def match(self) -> bool:
        return all(v.match for v in self.verdicts)

    @property
    def mismatched(self) -> list[str]:
        return [v.what for v in self.verdicts if not v.match]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": "match" if self.match else "mismatch", "match": self.match,
                "steps": {v.what: v.to_dict() for v in self.verdicts}, "mismatched_steps": self.mismatched,
                "errors": []}


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


# the steps a stage of the chain records beside its own name (QK-norm and RoPE: q's and k's; the bias: 'alibi' when
# ALiBi is its only term)
_STAGE_STEPS = {StepName.Q_NORM: (StepName.K_NORM,), StepName.Q_ROT: (StepName.K_ROT,), StepName.BIAS: (StepName.ALIBI,)}


def absent_step(problem: Subject, what: str) -> str | None:
    """Why the computation of ``problem`` has no step ``what``, told before computing it, from the stages of the chain
    the problem needs (:func:`attncli.core.chain.needed`: QK-norm, RoPE, tuning, scale, cap, bias, mask, sinks, hard
    attention, dropout); None where it may have it (a step outside the chain: the run decides)."""
    core = problem.problem() if isinstance(problem, Layer) else problem
    needed = chain.needed(core)
    for st in chain.STAGES:
        own = (st.name, *_STAGE_STEPS.get(st.name, ()))
        if what not in own:
            continue
        if st in needed and (st.name != StepName.BIAS or what == st.step(core)):
            return None
        has = [str(n) for t in needed if t.name not in (StepName.HARD, StepName.DROPOUT)
               for n in (t.step(core), *_STAGE_STEPS.get(t.name, ())[:1 if t.name != StepName.BIAS else 0])]
        after = [t.name.value for t in needed if t.name in (StepName.HARD, StepName.DROPOUT)]  # the softmax's own step
        has += ["softmax", *after] if after else []
        return (f"this computation has no step {what!r} (its chain: {', '.join([*has, 'weights', 'output'])}; "
                "the options give it the others)")
    return None


def check(problem: Subject, expected: Any, *, what: str = "output", tolerance: Tolerance | None = None,
          trace: Trace | None = None, source: str = "expected", explain: bool = True,
          precision: str | None = None, precision_source: str = "--precision-of", pairs: bool = True) -> Verdict:
    """Compare ``expected`` with step ``what`` of ``problem``'s computation; on a mismatch, name the variants
    of the catalogue (and pairs of them) that reproduce it (every one within the tolerance).

    ``precision`` (bfloat16, float16, float32, float64): the expected numbers come from an implementation
    in that precision; they are compared with the float64 reference and judged against the error of a
    plain implementation in that precision (:class:`Precision`), not against a fixed tolerance."""
    if isinstance(problem, Layer) and problem.batched and not problem.batch_first and what == "output" and \
            np.ndim(expected) == 3:  # (T, B, E)
        expected = np.swapaxes(np.asarray(expected), 0, 1)  # compared (and searched) batch first: (B, T, E)
        problem, trace = replace(problem, batch_first=True), None
    if trace is None:
        trace = run(problem)
    if what not in trace:
        raise InputError(f"this computation has no step {what!r}; it has {', '.join(trace.names())}", "--what")
    exp = np.asarray(expected, dtype=np.float64)
    if not fits(exp.shape, trace[what].shape) and "weights" not in trace:
        trace = run(problem, Plan("explicit"))  # an output-only run: every step, to name those the numbers fit
    exp = fit_shape(exp, trace[what].shape, what, source, trace)
    judged = None
    if precision is not None:
        ctx = Context.of(problem, exp, what, Tolerance(0.0, 0.0, ""))
        reference = run(replace(ctx.problem, options=replace(ctx.problem.options, keep_weights=False))) \
            if what == "output" else ctx.ref  # the output alone: the output-only path (no (m, n) matrix held)
        computed = np.asarray(reference[what], dtype=np.float64)
        tol, judged = _precision(exp, computed, naive_step(problem, precision, what), precision, precision_source,
                                 CellNamer.for_step(trace, what), reference if what == "output" else None)
    else:
        computed = np.asarray(trace[what], dtype=np.float64)
        tol = tolerance or float_default(str(trace.meta.dtype or "float64"), source)
    namer = CellNamer.for_step(trace, what)
    comparison = compare(exp, computed, tol, namer)
    verdict = Verdict(what, tol, comparison, computed.shape, formula=trace.step(what).formula,
                      warnings=list(trace.warnings), precision=judged)
    if judged is not None:
        verdict.distribution = judged.distribution
    if verdict.match or not explain:
        if verdict.distribution is not None and not verdict.match:
            verdict.distribution.heads = verdict.distribution.heads or heads_through_output(trace, exp, computed)
        return verdict
    if verdict.distribution is None:
        verdict.distribution = divergence(exp, computed, tol, namer)
    verdict.distribution.heads = verdict.distribution.heads or heads_through_output(trace, exp, computed)
    diag_tol = tol if judged is None else Tolerance(tol.atol, 0.0, tol.origin)  # variants: the overall bound
    found = diagnose(problem, exp, what, diag_tol, pairs=pairs)
    verdict.searched = True
    verdict.explanations, verdict.nearest = found.matches, found.nearest
    verdict.tried, verdict.skipped = found.tried, found.skipped
    verdict.candidates, verdict.search = found.candidates, found.search
    verdict.baseline = found.baseline
    if not verdict.explanations:
        verdict.divergence = verdict.distribution
    return verdict


def through_heads(trace: Trace, diff: np.ndarray) -> np.ndarray | None:
    """A difference of a multi-head layer's output traced back to its heads, (..., T, H, d_v/H): the output is
    concat · W_o (+ b_o), so when W_o has full row rank the difference of the concatenated heads is diff · W_o⁺,
    and head h owns its d_v/H columns of it. None for a layer without W_o (or one that loses information).

    W_o⁺ leaves out the directions W_o shrinks below ``HEAD_RCOND`` (5%) of its largest gain. There 1/s multiplies
    the output's own rounding: a tiny random model's W_o had a gain under 10⁻³ of its largest, so its float32
    rounding, traced back exactly, was 4× the plain implementation's in three heads at once (a false alarm of the
    per-head rule; seed 3 of tests/test_check_families.py), and in bfloat16/float16 the head with the largest error
    listed (:func:`heads_through_output`) was the head planted 2% off in 58 of 78 of the sweep's layers (76 of 78
    without those directions). The price: a wrong head's error shows partly in the others (15% of it in float32 on
    tests/test_check_port.py's layer, where the exact W_o⁺ shows under 1%)."""
    if "W_o" not in trace or "concat" not in trace or diff.ndim < 2:
        return None
    w_o = np.asarray(trace["W_o"], dtype=np.float64)  # (d_v, E)
    H = int(trace["head_output"].shape[-3]) if "head_output" in trace else 0
    if w_o.ndim != 2 or H < 2 or w_o.shape[0] % H or diff.shape[-1] != w_o.shape[1] or w_o.shape[0] > w_o.shape[1]:
        return None
    u, s, vt = np.linalg.svd(w_o, full_matrices=False)  # one SVD for the rank and the pseudo-inverse
    if s.size == 0 or s[-1] <= s[0] * max(w_o.shape) * np.finfo(np.float64).eps:  # numpy's matrix_rank threshold
        return None
    pinv = (vt.T / np.where(s >= HEAD_RCOND * s[0], s, np.inf)) @ u.T  # (E, d_v); 1/s = 0 where W_o shrinks most
    delta = np.nan_to_num(diff, posinf=0.0, neginf=0.0) @ pinv  # (..., T, E) x (E, d_v) -> (..., T, d_v)
    return delta.reshape(delta.shape[:-1] + (H, w_o.shape[0] // H))


def heads_through_output(trace: Trace, exp: np.ndarray, computed: np.ndarray) -> list[tuple[str, float]]:
    """The largest error of each head (:func:`through_heads`), worst first; [] where heads cannot be told."""
    per = through_heads(trace, exp - computed) if exp.shape == computed.shape else None
    if per is None:
        return []
    by_head = np.abs(np.moveaxis(per, -2, 0)).reshape(per.shape[-2], -1).max(axis=1)
    return [(f"head {h}", float(by_head[h])) for h in np.argsort(-by_head) if by_head[h] > 0]


@dataclass(frozen=True)
class HeadScales:
    """Each head's output fitted as off by a factor 1 + α_h, in the layer's OUTPUT space: the error e of the
    output (every cell, (..., T, E)) regressed on the heads' contributions c_h = o_h · W_o[h] (head h's output
    through its rows of W_o), e ≈ Σ_h α_h c_h, ordinary least squares over every cell. ``alpha``: α_h; ``se``:
    its standard error from the fit's residual r, clustered by row (query): rounding errors are not independent
    cell by cell but shared along a row (a row's softmax weights and their sum are rounded together, its q and k
    once for every cell), so the textbook σ̂²·(CᵀC)⁻¹ is too small (by about 2× on the sweep's layers) and the
    cluster-robust (sandwich) estimate is used: (CᵀC)⁻¹ (Σ_rows C_rowᵀ r_row r_rowᵀ C_row) (CᵀC)⁻¹ · G/(G − 1)."""

    alpha: np.ndarray  # (H,)
    se: np.ndarray  # (H,)


def head_scales(reference: Trace, diff: np.ndarray) -> HeadScales | None:
    """:class:`HeadScales` of the output difference ``diff``; None for a layer without W_o or with one head.

    The fit is in output space, where rounding happens last (the output projection's own rounding): tracing the
    error back to the heads first (diff · W_o⁺) multiplies that rounding by W_o's condition number (76 to 3946 in
    the checkpoint sweep's tiny random models), which buried a 2% head under bfloat16 noise. The normal equations
    are formed without holding the (cells, H) matrix of contributions: with O = concat (N, H·d) and W = W_o,
    (CᵀC)_hk = Σ_ij (OᵀO)[h i, k j]·(W Wᵀ)[h i, k j], (Cᵀe)_h = Σ_ie (Oᵀe)[h i, e]·W[h i, e], and row n's
    (C_nᵀ r_n)_h = Σ_i O[n, h i]·(r Wᵀ)[n, h i]."""
    if "W_o" not in reference or "concat" not in reference or "head_output" not in reference or diff.ndim < 2:
        return None
    w = np.asarray(reference["W_o"], dtype=np.float64)  # (d_v, E)
    H = int(reference["head_output"].shape[-3])
    o = np.asarray(reference["gated" if "gated" in reference else "concat"], dtype=np.float64)  # W_o's input (AFMoE,
    # Laguna: the gated heads; a head's output scaled by 1 + α scales its gated features alike)
    if w.ndim != 2 or H < 2 or w.shape[0] % H or diff.shape[-1] != w.shape[1] or o.shape[-1] != w.shape[0] or \
            o.size // o.shape[-1] != diff.size // diff.shape[-1]:
        return None
    d = w.shape[0] // H
    o = o.reshape(-1, w.shape[0])  # (N, d_v)
    e = np.nan_to_num(diff, nan=0.0, posinf=0.0, neginf=0.0).reshape(-1, w.shape[1])  # (N, E)
    gram = ((o.T @ o) * (w @ w.T)).reshape(H, d, H, d).sum(axis=(1, 3))  # (d_v, N)(N, d_v) ∘ (d_v, E)(E, d_v) -> (H, H)
    b = ((o.T @ e) * w).reshape(H, d, -1).sum(axis=(1, 2))  # (d_v, N)(N, E) ∘ (d_v, E) -> (H,)
    inv = np.linalg.pinv(gram)
    alpha = inv @ b  # (H,)
    r = e - (o * np.repeat(alpha, d)) @ w  # the residual: (N, d_v) x (d_v, E) -> (N, E)
    by_row = ((r @ w.T).reshape(-1, H, d) * o.reshape(-1, H, d)).sum(axis=-1)  # (N, E)(E, d_v) -> (N, H): C_nᵀ r_n
    rows = by_row.shape[0]
    cov = inv @ (by_row.T @ by_row) @ inv * rows / max(rows - 1, 1)  # (H, H)
    return HeadScales(alpha, np.sqrt(np.maximum(np.diag(cov), 0.0)))


def _scaled_heads(reference: Trace, diff: np.ndarray, plain: np.ndarray) -> list[tuple[str, float, float]]:
    """Each head's output fitted as off by a factor 1 + α (:func:`head_scales`), judged against what rounding gives.

    The plain implementation in the same dtype (unperturbed by the user's mistake) is fitted the same way: its
    α's are what rounding alone makes of each head's scale. The rounding scale of head h is
    σ_h = the largest of the user's and the plain fit's standard errors for h (clustered by row), the plain α_h, and
    the RMS of the plain α's over all heads (the plain fit is one realization of rounding: its α's say how far
    rounding moves a head's scale, which the standard errors of one fit alone underestimate).
    Head h is named (:attr:`Precision.heads_scaled`) when |α_h| > max(``SCALED_HEAD_MIN``, ``SCALED_HEAD_Z`` · σ_h).
    Every head, in order: (head, α_h in %, |α_h| / σ_h)."""
    you, noise = head_scales(reference, diff), head_scales(reference, plain)
    if you is None or noise is None:
        return []
    spread = float(np.sqrt(np.mean(np.square(noise.alpha))))  # plain α's RMS over heads
    sigma = np.maximum.reduce([you.se, noise.se, np.abs(noise.alpha), np.full_like(you.se, spread)]) + 1e-12
    return [(f"head {h}", 100 * float(you.alpha[h]), float(abs(you.alpha[h]) / sigma[h])) for h in range(len(sigma))]


def _rms_by_head(trace: Trace, diffs: np.ndarray) -> np.ndarray | None:
    """Each head's RMS error (:func:`through_heads`) of several differences stacked on the first axis: (k, H)."""
    per = through_heads(trace, diffs)  # (k, ..., T, H, d)
    if per is None:
        return None
    return np.sqrt(np.mean(np.square(np.moveaxis(per, -2, 1)).reshape(per.shape[0], per.shape[-2], -1), axis=-1))


def _precision(exp: np.ndarray, ref: np.ndarray, naive: np.ndarray, dtype: str, source: str,
               namer: CellNamer, reference: Trace | None = None) -> tuple[Tolerance, Precision]:
    """The tolerance and the judgement of ``exp`` against ``ref`` given the plain implementation's ``naive``;
    with the ``reference`` trace of a multi-head layer, each head's error too (traced back through W_o)."""
    err, plain = errors(exp, ref), errors(naive, ref)
    plain_max = float(plain.max()) if plain.size else 0.0
    overall = FACTOR * plain_max + FLOOR[dtype]
    with np.errstate(invalid="ignore", over="ignore"):
        rms = np.sqrt(np.mean(np.square(err), axis=-1))  # (..., m)
        plain_rms = np.sqrt(np.mean(np.square(plain), axis=-1))
    base = np.maximum(plain_rms, np.median(plain_rms)) + FLOOR[dtype]  # (..., m)
    over = rms > ROW_FACTOR * base
    rows_over: list[tuple[str, float]] = []
    if over.any():
        ratio = np.where(over, rms / base, 0.0)
        for idx in np.argsort(-ratio, axis=None)[:5]:
            cell = np.unravel_index(int(idx), ratio.shape)
            if not over[cell]:
                break
            label = namer.label(tuple(int(i) for i in cell) + (0,)).rsplit(",", 1)[0] + "]"
            rows_over.append((label, float(ratio[cell])))
    cells = np.where(over[..., None], ROW_FACTOR * base[..., None], overall)  # a wrong row: its own, tighter bound
    tol = Tolerance(overall, 0.0, f"{source}: {FACTOR:g}× the largest error of plain {dtype} arithmetic "
                                  f"({plain_max:.2g}) against the float64 reference, as FlashAttention's tests "
                                  f"(and {ROW_FACTOR:g}× its error row by row, RMS)", cells=cells)
    heads_over: list[tuple[str, float]] = []
    head_fits: list[tuple[str, float, float]] = []
    both = _rms_by_head(reference, np.stack([exp - ref, naive - ref])) if reference is not None else None  # (2, H)
    you, plain_h = (None, None) if both is None else (both[0], both[1])
    if you is not None and plain_h is not None and reference is not None:
        base_h = np.maximum(plain_h, np.median(plain_h)) + FLOOR[dtype]  # (H,)
        ratio_h = you / base_h
        heads_over = [(f"head {h}", float(ratio_h[h])) for h in np.argsort(-ratio_h) if ratio_h[h] > HEAD_FACTOR]
    if reference is not None:  # in output space: W_o need not be invertible
        head_fits = _scaled_heads(reference, exp - ref, naive - ref)
    judged = Precision(dtype, source, float(err.max()) if err.size else 0.0, plain_max, rows_over,
                       divergence(exp, ref, tol, namer), heads_over, head_fits)
    return tol, judged
