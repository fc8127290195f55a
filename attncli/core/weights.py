"""Learned parameters of the scoring functions: loading, converting, checking, initialising.

Weights are kept in the textbook convention ``q @ W_q`` (``W_q`` of shape ``(d_q, h)``),
as each score declares them in the registry (:class:`attncli.core.scoring.Param`). PyTorch
names (``W_q.weight`` of an ``nn.Linear``, shape ``(h, d_q)``) are recognised and
converted. Missing weights are initialised as ``nn.Linear`` initialises its own (uniform
on ±1/sqrt(fan_in)) from ``numpy.random.default_rng(seed)``, so numpy and torch get
identical numbers; the draws follow the order of the score's parameter list.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from attncli.core.arrays import numeric_array
from attncli.core.scoring import SCORE_OPTIONS, SCORES, Score
from attncli.errors import InputError

if TYPE_CHECKING:
    from attncli.core.options import Options

DEFAULT_SEED = 0


def linear_init(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform on ±1/sqrt(fan_in), float64: what ``nn.Linear`` gives its weight and bias.

    (``kaiming_uniform_(a=sqrt(5))`` has bound ``sqrt(6 / ((1 + 5) fan_in)) = 1/sqrt(fan_in)``.)
    """
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape)


def seeded_rng(seed: int | None) -> np.random.Generator:
    """The generator every seeded draw uses: ``numpy.random.default_rng(seed)`` (seed 0 if None)."""
    return np.random.default_rng(DEFAULT_SEED if seed is None else seed)


# How PyTorch tensors become a parameter: nn.Linear stores its weight as (out, in).
CONVERSIONS: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "as_is": lambda a: a[0],
    "transpose": lambda a: a[0].T,  # (out, in) -> (in, out)
    "flatten": lambda a: a[0].reshape(-1),  # a one-output Linear: (1, in) -> (in,), bias (1,) -> (1,)
    "sum": lambda a: sum(a[1:], a[0]),  # biases of two Linear layers that are added
}
# The shape PyTorch stores, from the parameter's shape (for error messages).
TORCH_SHAPES: dict[str, Callable[[tuple[str, ...]], tuple[str, ...]]] = {
    "as_is": lambda s: s,
    "transpose": lambda s: s[::-1],
    "flatten": lambda s: ("1", *s),
    "sum": lambda s: s,
}


def _fmt(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def spec_text(score: Score) -> str:
    """``W_q (d_q, h), W_k (d_k, h), w_v (h,), optional b (h,)``: what a score takes."""
    return ", ".join(("optional " if p.optional else "") + f"{p.name} {p.shape_text()}" for p in score.params)


def weights_mapping(content: Any, source: str) -> dict[str, Any]:
    """The named arrays of a weights file: a mapping (or a problem file's ``weights:`` entry)."""
    if isinstance(content, Mapping) and isinstance(content.get("weights"), Mapping):
        content = content["weights"]
    if not isinstance(content, Mapping):
        raise InputError("holds a single array; a weights file maps names to arrays (e.g. W_q, W_k, w_v)", source)
    return {str(k): v for k, v in content.items()}


def prepare(score: Score, given: Mapping[str, Any], d_q: int, d_k: int, options: Options,
            source: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """The parameters ``score`` uses, checked against the widths, with missing ones initialised.

    ``given`` may use the textbook names or PyTorch names (converted). Returns the
    parameters by name and the names that were initialised (from ``options.seed`` with
    hidden width ``options.hidden``, default ``d_q``). Raises a one-line InputError naming
    a missing, unknown or wrongly shaped weight, its shape and the shape expected.
    """
    _check_options(score, given, options)
    if not score.params:
        if given:
            raise InputError(f"--score {score.name} takes no weights, but {', '.join(given)} were given", source)
        return {}, []
    dims: dict[str, int] = {"d_q": d_q, "d_k": d_k}
    origin = {"d_q": f"the width of Q is {d_q}", "d_k": f"the width of K is {d_k}"}
    if options.hidden is not None:
        dims["h"], origin["h"] = options.hidden, f"--hidden is {options.hidden}"
    out = _canonical(score, dict(given), dims, origin, source)
    missing = [p for p in score.params if not p.optional and p.name not in out]
    if missing and out:
        raise InputError(f"weight {missing[0].name} is missing: --score {score.name} takes {spec_text(score)}"
                         + (" (or nn.Linear names: " + ", ".join(t for p in score.params for t in p.torch) + ")"
                            if any(p.torch for p in score.params) else ""), source)
    if missing:
        dims.setdefault("h", d_q)
        rng = seeded_rng(options.seed)
        for p in missing:
            out[p.name] = linear_init(rng, dims[p.fan_in], tuple(dims[s] for s in p.shape))
    return {p.name: out[p.name] for p in score.params if p.name in out}, [p.name for p in missing]


def _check_options(score: Score, given: Mapping[str, Any], options: Options) -> None:
    """Score-specific options (--activation, --bandwidth, --hidden) only with the scores that read them."""
    for name in SCORE_OPTIONS:
        if getattr(options, name) is not None and name not in score.options:
            users = [s.name for s in SCORES.values() if name in s.options]
            raise InputError(f"applies to --score {' / '.join(users)}, not {score.name}", f"--{name}")
    if options.bandwidth is not None and "w" in given:
        raise InputError("give either --bandwidth or a learned weight w, not both (σ = 1/w)", "--bandwidth")


def _canonical(score: Score, given: dict[str, Any], dims: dict[str, int], origin: dict[str, str],
               source: str) -> dict[str, np.ndarray]:
    """Each given weight under its parameter name, shape-checked (binding h on first sight)."""
    by_torch = {t: p for p in score.params for t in p.torch}
    names = {p.name for p in score.params}
    for key in given:
        if key not in names and key not in by_torch:
            torch_names = ", ".join(by_torch)
            raise InputError(f"weight {key!r} is not one that --score {score.name} uses; it takes {spec_text(score)}"
                             + (f" (or nn.Linear names {torch_names})" if torch_names else ""), source)
    out: dict[str, np.ndarray] = {}
    for p in score.params:
        tor = [t for t in p.torch if t in given]
        if p.name in given and tor:
            raise InputError(f"weight {p.name} is given twice: as {p.name} and as {tor[0]}", source)
        if p.name in given:
            a = _numeric(given[p.name], p.name, source)
            if (p.scalar_ok or not p.shape) and a.size == 1:
                out[p.name] = a.reshape(())
                continue
            out[p.name] = _bind(p.name, a, p.shape, dims, origin, source)
        elif tor:
            layout = TORCH_SHAPES[p.convert](p.shape)
            arrays = [_bind(t, _numeric(given[t], t, source), layout, dims, origin, source, " (nn.Linear layout)")
                      for t in tor]
            a = CONVERSIONS[p.convert](arrays)
            out[p.name] = a.reshape(()) if not p.shape else a
    return out


def _numeric(a: Any, name: str, source: str) -> np.ndarray:
    return numeric_array(a, f"weight {name}", source)


def _bind(label: str, a: np.ndarray, symbols: tuple[str, ...], dims: dict[str, int], origin: dict[str, str],
          source: str, layout: str = "") -> np.ndarray:
    """``a`` if its shape fits ``symbols`` (``d_q``, ``h``, a literal ``1``) under ``dims``, else InputError.

    A symbol seen for the first time (h) takes its size from ``a``.
    """
    expected = _fmt(tuple(dims.get(s, s) for s in symbols))
    why = ""
    ok = a.ndim == len(symbols)
    for sym, size in zip(symbols, a.shape) if ok else ():
        if sym.isdigit():
            ok = int(sym) == size
        elif sym not in dims:
            dims[sym], origin[sym] = int(size), f"{label} sets {sym} = {size}"
        elif dims[sym] != size:
            ok, why = False, f"; {origin[sym]}"
        if not ok:
            break
    if not ok:
        raise InputError(f"weight {label} has shape {_fmt(a.shape)}; expected {_fmt(symbols)} = {expected}{layout}{why}",
                         source)
    return a
