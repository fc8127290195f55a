"""Properties of attention that hold for every registered score, checked with hypothesis over
random shapes (1 query, 1 key, widths 1 and 512, batch and head axes), masks and valid
lengths, float32/float64 and extreme magnitudes (1e-30 ... 1e30, scores of ±1e4):

- weights are finite, non-negative, and each row sums to 1 (a fully masked row is all 0);
- each output lies within the range of the value rows its query can see;
- masked keys do not influence the output (changing their values or keys changes nothing);
- permuting keys together with their values changes nothing;
- adding a constant to every score of a row changes nothing;
- numpy and torch agree.

Scores that take learned parameters get them from the seeded initialisation (``seed=``), so
the registry is iterated as it grows. The references are the definitions above, checked in
float64 numpy in this file; nothing here compares with recorded outputs of attncli.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attncli.core.engine import attend
from attncli.core.ops import softmax
from attncli.core.scoring import SCORES
from attncli.core.trace import Trace
from attncli.errors import InputError

# A modest, fixed budget keeps this file to a few seconds on a shared 2-core machine;
# ATTNCLI_PROPERTY_EXAMPLES=500 for a longer, random local run.
_LONG = os.environ.get("ATTNCLI_PROPERTY_EXAMPLES")
settings.register_profile("attncli-props", max_examples=int(_LONG or 25), deadline=None, derandomize=not _LONG,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROPS = settings.get_profile("attncli-props")

SCORE_NAMES = sorted(SCORES)
MAGNITUDES = (1e-30, 1e-3, 1.0, 30.0, 1e30)
WIDTHS = (1, 2, 3, 8, 512)
BATCHES = ((), (1,), (2,), (2, 3))  # none, a batch axis, a batch and a head axis
MASKINGS = ("none", "valid_lens", "valid_lens_2d", "mask", "mask_drop", "float_mask", "causal", "all_masked_row")


@dataclass
class Case:
    score: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    dtype: str
    magnitude: float
    masking: str
    keep: np.ndarray  # (..., m, n) boolean: which keys each query sees (the reference)
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self, **over: Any) -> Trace:
        args = {"score": self.score, "dtype": self.dtype, "seed": 0, **self.kwargs, **over}
        q, k, v = args.pop("q", self.q), args.pop("k", self.k), args.pop("v", self.v)
        return attend(q, k, v, **args)

    @property
    def rtol(self) -> float:
        return 2e-4 if self.dtype == "float32" else 1e-9


@st.composite
def cases(draw: st.DrawFn, scores: tuple[str, ...] = tuple(SCORE_NAMES)) -> Case:
    score = draw(st.sampled_from(scores))
    batch = draw(st.sampled_from(BATCHES))
    m, n = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    d = draw(st.sampled_from(WIDTHS))
    d_v = draw(st.sampled_from((1, 3)))
    dtype = draw(st.sampled_from(("float32", "float64")))
    magnitude = draw(st.sampled_from(MAGNITUDES))
    masking = draw(st.sampled_from(MASKINGS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((*batch, m, d)) * magnitude
    k = rng.standard_normal((*batch, n, d)) * magnitude
    v = rng.standard_normal((*batch, n, d_v)) * draw(st.sampled_from((1e-3, 1.0, 1e6)))
    q, k, v = (a.astype(dtype) for a in (q, k, v))

    keep = np.ones((*batch, m, n), dtype=bool)
    kwargs: dict[str, Any] = {}
    j = np.arange(n)
    if masking == "valid_lens" and batch:
        vl = rng.integers(1, n + 1, size=batch[0])  # d2l (B,): one length per batch entry
        kwargs["valid_lens"] = vl
        keep &= j < vl.reshape((batch[0],) + (1,) * len(batch))[..., None]
    elif masking.startswith("valid_lens"):
        vl = rng.integers(0, n + 1, size=(batch[0], m) if batch else (m,))  # per query, 0 allowed
        kwargs["valid_lens"] = vl
        shape = (batch[0],) + (1,) * (len(batch) - 1) + (m,) if batch else (m,)
        keep &= j < vl.reshape(shape)[..., None]
    elif masking == "mask":
        mk = rng.random((*batch, m, n)) < 0.7  # keep convention: True takes part
        kwargs["mask"] = mk
        keep &= mk
    elif masking == "mask_drop":  # key_padding_mask style: True = masked out
        mk = rng.random((*batch, m, n)) < 0.3
        kwargs.update(mask=mk, mask_convention="drop")
        keep &= ~mk
    elif masking == "float_mask":  # additive, SDPA style: 0 keeps, -inf masks
        mk = rng.random((m, n)) < 0.7
        kwargs["mask"] = np.where(mk, 0.0, -np.inf).astype(dtype)
        keep &= mk
    elif masking == "causal":
        kwargs["causal"] = True
        keep &= j <= np.arange(m)[:, None]
    elif masking == "all_masked_row":
        mk = np.ones((m, n), dtype=bool)
        mk[0] = False  # query 0 sees no key at all
        kwargs["mask"] = mk
        keep &= mk
    return Case(score, q, k, v, dtype, magnitude, masking, keep, kwargs)


def run_or_overflow(case: Case, **over: Any) -> Trace | None:
    """The trace, or None when attncli refused because the scores overflow the dtype: only
    allowed for inputs of 1e30, where q·k reaches 1e60 (beyond float32's 3.4e38)."""
    try:
        return case.run(**over)
    except InputError as e:
        assert case.magnitude >= 1e30 and "overflow" in str(e), str(e)
        return None


def check_weights(w: np.ndarray, keep: np.ndarray, rtol: float) -> None:
    keep = np.broadcast_to(keep, w.shape)
    assert np.all(np.isfinite(w)), "weights must be finite"
    assert np.all(w >= 0), "weights must be non-negative"
    np.testing.assert_array_equal(w[~keep], 0.0)  # masked keys get exactly 0
    sums = w.sum(axis=-1)
    alive = keep.any(axis=-1)
    np.testing.assert_allclose(sums[alive], 1.0, rtol=0, atol=max(rtol, 1e-12) * w.shape[-1])
    np.testing.assert_array_equal(sums[~alive], 0.0)  # fully masked rows: all zero


@given(cases())
@PROPS
def test_weights_are_a_distribution_and_outputs_in_range(case: Case) -> None:
    trace = run_or_overflow(case)
    if trace is None:
        return
    w, out = trace.weights.astype(np.float64), trace.output.astype(np.float64)
    check_weights(w, case.keep, case.rtol)

    # the output of query i lies within [min_j v_j, max_j v_j] over the keys j it sees
    keep = np.broadcast_to(case.keep, w.shape)[..., None]  # (..., m, n, 1)
    v = np.broadcast_to(case.v.astype(np.float64)[..., None, :, :], keep.shape[:-1] + case.v.shape[-1:])
    lo = np.where(keep, v, np.inf).min(axis=-2)  # (..., m, d_v)
    hi = np.where(keep, v, -np.inf).max(axis=-2)
    alive = keep.any(axis=-2)[..., 0]
    slack = case.rtol * np.abs(case.v).max() * case.v.shape[-2]
    assert np.all(out[alive] >= lo[alive] - slack) and np.all(out[alive] <= hi[alive] + slack)
    np.testing.assert_array_equal(out[~alive], 0.0)  # a fully masked query outputs zeros


@given(cases(), st.data())
@PROPS
def test_masked_keys_do_not_influence_the_output(case: Case, data: st.DataObject) -> None:
    if case.keep.all():
        return
    base = run_or_overflow(case)
    if base is None:
        return
    # keys masked for every query (a key seen by one query may matter to it)
    dead = ~np.broadcast_to(case.keep, base.weights.shape).any(axis=-2)  # (..., n)
    if not dead.any():
        return
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    v2 = np.array(np.broadcast_to(case.v, dead.shape + case.v.shape[-1:]))
    v2[dead] = (rng.standard_normal(v2[dead].shape) * 1e6).astype(case.dtype)  # wild values where masked
    other = case.run(v=v2)
    np.testing.assert_array_equal(other.weights, base.weights)
    np.testing.assert_allclose(other.output, base.output, rtol=case.rtol, atol=0)
    if case.magnitude <= 30:  # changing masked keys too (at sane magnitudes: gaussian centres on all keys)
        k2 = np.array(np.broadcast_to(case.k, dead.shape + case.k.shape[-1:]))
        k2[dead] = (rng.standard_normal(k2[dead].shape) * case.magnitude).astype(case.dtype)
        again = case.run(k=k2, v=v2)
        np.testing.assert_allclose(again.output, base.output, rtol=case.rtol * 50, atol=1e-6 * np.abs(case.v).max())


@given(cases(), st.data())
@PROPS
def test_permuting_keys_with_values_changes_nothing(case: Case, data: st.DataObject) -> None:
    if case.kwargs.get("valid_lens") is not None or case.kwargs.get("causal"):
        # valid lengths and causal masks are about positions: express them as a mask to permute
        case.kwargs = {"mask": np.broadcast_to(case.keep, case.keep.shape)}
    base = run_or_overflow(case)
    if base is None:
        return
    n = case.k.shape[-2]
    perm = np.asarray(data.draw(st.permutations(range(n))))
    kw = dict(case.kwargs)
    if kw.get("mask") is not None:
        kw["mask"] = np.asarray(kw["mask"])[..., perm]
    other = case.run(k=case.k[..., perm, :], v=case.v[..., perm, :], **kw)
    np.testing.assert_allclose(other.weights, base.weights[..., perm], rtol=case.rtol * 10, atol=1e-12)
    scale = np.abs(case.v).max()
    np.testing.assert_allclose(other.output, base.output, rtol=case.rtol * 10, atol=case.rtol * scale)


@given(cases(), st.sampled_from((-1e4, -1.0, 0.5, 1e4)))
@PROPS
def test_adding_a_constant_to_a_row_of_scores_changes_nothing(case: Case, c: float) -> None:
    """A float mask is added to the scores: a per-row constant (shape (..., m, 1)) must not
    change the weights. The constants reach ±1e4, far beyond where a naive exp overflows."""
    if case.kwargs.get("mask") is not None:
        return  # the float mask below takes the mask's place
    base = run_or_overflow(case)
    if base is None:
        return
    m = case.q.shape[-2]
    rows = (np.arange(m, dtype=np.float64)[:, None] + 1.0) * c  # (m, 1): a different constant per row
    other = case.run(mask=rows.astype(case.dtype))
    w0, w1 = base.weights.astype(np.float64), other.weights.astype(np.float64)
    # float32 scores of size |c|·m lose digits when c is added: allow for that rounding
    tol = case.rtol + (np.finfo(case.dtype).eps * abs(c) * m * 8 if case.dtype == "float32" else 1e-9)
    np.testing.assert_allclose(w1, w0, rtol=0, atol=tol)


def test_softmax_extreme_scores_by_hand() -> None:
    """Scores of ±1e4 (a naive exp overflows at 710): softmax([1e4, 1e4 - 1, -1e4]) is
    (e/(e+1), 1/(e+1), 0) by subtracting the max; a row of -inf is all zeros."""
    xp = np
    s = np.array([[1e4, 1e4 - 1.0, -1e4], [-np.inf, -np.inf, -np.inf], [-1e4, -1e4, -1e4]])
    w = softmax(xp, s)
    e = math.e
    np.testing.assert_allclose(w[0], [e / (e + 1), 1 / (e + 1), 0.0], rtol=1e-15, atol=0)
    np.testing.assert_array_equal(w[1], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(w[2], [1 / 3] * 3, rtol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("magnitude", [1e-30, 1e30])
@pytest.mark.parametrize("score", SCORE_NAMES)
def test_extreme_magnitudes_every_score(score: str, magnitude: float, dtype: str) -> None:
    """Every score at inputs of 1e-30 and 1e30, both dtypes, with a mask and a fully masked
    row: a valid distribution, or (float32 products past 3.4e38) a one-line overflow error."""
    rng = np.random.default_rng(7)
    q, k = (rng.standard_normal((2, 3, 8)) * magnitude for _ in range(2))
    v = rng.standard_normal((2, 3, 2))
    mk = np.array([[True, False, True], [False, False, False], [True, True, True]])
    case = Case(score, q.astype(dtype), k.astype(dtype), v.astype(dtype), dtype, magnitude, "mask", mk,
                {"mask": mk})
    trace = run_or_overflow(case)
    if trace is None:
        assert dtype == "float32" or score in ("dot", "general"), "float64 holds 1e60"
        return
    check_weights(trace.weights.astype(np.float64), mk, case.rtol)
    np.testing.assert_array_equal(trace.output[:, 1], 0.0)  # the fully masked query


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("magnitude", [1e-30, 1e30])
def test_cosine_is_scale_invariant(magnitude: float, dtype: str) -> None:
    """cos(q, k) does not change when q and k are scaled: at 1e±30 in float32 a naive ‖q‖
    (sqrt of a sum of squares) overflows or underflows. Reference: cosines by hand, float64."""
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    cos = (x @ x.T) / np.outer(np.linalg.norm(x, axis=1), np.linalg.norm(x, axis=1))
    ref = np.exp(10 * cos) / np.exp(10 * cos).sum(axis=1, keepdims=True)
    w = attend((x * magnitude).astype(dtype), score="cosine", scale=10).weights
    np.testing.assert_allclose(w, ref, rtol=1e-5 if dtype == "float32" else 1e-12)


def test_gaussian_overflow_is_reported_not_hidden() -> None:
    """Distances of 1e60 overflow float32: an error naming the overflow, not a distance of 0."""
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((3, 4)) * 1e30 for _ in range(2))
    with pytest.raises(InputError, match="overflow float32"):
        attend(q.astype("float32"), k.astype("float32"), score="gaussian")


@pytest.mark.parametrize("score", SCORE_NAMES)
def test_one_query_one_key(score: str) -> None:
    """With one key, the weight is 1 and the output is that key's value, whatever the score."""
    for d in (1, 512):
        q = np.full((1, d), 0.5)
        trace = attend(q, np.ones((1, d)), np.array([[3.0, -2.0]]), score=score, seed=0)
        np.testing.assert_array_equal(trace.weights, [[1.0]])
        np.testing.assert_allclose(trace.output, [[3.0, -2.0]], rtol=1e-15)


torch = pytest.importorskip("torch")


@given(cases())
@PROPS
def test_numpy_and_torch_agree(case: Case) -> None:
    a = run_or_overflow(case)
    if a is None:
        return
    b = case.run(backend="torch")
    assert b.meta.backend == "torch" and b.output.dtype == np.dtype(case.dtype)
    for name in ("weights", "output"):
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        scale = max(np.abs(x).max(), 1e-300)
        np.testing.assert_allclose(y, x, rtol=case.rtol * 10, atol=case.rtol * scale)
