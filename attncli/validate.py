"""Checks of option values and arrays that every way in (a flag, a problem file's ``options:``,
the ``attend()`` API) goes through, called from attncli.problem: a value that would overflow,
divide by zero or ask for more memory than exists is refused here, naming the option, instead
of failing deep inside numpy. Light: no numpy at import time."""

from __future__ import annotations

import math
from typing import Any

from attncli.errors import InputError, printable

DTYPES = ("float32", "float64")  # what attention computes in (half inputs are computed in float32)
MAX_DIMS = 32  # axes of any array: numpy 1.x's limit, and far beyond (batch..., rows, width)
MAX_WIDTH = 1 << 24  # a hidden width or head width: 16 Mi, beyond any model's


def flag(name: str, source: str | None) -> str:
    """Where an option came from: the file (and its key) or the command-line flag."""
    if source and source not in ("command line", "options"):
        return f"{source}: options.{name}" if not source.endswith("()") else f"{source} argument {name}"
    return "--" + name.replace("_", "-")


def number(name: str, value: Any, source: str | None) -> float:
    """A float option: a finite-or-infinite float, never an OverflowError (10**400) or text."""
    where = flag(name, source)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"must be a number, got {printable(repr(value), 60)}", where)
    try:
        return float(value)
    except OverflowError:
        raise InputError(f"is too large for a float ({len(str(value))} digits)", where) from None
    except ValueError:
        raise InputError(f"must be a number, got {printable(repr(value), 60)}", where) from None


def options(o: Any, source: str | None = None) -> None:
    """The option values of ``o`` (an attncli.problem.Options) that are wrong whatever the inputs."""
    from attncli.scoring import ACTIVATIONS, SCALINGS, score_names

    for name, allowed in (("score", score_names()), ("scaling", SCALINGS), ("activation", ACTIVATIONS),
                          ("mask_convention", ("keep", "drop")), ("causal_align", ("top-left", "bottom-right"))):
        value = getattr(o, name)
        if value is not None and value not in allowed:
            shown = ", ".join(list(allowed)[:12])
            raise InputError(f"unknown {name.replace('_', ' ')} {printable(repr(value), 40)}; choose one of {shown}",
                             flag(name, source))
    ranges = (("temperature", lambda v: math.isfinite(v) and v > 0, "a positive number"),
              ("scale", math.isfinite, "a finite number"),
              ("bandwidth", lambda v: math.isfinite(v) and v > 0, "a positive number"),
              ("mask_value", lambda v: v == v and v != math.inf, "a number or -inf"),
              ("dropout", lambda v: 0.0 <= v <= 1.0, "a probability between 0 and 1"),
              ("seed", lambda v: v >= 0, "0 or more"))
    for name, ok, want in ranges:
        value = getattr(o, name)
        if value is not None and not ok(value):
            raise InputError(f"{name.replace('_', ' ')} must be {want}, got {printable(str(value), 30)}",
                             flag(name, source))
    if o.dtype is not None and o.dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)} (float16/bfloat16 inputs are computed in "
                         f"float32), got {printable(repr(o.dtype), 40)}", flag("dtype", source))
    if o.temperature is not None and math.isfinite(o.temperature) and o.temperature > 0 \
            and not math.isfinite(1.0 / o.temperature):
        raise InputError(f"temperature {o.temperature:g} is so small that dividing the scores by it overflows",
                         flag("temperature", source))
    if o.bandwidth is not None and math.isfinite(o.bandwidth) and o.bandwidth > 0:
        two_var = 2.0 * o.bandwidth * o.bandwidth
        if two_var == 0.0 or not math.isfinite(1.0 / two_var):
            raise InputError(f"bandwidth {o.bandwidth:g} is so small that 1/(2·bandwidth²) overflows",
                             flag("bandwidth", source))
    if o.hidden is not None:
        width(o.hidden, flag("hidden", source))
    if o.mask_value is not None and o.mask_value >= 0:
        raise InputError(f"mask value {o.mask_value:g} is not below the scores it replaces; masked keys would win. "
                         "Give a negative number (d2l: -1e6) or leave the default -inf", flag("mask_value", source))


def width(n: Any, where: str) -> int:
    """A width (hidden units, head width) that a weight matrix can have."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_WIDTH:
        raise InputError(f"must be a whole number from 1 to {MAX_WIDTH:,}, got {printable(str(n), 30)}", where)
    return n


def dims(ndim: int, title: str, source: str) -> None:
    if ndim > MAX_DIMS:
        raise InputError(f"{title} has {ndim} dimensions; at most {MAX_DIMS} are read", source)


def labels(value: Any, where: str) -> list[str] | None:
    """Labels from the API or a file: a list of names (a comma-separated string is split)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [t.strip() for t in value.split(",")]
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return [str(x) for x in (value.tolist() if hasattr(value, "tolist") else value)]
    raise InputError(f"must be a list of names, got {type(value).__name__}", where)


def mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"must be a mapping of names to arrays, got {type(value).__name__}", where)
    return value


def integer_mask(values: Any, title: str, source: str) -> None:
    """An integer mask is boolean: 0 and 1 only (a 2 or a -1 is no keep/drop; a float mask is added)."""
    bad = values[(values != 0) & (values != 1)]
    if bad.size:
        raise InputError(f"{title} is an integer mask holding {int(bad.flat[0])}; an integer mask is 0/1 (keep or drop). "
                         "To add numbers to the scores, write them as floats (2.0)", source)


def float_mask(values: Any, title: str, source: str) -> None:
    """A float mask is added to the scores: -inf drops a key, +inf would make every weight NaN."""
    import numpy as np

    if np.any(values == np.inf):
        idx = [int(i) for i in np.argwhere(values == np.inf)[0]]
        raise InputError(f"{title} holds +inf at index {idx}; a float mask is added to the scores, so use -inf "
                         "(or a large negative number) to drop a key", source)


def within_float64(arr: Any, title: str, source: str) -> Any:
    """A float wider than float64 (float128 from an .npy) as float64, refused where a value does
    not fit (1e4000 would become inf, silently, in the engine's cast)."""
    import numpy as np

    if arr.dtype.kind != "f" or arr.dtype.itemsize <= 8:
        return arr
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = arr.astype(np.float64)
    over = np.isfinite(arr) & ~np.isfinite(narrow)
    if np.any(over):
        idx = tuple(int(i) for i in np.argwhere(over)[0])
        raise InputError(f"{title} holds {printable(str(arr[idx]), 30)} at index {list(idx)}, beyond float64's range "
                         "(±1.8e308); attention computes in float64 at most", source)
    return narrow
