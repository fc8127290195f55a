"""The port mistakes of the catalogue (attncli/check/mistakes_port.py), each against an independent implementation:
transformers' ``apply_rotary_pos_emb`` with another base, plain loops for the off-by-one causal masks, numpy for
√(H·d); the correct implementation passes. And: a forgotten option is named, a do-nothing variant never offered."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_check_today import TOL, attention, build, hf_rope, names, one, rand

from attncli.check.verdict import check

pytest.importorskip("transformers")


def test_rope_with_a_larger_base_is_fitted_and_named() -> None:
    q, k, v = rand(2, 6, 8, seed=31), rand(2, 6, 8, seed=32), rand(2, 6, 4, seed=33)
    pos = np.arange(6)
    problem = build(q, k, v, rope="half")  # the reference: base 10000
    assert check(problem, attention(hf_rope(q, pos), hf_rope(k, pos), v), tolerance=TOL).match
    wrong = attention(hf_rope(q, pos, 500000.0), hf_rope(k, pos, 500000.0), v)
    verdict = check(problem, wrong, tolerance=TOL)
    assert {e.name for e in verdict.explanations} == {"rope-base-other"}
    assert "RoPE base 500000, the reference uses 10000" in verdict.explanations[0].explanation
    assert verdict.explanations[0].option == "--rope-base 500000"


def test_rope_with_a_smaller_base_is_fitted_and_named() -> None:
    q, k, v = rand(7, 8, seed=34), rand(7, 8, seed=35), rand(7, 3, seed=36)
    pos = np.arange(7)
    problem = build(q, k, v, rope="half", rope_base=1000000.0)
    assert check(problem, attention(hf_rope(q[None], pos, 1e6)[0], hf_rope(k[None], pos, 1e6)[0], v), tolerance=TOL).match
    wrong = attention(hf_rope(q[None], pos, 50000.0)[0], hf_rope(k[None], pos, 50000.0)[0], v)
    assert names(problem, wrong) == one("rope-base-other")


def test_a_forgotten_rope_option_is_named() -> None:
    q, k, v = rand(2, 6, 8, seed=37), rand(2, 6, 8, seed=38), rand(2, 6, 4, seed=39)
    pos = np.arange(6)
    verdict = check(build(q, k, v), attention(hf_rope(q, pos), hf_rope(k, pos), v), tolerance=TOL)
    assert [e.name for e in verdict.explanations] == ["rope-added"]
    assert verdict.explanations[0].option == "--rope half"


def causal_loop(m: int, n: int, shift: int) -> np.ndarray:
    return np.array([[j <= i + shift for j in range(n)] for i in range(m)])


@pytest.mark.parametrize(("shift", "name"), [(-1, "causal-diagonal-excluded"), (1, "causal-one-future")])
def test_causal_mask_off_by_one(shift: int, name: str) -> None:
    q, k, v = rand(6, 4, seed=40), rand(6, 4, seed=41), rand(6, 3, seed=42)
    problem = build(q, k, v, causal=True)
    assert check(problem, attention(q, k, v, causal_loop(6, 6, 0)), tolerance=TOL).match
    assert names(problem, attention(q, k, v, causal_loop(6, 6, shift))) == one(name)


def test_sqrt_of_heads_times_width_with_4d_inputs() -> None:
    q, k, v = rand(1, 4, 5, 8, seed=43), rand(1, 4, 5, 8, seed=44), rand(1, 4, 5, 8, seed=45)
    problem = build(q, k, v)
    assert check(problem, attention(q, k, v), tolerance=TOL).match
    assert names(problem, attention(q, k, v, scale=1 / math.sqrt(4 * 8))) == one("sqrt-heads-width")


def test_rope_query_positions_not_offset_in_a_kv_cache_step() -> None:
    q, k, v = rand(2, 3, 8, seed=46), rand(2, 7, 8, seed=47), rand(2, 7, 4, seed=48)
    problem = build(q, k, v, rope="half", causal=True, causal_align="bottom-right")  # queries at 4, 5, 6
    keep = causal_loop(3, 7, 4)
    kr = hf_rope(k, np.arange(7))
    assert check(problem, attention(hf_rope(q, np.arange(4, 7)), kr, v, keep), tolerance=TOL).match
    assert names(problem, attention(hf_rope(q, np.arange(3)), kr, v, keep)) == one("rope-q-positions-not-offset")


def test_a_do_nothing_variant_is_never_offered() -> None:
    # no fully masked row: mask-value-1e6 changes nothing; the expected numbers are off by noise above the tolerance
    q, k, v = rand(6, 4, seed=49), rand(6, 4, seed=50), rand(6, 3, seed=51)
    problem = build(q, k, v, causal=True)
    noisy = attention(q, k, v, causal_loop(6, 6, 0)) + rand(6, 3, seed=52) * 1e-6
    verdict = check(problem, noisy, tolerance=TOL)
    assert not verdict.match and verdict.explanations == [] and verdict.nearest == []
    assert "mask-value-1e6" in verdict.skipped and "changes nothing" in verdict.skipped["mask-value-1e6"]
