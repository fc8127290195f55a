"""Properties every registered score must have, on both backends: rows of weights sum to 1 (0 when
every key is masked), masked keys get weight 0, permuting keys together with their values leaves the
output unchanged, and --hard rows are one-hot."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attncli import attend
from attncli.core.scoring import SCORES

BACKENDS = ["numpy", "torch"]


@st.composite
def problems(draw: st.DrawFn, same_width: bool) -> dict:
    B, m, n = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    d_q = draw(st.integers(1, 5))
    d_k = d_q if same_width else draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    keep = rng.random((B, 1, n)) < 0.7  # per key and batch entry; some entries may lose every key
    return {"q": scale * rng.normal(size=(B, m, d_q)), "k": scale * rng.normal(size=(B, n, d_k)),
            "v": rng.normal(size=(B, n, 2)), "mask": keep, "perm": rng.permutation(n)}


def _check_score(score: str, backend: str, p: dict) -> None:
    keep = p["mask"]
    t = attend(p["q"], p["k"], p["v"], score=score, mask=keep, seed=3, backend=backend)
    w = t.weights
    dead = ~keep.any(axis=-1)  # (B, 1): entries with every key masked
    sums = w.sum(axis=-1)
    np.testing.assert_allclose(sums, np.where(dead, 0.0, 1.0) * np.ones_like(sums), atol=1e-12)
    assert (w[np.broadcast_to(~keep, w.shape)] == 0).all()  # masked keys: weight exactly 0
    # permuting keys with their values (and the mask's key axis) changes nothing
    perm = p["perm"]
    tp = attend(p["q"], p["k"][:, perm], p["v"][:, perm], score=score, mask=keep[..., perm], seed=3, backend=backend)
    np.testing.assert_allclose(tp.output, t.output, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(tp.weights, w[..., perm], rtol=1e-9, atol=1e-12)
    # hard attention: one-hot rows (zero where every key is masked), at the largest weight
    h = attend(p["q"], p["k"], p["v"], score=score, mask=keep, seed=3, hard=True, backend=backend)["hard"]
    assert set(np.unique(h)) <= {0.0, 1.0}
    np.testing.assert_array_equal(h.sum(axis=-1), np.where(dead, 0.0, 1.0) * np.ones_like(sums))
    alive = h.sum(axis=-1) == 1
    top = np.take_along_axis(w, h.argmax(axis=-1)[..., None], axis=-1)[..., 0]
    np.testing.assert_array_equal(top[alive], w.max(axis=-1)[alive])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("score", sorted(SCORES))
def test_score_properties(score: str, backend: str) -> None:
    @settings(max_examples=12, deadline=None)
    @given(problems(SCORES[score].same_width))
    def check(p: dict) -> None:
        _check_score(score, backend, p)

    check()


def test_every_score_is_covered() -> None:
    """The registry holds the scores of the notes (a new one is picked up by the test above)."""
    assert {"dot", "scaled-dot", "general", "additive", "cosine", "gaussian", "location"} <= set(SCORES)
