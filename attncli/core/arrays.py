"""Arrays as the user gave them, checked: real numbers, finite, rectangular; masks as booleans or floats.

The one place that turns nested lists, numpy arrays and torch tensors into validated numpy
arrays, with a one-line InputError naming the array and the problem. Below every module that
reads inputs (Problem, weights, projections), so none of them needs another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core import validate as check
from attncli.core.backend import host_array
from attncli.errors import InputError


def mask_array(a: Any, title: str, source: str) -> np.ndarray:
    """A mask as given: boolean (0/1 integers count as boolean) or float (added to the scores)."""
    given = np.asarray(a)
    if given.dtype == bool:
        return given
    mk = numeric_array(given, title, source, allow_inf=True)
    if not np.issubdtype(given.dtype, np.floating):
        check.integer_mask(given, title, source)  # 2 or -1 is no keep/drop: refused, not added
        return mk.astype(bool)  # 0/1 integers are a boolean mask
    check.float_mask(mk, title, source)
    return mk


def numeric_array(a: Any, title: str, source: str, allow_inf: bool = False) -> np.ndarray:
    """``a`` as a real float64/float32 array, or an InputError naming the array and the problem."""
    try:
        arr = np.asarray(host_array(a))
    except ValueError as e:  # ragged nested lists
        raise InputError(f"{title} is ragged: rows of different lengths ({e})", source) from None
    check.dims(arr.ndim, title, source)
    if arr.dtype == object:
        raise InputError(f"{title} is ragged or holds non-numbers (null, text, numbers too large for a float); "
                         "expected a rectangular array of numbers", source)
    if arr.dtype.kind in "US":
        raise InputError(f"{title} holds text where numbers belong", source)
    if arr.dtype.kind == "c":
        raise InputError(f"{title} holds complex numbers; attention needs real numbers", source)
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{title} has dtype {arr.dtype}; expected numbers", source)
    if arr.dtype.kind == "b" and title not in ("mask",):
        raise InputError(f"{title} holds booleans where numbers belong", source)
    if arr.dtype.kind != "b" and title != "mask" and isinstance(a, (list, tuple)) and _holds_bool(a):
        raise InputError(f"{title} holds true/false among its numbers; expected numbers only", source)
    if arr.size == 0:
        raise InputError(f"{title} is empty (shape {arr.shape})", source)
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)  # float16 stays: the engine computes it in float32 and casts back
    arr = check.within_float64(arr, title, source)
    bad = np.isnan(arr) if allow_inf else ~np.isfinite(arr)
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        what = "NaN" if np.isnan(arr[idx]) else "an infinite value"
        raise InputError(f"{title} holds {what} at index {list(idx)}; inputs must be finite numbers", source)
    return arr


def _holds_bool(a: list[Any] | tuple[Any, ...]) -> bool:
    """Whether nested lists (from YAML/JSON) hold a bool among numbers (numpy would read it as 0/1)."""
    stack: list[Any] = [a]
    while stack:
        x = stack.pop()
        if isinstance(x, bool):
            return True
        if isinstance(x, (list, tuple)):
            stack.extend(x)
    return False


LABEL_CHARS = 200  # a label is shown (and looked up) as at most this many printable characters


def cut_labels(labels: Any) -> Any:
    """An array of strings cut to the characters :func:`printable` keeps (at C speed: 10^5 long labels), else as it
    was."""
    dtype = getattr(labels, "dtype", None)
    if dtype is not None and dtype.kind == "U" and dtype.itemsize > 4 * (LABEL_CHARS + 1):
        return labels.astype(f"<U{LABEL_CHARS + 1}")
    return labels


def printable(label: str, limit: int = LABEL_CHARS) -> str:
    """A label safe to print: control characters (an escape sequence in a label downloaded from
    anywhere could clear or retitle the terminal) written as escapes, and at most ``limit`` long."""
    head = label[: limit + 1]  # escaping only lengthens: the first limit + 1 characters decide what is shown
    out = head if head.isprintable() else "".join(  # the common case at C speed (10^5 labels)
        c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in head)
    return out if len(out) <= limit else out[: limit - 1] + "…"
