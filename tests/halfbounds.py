"""Half-precision results against torch's own CPU kernels, asserted by bounds that hold on every CPU.

torch's float16/bfloat16 kernels on the CPU (linear layers, float32 reductions inside RMSNorm and the softmax)
sum in an order their instruction set decides (AVX2, AVX-512, AMX ...): on one CPU the plain emulation
(attncli.check.precision) equals the module in every cell, on another 96% of them. What holds everywhere:

- the error bound: every cell within a few units in the last place (ulps) of the module's, in the half type, at
  the module's magnitude (one float32 sum taken in another order rounds a cell at most one unit the other way);
- the ratio to plain arithmetic: against float64 on the same inputs, the emulation's error is the module's
  (their ratio within 10%), where the readings that round elsewhere are not;
- each other reading (a step rounded where the module does not round) is measurably farther from the module's
  cells than the emulation: its mean distance at least twice the emulation's plus a tenth of a unit (measured:
  the other readings of tests/test_check_today.py are 0.22-0.73 units away on average, the emulation 0 here, and
  at most 0.04 where 4% of the cells round the other way).

tests/test_halfbounds.py checks that these bounds hold where a tenth of the cells round the other way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

BITS = {"float16": 10, "bfloat16": 7, "float32": 23}  # stored mantissa bits
TINY = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149}  # the smallest step (subnormal)


def ulp(ref: np.ndarray, dtype: str) -> np.ndarray:
    """The half type's unit in the last place at each cell of ``ref`` (float32's spacing scaled to the type)."""
    r = np.abs(np.asarray(ref, dtype=np.float64)).astype(np.float32)
    step = np.spacing(r).astype(np.float64) * 2.0 ** (23 - BITS[dtype])
    return np.maximum(step, TINY[dtype])


def ulps(a: np.ndarray, ref: np.ndarray, dtype: str, rows: bool = False) -> np.ndarray:
    """|a - ref| in units in the last place of ``ref`` in ``dtype``; with ``rows``, of the largest magnitude of
    ``ref``'s row (a sum that cancels to a small cell carries the rounding of its large terms)."""
    ref = np.asarray(ref, np.float64)
    at = np.abs(ref).max(axis=-1, keepdims=True) if rows else ref
    return np.abs(np.asarray(a, np.float64) - ref) / ulp(at, dtype)


def assert_rounds_as(ours: np.ndarray, module: np.ndarray, dtype: str, *, exact: np.ndarray | None = None,
                     others: Iterable[tuple[str, np.ndarray]] = (), cell_ulps: float = 1.0, rows: bool = False,
                     what: str = "") -> None:
    """``ours`` rounds where ``module`` (torch's own, in ``dtype``) rounds: every cell within ``cell_ulps`` ulps
    of the module's (of its row's largest magnitude with ``rows``: outputs of sums); with ``exact`` (float64 on
    the same inputs) an error within 10% of the module's; and every reading of ``others`` farther from the
    module's cells than ours (see the module's docstring)."""
    ours, module = np.asarray(ours, np.float64), np.asarray(module, np.float64)
    d = ulps(ours, module, dtype, rows)
    stats = {"equal": float(np.mean(d == 0)), "max_ulps": float(d.max()), "mean_ulps": float(d.mean())}
    if exact is not None:
        stats["ratio"] = float(np.linalg.norm(ours - exact) / np.linalg.norm(module - exact))
    far = {name: float(ulps(o, module, dtype, rows).mean()) for name, o in others}
    if os.environ.get("ATTNCLI_HALF_STATS"):
        print(f"\nHALF {what} {dtype} {stats} others {far}")
    assert d.max() <= cell_ulps, f"{what}: a cell {d.max():.3g} ulps from the module's (bound {cell_ulps}); {stats}"
    if exact is not None:
        assert 0.9 <= stats["ratio"] <= 1.1, f"{what}: error {stats['ratio']:.3f}x the module's; {stats}"
    for name, mean in far.items():
        assert mean >= 2 * stats["mean_ulps"] + 0.1, f"{what}: {name} is as near the module as ours: {mean:.3g} " \
                                                       f"ulps on average, ours {stats['mean_ulps']:.3g}"
