"""Comparing numbers someone expects with computed ones: tolerances, cells, divergence.

Cell by cell, ``|e - c| <= atol + rtol·|c|``, NaN equal to NaN. Below the catalogue of
variants (attncli.check.variants), which uses these comparisons, and the verdict (attncli.check.verdict),
which uses both. Nothing here prints.

Tolerance, unless given: inferred from how the expected numbers are written. Numbers
written with D decimals (the most any of them has; ``1.5e-3`` counts as 4) match within
half a unit of the D-th decimal, ``atol = 0.5·10^-D`` (plus a hair for float rounding).
When the computation runs in float32, its rounding is allowed too (``rtol 1.3e-6``).
Numbers that are all whole, and binary files (.npy/.npz/.pt), carry no written precision
and get the defaults of ``torch.testing.assert_close`` for their float type: float32
``rtol 1.3e-6, atol 1e-5``; float64 ``rtol 1e-7, atol 1e-7``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attncli.core.trace import FEATURES, KEYS, QUERIES, Trace

# torch.testing.assert_close defaults, by dtype: (rtol, atol)
FLOAT_DEFAULTS = {"float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7)}
HAIR = 1e-9  # relative slack on a half-unit tolerance, for float rounding of the computed value
SHOWN_CELLS = 5  # mismatching cells listed in a verdict
NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


# ---- tolerance ------------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerance:
    """``|expected - computed| <= atol + rtol·|computed|``, and where the numbers came from."""

    atol: float
    rtol: float
    origin: str
    cells: Any = field(default=None, compare=False)  # per-cell absolute bounds (broadcast), instead of atol

    def bound(self, computed: np.ndarray) -> Any:
        """The largest |expected - computed| allowed in each cell."""
        return (self.atol if self.cells is None else self.cells) + self.rtol * np.abs(computed)

    def to_dict(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "origin": self.origin}


def decimals(text: str) -> int | None:
    """Decimal places a number is written with: '0.625' → 3, '2' → 0, '1.5e-3' → 4; None if not a number."""
    t = text.strip()
    m = NUMBER.match(t)
    if not m:
        return None
    mantissa, exp = m.group(1), m.group(2)
    places = len(mantissa.split(".", 1)[1]) if "." in mantissa else 0
    return max(places - (int(exp[1:]) if exp else 0), 0)


def float_default(dtype: str, origin: str) -> Tolerance:
    rtol, atol = FLOAT_DEFAULTS.get(dtype, FLOAT_DEFAULTS["float64"])
    return Tolerance(atol, rtol, f"{origin}: the {dtype} default of torch.testing.assert_close")


def infer_tolerance(written: list[str] | None, dtype: str = "float64", source: str = "expected") -> Tolerance:
    """The tolerance the expected numbers' written precision implies (see the module docstring)."""
    places = [d for d in (decimals(w) for w in written or []) if d is not None]
    if not places:
        return float_default(dtype, f"{source} is binary (no written precision)")
    top = max(places)
    if top == 0:
        return float_default(dtype, f"{source} holds whole numbers only, taken as exact")
    return decimal_tolerance(top, dtype, f"inferred: {source} is written with {top} decimal{'s' if top > 1 else ''} "
                                         "(half a unit of the last)")


MAX_BINARY_DECIMALS = 6
ROUNDING_MARGIN = 100  # a decimal unit must be this many float spacings wide to be told from rounding


def binary_decimals(a: np.ndarray) -> int | None:
    """The fewest decimals k <= 6 that every value of a float array (.npy, .pt) equals itself rounded to,
    e.g. numbers saved after ``np.round(x, 3)``; None if there is none, or if 10^-k is too close to the
    dtype's own spacing to tell (float32 values near 1 round to 6 decimals by chance)."""
    if a.dtype.kind != "f" or a.dtype.itemsize < 4 or a.size == 0:
        return None
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return None
    spacing = float(np.spacing(np.max(np.abs(finite)).astype(a.dtype)))
    for k in range(1, MAX_BINARY_DECIMALS + 1):
        if 10.0 ** -k < ROUNDING_MARGIN * spacing:
            return None
        back = np.round(finite.astype(np.float64), k).astype(a.dtype)
        if np.array_equal(back, finite):
            return k
    return None


def decimal_tolerance(places: int, dtype: str, origin: str) -> Tolerance:
    """Half a unit of the ``places``-th decimal (and float32 rounding when computed in float32)."""
    atol = 0.5 * 10.0 ** -places
    f32 = dtype == "float32"
    rtol = FLOAT_DEFAULTS["float32"][0] if f32 else HAIR
    return Tolerance(atol * (1 + 1e-6) + HAIR * 1e-3, rtol, origin + ("; float32 rounding as torch.testing" if f32 else ""))


# ---- the raw text of expected numbers, for their written precision --------------------

class _Raw(str):
    """A number as written in JSON (parse_float/parse_int hook)."""


def written_numbers(text: str, ext: str, path: tuple[str, ...] = ("expected",)) -> list[str] | None:
    """The numbers of the expected array exactly as written in ``text`` (by file kind ``ext``).

    YAML and inline text keep each scalar's text through ``yaml.compose``; JSON through
    parse hooks; CSV by splitting cells. In a mapping, the entries along ``path`` (e.g.
    ``expected`` then ``output``), or the only list at that level. None for binary files.
    """
    if ext in (".yaml", ".yml", "inline"):
        return _yaml_numbers(text, path)
    if ext == ".json":
        doc = json.loads(text, parse_float=_Raw, parse_int=_Raw)
        for key in path:
            doc = _pick(doc, key)
        return [str(x) for x in _flatten(doc) if isinstance(x, _Raw)]
    if ext in (".csv", ".txt", ".tsv"):
        out: list[str] = []
        for ln in text.splitlines():
            if ln.strip() and not ln.lstrip().startswith("#"):
                out.extend(c.strip() for c in re.split(r"[,\t ]+", ln.strip()) if c.strip())
        return out
    return None


def _yaml_numbers(text: str, path: tuple[str, ...]) -> list[str]:
    import yaml

    node = yaml.compose(text, Loader=yaml.SafeLoader)
    for key in path:
        if isinstance(node, yaml.MappingNode):
            values = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
            lists = [v for v in values.values() if isinstance(v, yaml.SequenceNode)]
            node = values.get(key) or (lists[0] if len(lists) == 1 else None)
    out: list[str] = []

    def walk(n: Any) -> None:
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                walk(child)
        elif isinstance(n, yaml.ScalarNode):
            out.append(n.value)

    walk(node)
    return out


def _pick(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        lists = [v for v in doc.values() if isinstance(v, list)]
        return lists[0] if len(lists) == 1 else []
    return doc


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, list):
        return [y for item in x for y in _flatten(item)]
    return [x]


# ---- comparing ------------------------------------------------------------------------

@dataclass
class Cell:
    """One compared cell: its index, its label (e.g. '[milk, d2]'), the two values and the error."""

    index: tuple[int, ...]
    label: str
    expected: float
    computed: float
    error: float
    bound: float = math.nan  # the largest error this cell was allowed

    def to_dict(self) -> dict[str, Any]:
        return {"index": list(self.index), "label": self.label, "expected": _num(self.expected),
                "computed": _num(self.computed), "abs_error": _num(self.error), "bound": _num(self.bound)}


@dataclass
class Comparison:
    """Expected against computed: match, largest errors, the first cells that differ."""

    match: bool
    max_abs_error: float
    max_rel_error: float
    worst: Cell | None
    mismatched: int
    cells: int
    first: list[Cell] = field(default_factory=list)
    worst_rel: Cell | None = None  # the cell of the greatest relative difference

    def to_dict(self) -> dict[str, Any]:
        return {"match": self.match, "max_abs_error": _num(self.max_abs_error),
                "max_rel_error": _num(self.max_rel_error), "mismatched_cells": self.mismatched,
                "mismatched_percent": 100.0 * self.mismatched / self.cells if self.cells else 0.0,
                "cells": self.cells, "worst_cell": self.worst.to_dict() if self.worst else None,
                "worst_relative_cell": self.worst_rel.to_dict() if self.worst_rel else None,
                "first_mismatches": [c.to_dict() for c in self.first]}


def _num(x: float) -> float | str | None:
    """A float for JSON: NaN and ±inf become null / "inf" / "-inf"."""
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


def within(expected: np.ndarray, computed: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Cell-wise: close within the tolerance; NaN equals NaN, an infinity equals itself."""
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(expected - computed) <= tol.bound(computed)
    same = (expected == computed) | (np.isnan(expected) & np.isnan(computed))
    return np.asarray(close | same)


def errors(expected: np.ndarray, computed: np.ndarray) -> np.ndarray:
    """|expected - computed| per cell; 0 where both are the same NaN/inf, inf where only one is."""
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(expected - computed)
    same = (expected == computed) | (np.isnan(expected) & np.isnan(computed))
    return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))


def compare(expected: np.ndarray, computed: np.ndarray, tol: Tolerance, namer: CellNamer) -> Comparison:
    """Cell-by-cell comparison of two arrays of one shape."""
    ok = within(expected, computed, tol)
    err = errors(expected, computed)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(computed != 0, err / np.abs(computed), np.where(err == 0, 0.0, np.inf))
    bad = first_false(ok, SHOWN_CELLS)  # not np.argwhere(~ok): (cells, ndim) int64 indices when every cell differs
    bound = np.broadcast_to(tol.bound(computed), computed.shape)
    first = [namer.cell(idx, expected, computed, err, bound) for idx in bad]
    worst = worst_rel = None
    if err.size:
        widx = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
        worst = namer.cell(widx, expected, computed, err)
        ridx = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.nan_to_num(rel, nan=np.inf))), rel.shape))
        worst_rel = namer.cell(ridx, expected, computed, err)
    finite_rel = rel[np.isfinite(rel)]
    max_rel = float(np.max(rel)) if rel.size else 0.0
    if not np.isfinite(max_rel) and finite_rel.size:
        max_rel = math.inf
    return Comparison(bool(ok.all()), float(err.max()) if err.size else 0.0, max_rel, worst,
                      int(ok.size - np.count_nonzero(ok)), int(ok.size), first, worst_rel)


def first_false(ok: np.ndarray, count: int, chunk: int = 1 << 20) -> list[tuple[int, ...]]:
    """The indices of the first ``count`` False cells of ``ok`` in C order, found a chunk of cells at a time."""
    flat = ok.reshape(-1)
    found: list[int] = []
    for i in range(0, flat.size, chunk):
        found.extend(int(j) + i for j in np.flatnonzero(~flat[i:i + chunk])[:count - len(found)])
        if len(found) >= count:
            break
    return [tuple(int(x) for x in np.unravel_index(j, ok.shape)) for j in found]


@dataclass
class CellNamer:
    """Names cells of a step by its axes and the trace's labels: '[milk, d2]', '[b1][it, sweet]'."""

    axes: tuple[str, str]
    query_labels: list[str] | None = None
    key_labels: list[str] | None = None
    batch_axes: list[str] | None = None  # names of the leading axes, e.g. ["batch", "head"] for multi-head

    @classmethod
    def for_step(cls, trace: Trace, what: str) -> CellNamer:
        return cls(trace.step(what).axes, trace.query_labels, trace.key_labels, trace.meta.batch_axes)

    def axis_label(self, axis: str, i: int) -> str:
        labels = {QUERIES: self.query_labels, KEYS: self.key_labels}.get(axis)
        if labels and i < len(labels):
            return labels[i]
        return f"{ {QUERIES: 'q', KEYS: 'k', FEATURES: 'd'}.get(axis, '')}{i}".strip()

    def label(self, idx: tuple[int, ...]) -> str:
        *batch, i, j = idx
        names = self.batch_axes if self.batch_axes and len(self.batch_axes) == len(batch) else None
        if names:
            head = "[" + ", ".join(f"{n} {b}" for n, b in zip(names, batch)) + "]"
        else:
            head = f"[b{','.join(map(str, batch))}]" if batch else ""
        return f"{head}[{self.axis_label(self.axes[0], i)}, {self.axis_label(self.axes[1], j)}]"

    def cell(self, idx: tuple[int, ...], expected: np.ndarray, computed: np.ndarray, err: np.ndarray,
             bound: np.ndarray | None = None) -> Cell:
        return Cell(idx, self.label(idx), float(expected[idx]), float(computed[idx]), float(err[idx]),
                    math.nan if bound is None else float(bound[idx]))


# ---- where the numbers diverge, when nothing explains them ----------------------------

@dataclass
class Divergence:
    """Largest error per row and per column (over batches), worst first; a constant ratio if any."""

    rows: list[tuple[str, float]]
    columns: list[tuple[str, float]]
    ratio: float | None = None  # expected = computed × ratio in every cell, if so
    heads: list[tuple[str, float]] = field(default_factory=list)  # per head, where the step has a head axis

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [{"label": k, "max_abs_error": _num(v)} for k, v in self.rows],
                "columns": [{"label": k, "max_abs_error": _num(v)} for k, v in self.columns],
                "heads": [{"label": k, "max_abs_error": _num(v)} for k, v in self.heads],
                "constant_ratio": self.ratio}


def divergence(expected: np.ndarray, computed: np.ndarray, tol: Tolerance, namer: CellNamer, top: int = 3) -> Divergence:
    err = errors(expected, computed)
    e2 = err.reshape((-1,) + err.shape[-2:])
    by_row = e2.max(axis=(0, 2))
    by_col = e2.max(axis=(0, 1))
    rows = [(namer.axis_label(namer.axes[0], int(i)), float(by_row[i])) for i in np.argsort(-by_row)[:top] if by_row[i] > 0]
    cols = [(namer.axis_label(namer.axes[1], int(j)), float(by_col[j])) for j in np.argsort(-by_col)[:top] if by_col[j] > 0]
    heads = []
    names = namer.batch_axes or []
    if "head" in names and len(names) == err.ndim - 2:
        axis = names.index("head")
        by_head = np.moveaxis(err, axis, 0).reshape(err.shape[axis], -1).max(axis=1)
        heads = [(f"head {h}", float(by_head[h])) for h in np.argsort(-by_head) if by_head[h] > 0]
    ratio = None
    nz = np.abs(computed) > tol.atol * 10
    if nz.any() and np.all(np.isfinite(expected)):
        r = float(np.median(expected[nz] / computed[nz]))
        if abs(r - 1) > 1e-6 and within(expected, computed * r, tol).all():
            ratio = r
    return Divergence(rows, cols, ratio, heads)


# ---- explanations of a mismatch -------------------------------------------------------

@dataclass
class Explanation:
    """A catalogued variant that reproduces the expected numbers."""

    name: str
    formula: str
    explanation: str
    max_abs_error: float
    possible: bool = False  # a possibility rather than a reproduction (dropout)
    option: str | None = None  # the options that make the problem match, when the mistake is an option

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "formula": self.formula, "explanation": self.explanation,
                "max_abs_error": _num(self.max_abs_error), "possibility_only": self.possible, "option": self.option}


