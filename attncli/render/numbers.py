"""How numbers are written, in one place for the terminal tables, ``--explain``, the page and
the LaTeX/Markdown documents, so a number reads the same everywhere it appears.

- a whole number is written as one: ``8``, ``-3`` (not ``8.0000``);
- otherwise ``p`` decimals, trailing zeros kept so a column lines up: ``0.4150``, ``0.0826``;
- a number too large (|x| >= 1e6) or too small for ``p`` decimals in scientific notation with a
  compact exponent: ``-1e6``, ``1.597e-6``;
- a value that rounds to zero is ``0.0000``, never ``-0.0000``; ±inf and nan are spelled out.

A table chooses the notation per column (``column_format``): fixed decimals when every value of the
column can be written so (float noise like 3e-18 beside 0.14 included), scientific only for the values
too small or too large for them; a table of whole numbers is written in whole numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

LARGE = 1e6  # |x| from here on is written in scientific notation
MASKED = "·"  # a masked cell of a weights table (weight exactly 0 because its key is masked)


def _sci(x: float, p: int, keep_zeros: bool = False) -> str:
    """1.597e-6, -1e6: ``p - 1`` decimals of mantissa (trailing zeros dropped unless ``keep_zeros``,
    as a column keeps them to line up), the exponent without '+' or leading zeros."""
    m, _, e = f"{x:.{max(p - 1, 0)}e}".partition("e")
    if "." in m and not keep_zeros:
        m = m.rstrip("0").rstrip(".")
    return f"{m}e{int(e)}"


def _fixed(x: float, p: int) -> str:
    s = f"{x:.{p}f}"
    return s[1:] if s.startswith("-") and not s.strip("-0.") else s


def special(x: float) -> str | None:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return None


def whole(x: float) -> bool:
    """A whole number below LARGE, up to float rounding (12.999999999999998 is 13)."""
    return math.isfinite(x) and abs(x) < LARGE and abs(x - round(x)) <= 1e-9 * max(1.0, abs(x))


def num(x: float, p: int = 4) -> str:
    """One number as the tables and the explanations write it: 8, 0.0826, 0.4150, -1e6, 1.597e-6, -inf."""
    x = float(x)
    s = special(x)
    if s is not None:
        return s
    if whole(x):
        return str(int(round(x)))
    if abs(x) >= LARGE or abs(x) < 10.0 ** -p / 2:
        return _sci(x, p)
    return _fixed(x, p)


def fits_fixed(x: float, p: int) -> bool:
    """Whether ``x`` can be written with ``p`` decimals without losing it (0 and non-finite values can)."""
    return not math.isfinite(x) or x == 0 or 10.0 ** -p / 2 <= abs(x) < LARGE


NOISE = 1e-12  # a value this small next to its column's largest is float rounding (3e-18 beside 0.14)


def column_format(values: Iterable[float], p: int, integers: bool = False) -> Callable[[float], str]:
    """The notation of one column: whole numbers (``integers``: the whole table is), fixed ``p``
    decimals when every value fits them (float noise such as 3e-18 beside 0.14 is written 0.0000, not a
    reason for e-notation), scientific for every value when none fits, else fixed decimals for the values
    that fit and scientific only for those that do not (0.0891 above 1.597e-6, not a column of 8.911e-2)."""
    vals = [float(v) for v in values]
    if integers:
        return lambda x: special(x) or (str(int(round(x))) if whole(x) else _sci(x, p))
    top = max((abs(v) for v in vals if math.isfinite(v)), default=0.0)

    def fits(x: float) -> bool:
        return fits_fixed(x, p) or abs(x) <= NOISE * top

    if all(fits(v) for v in vals):
        return lambda x: special(x) or ("0" if x == 0 else _fixed(x, p))
    if not any(fits(v) and v != 0 and math.isfinite(v) for v in vals):
        return lambda x: special(x) or ("0" if x == 0 else _sci(x, p, keep_zeros=True))
    return lambda x: special(x) or ("0" if x == 0 else _fixed(x, p) if fits(x) else _sci(x, p, keep_zeros=True))


def all_whole(values: Iterable[float]) -> bool:
    """Whether every finite value is a whole number below LARGE (and there is at least one)."""
    finite = [float(v) for v in values if math.isfinite(float(v))]
    return bool(finite) and all(whole(v) for v in finite)
