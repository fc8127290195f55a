"""The half-precision bounds of tests/halfbounds.py hold on a CPU whose float32 sums round some cells the other way,
and still tell a reading that rounds elsewhere apart."""

from __future__ import annotations

import numpy as np
import pytest
from halfbounds import assert_rounds_as, ulp, ulps

ml_dtypes = pytest.importorskip("ml_dtypes")


def _other_way(x: np.ndarray, near: np.ndarray, dtype: str, share: float) -> np.ndarray:
    """``near`` (x rounded to nearest) with the cells whose x lies nearest a tie rounded to the other neighbour:
    what a float32 sum taken in another order does to a result about to be rounded (``share`` of the cells)."""
    off = (x - near) / ulp(near, dtype)  # in (-0.5, 0.5]
    tie = np.abs(off) >= np.quantile(np.abs(off), 1 - share)
    return np.where(tie, near + np.sign(off) * ulp(near, dtype), near)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_bounds_hold_where_a_tenth_of_the_cells_round_the_other_way(dtype: str) -> None:
    x = np.random.default_rng(0).normal(size=(64, 48)) * 3  # the exact result
    half = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    module = x.astype(half).astype(np.float64)  # rounded once, to nearest
    ours = _other_way(x, module, dtype, 0.10)
    assert 0.05 < np.mean(ours != module) <= 0.11 and ulps(ours, module, dtype).max() == 1
    assert_rounds_as(ours, module, dtype, exact=x)
    truncated = np.trunc(x / ulp(module, dtype)) * ulp(module, dtype)  # rounded toward zero: within a unit too
    assert_rounds_as(ours, module, dtype, exact=x, others=[("rounded toward zero", truncated)])
    with pytest.raises(AssertionError, match="the module's"):  # its error against the exact result: twice as large
        assert_rounds_as(truncated, module, dtype, exact=x)
    with pytest.raises(AssertionError, match="as near the module as ours"):  # a reading no farther than ours
        assert_rounds_as(ours, module, dtype, others=[("the other way", _other_way(x, module, dtype, 0.12))])
    with pytest.raises(AssertionError, match="ulps from the module's"):  # two units off: not a sum's order
        assert_rounds_as(module + 2 * ulp(module, dtype), module, dtype)
