"""Checks of arrays and arguments that every way in (a file, stdin, the ``attend()`` API) goes
through, called from attncli.core.arrays, attncli.core.problem and the CLI: an array numpy would misread
(33 dimensions, float128 beyond float64, an integer mask of 2s, +inf in a float mask) or an
argument of the wrong kind is refused here, naming it, instead of failing deep inside numpy.
Light: no numpy at import time. (Option values: attncli.core.options.check_option.)"""

from __future__ import annotations

from typing import Any

from attncli.errors import InputError, printable

MAX_DIMS = 32  # axes of any array: numpy 1.x's limit, and far beyond (batch..., rows, width)
MAX_WIDTH = 1 << 24  # a hidden width or head width: 16 Mi, beyond any model's


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
