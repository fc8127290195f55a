"""How numbers are written (attncli.render.numbers): the notation the issue asks for, spelled out."""

from __future__ import annotations

import math

import pytest

from attncli.render.numbers import column_format, num


@pytest.mark.parametrize("x, text", [
    (8.0, "8"), (12.999999999999998, "13"), (-3.0, "-3"),  # whole numbers, up to float rounding
    (0.415, "0.4150"), (0.08259454, "0.0826"),  # p decimals, zeros kept (as the tables line up)
    (-1e6, "-1e6"), (-1e9, "-1e9"), (1.597e-6, "1.597e-6"),  # compact scientific beyond the decimals
    (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), (0.0, "0"), (-0.0, "0"),
])
def test_num(x: float, text: str) -> None:
    assert num(x, 4) == text


def test_columns() -> None:
    fixed = column_format([0.25, 0.0826, 0.0], 4)
    assert [fixed(x) for x in (0.25, 0.0826, 0.0, -0.00004999)] == ["0.2500", "0.0826", "0", "0.0000"]  # never -0.0000
    wide = column_format([0.0891, 1.597e-6], 4)  # fixed where 4 decimals hold the number, e-notation where not
    assert [wide(x) for x in (0.0891, 1.597e-6, 1.23e-6)] == ["0.0891", "1.597e-6", "1.230e-6"]
    tiny = column_format([1.597e-6, 1.23e-6], 4)  # nothing fits 4 decimals: the whole column in e-notation
    assert [tiny(x) for x in (1.597e-6, 0.0)] == ["1.597e-6", "0"]
    noisy = column_format([0.14, 3e-18, -0.25], 4)  # float noise does not make the column e-notation
    assert [noisy(x) for x in (0.14, 3e-18, -0.25)] == ["0.1400", "0.0000", "-0.2500"]
    ints = column_format([8, 10, 16], 4, integers=True)
    assert [ints(x) for x in (8.0, 16.0)] == ["8", "16"]
