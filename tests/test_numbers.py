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
    wide = column_format([0.0891, 1.597e-6], 4)  # one notation for the whole column
    assert [wide(x) for x in (0.0891, 1.597e-6, 1.23e-6)] == ["8.910e-2", "1.597e-6", "1.230e-6"]
    ints = column_format([8, 10, 16], 4, integers=True)
    assert [ints(x) for x in (8.0, 16.0)] == ["8", "16"]
