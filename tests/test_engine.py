"""The spine's math: hand-computed values, PyTorch SDPA parity, d2l masked_softmax parity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from d2l_reference import masked_softmax as d2l_masked_softmax

from attncli import attend
from attncli.errors import InputError

BACKENDS = ["numpy", "torch"]

# The notes' cat/milk/it/sweet vectors: shown dimensions (state, taste), hidden ones 0, d = 4.
CAT_MILK = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=float)


def softmax_list(xs: list[float]) -> list[float]:
    """Plain-Python softmax: the float64 reference for hand-computed rows."""
    e = [math.exp(x - max(xs)) for x in xs]
    return [x / sum(e) for x in e]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cat_milk_by_hand(backend: str) -> None:
    t = attend(CAT_MILK, backend=backend)
    # Q Kᵀ as published in the notes: rows 8 8 8 8 | 8 10 8 12 | 8 8 8 8 | 8 12 8 16
    assert t["scores"].tolist() == [[8, 8, 8, 8], [8, 10, 8, 12], [8, 8, 8, 8], [8, 12, 8, 16]]
    # scaled by 1/sqrt(4): the milk row is (4, 5, 4, 6)
    np.testing.assert_allclose(t["scaled"][1], [4, 5, 4, 6], rtol=0, atol=1e-15)
    milk = softmax_list([4, 5, 4, 6])
    np.testing.assert_allclose(t.weights[1], milk, rtol=1e-14)
    assert round(milk[0], 4) == 0.0826  # the exp(4) / Σ exp(…) = 0.0826
    # uniform rows: output(cat) = output(it) = mean of the value rows = (0, 1.25, 2.75, 0)
    np.testing.assert_allclose(t.output[0], [0, 1.25, 2.75, 0], atol=1e-15)
    np.testing.assert_allclose(t.output[2], [0, 1.25, 2.75, 0], atol=1e-15)
    # output(milk) = Σ_j w_j v_j, by hand
    want = [sum(w * v for w, v in zip(milk, CAT_MILK[:, c])) for c in range(4)]
    np.testing.assert_allclose(t.output[1], want, rtol=1e-14)
    assert t.names() == ["scores", "scaled", "weights", "output"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dot_scale_and_temperature(backend: str) -> None:
    q = np.array([[1.0, 0.0], [0.0, 2.0]])
    k = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 1.0]])
    v = np.array([[1.0], [10.0], [100.0]])
    raw = [[1, 2, 0], [2, 0, 2]]  # q_i · k_j by hand
    t = attend(q, k, v, score="dot", backend=backend)
    assert t.names() == ["scores", "weights", "output"]  # dot: no scaling step
    np.testing.assert_allclose(t["scores"], raw)
    for i in range(2):
        w = softmax_list(raw[i])
        np.testing.assert_allclose(t.weights[i], w, rtol=1e-14)
        np.testing.assert_allclose(t.output[i, 0], w[0] + 10 * w[1] + 100 * w[2], rtol=1e-14)
    t = attend(q, k, v, score="scaled-dot", scale=0.1, temperature=2.0, backend=backend)
    np.testing.assert_allclose(t["scaled"], np.array(raw) * 0.1 / 2.0, rtol=1e-15)
    t = attend(q, k, v, score="dot", temperature=4.0, backend=backend)
    np.testing.assert_allclose(t.weights[0], softmax_list([0.25, 0.5, 0.0]), rtol=1e-14)


def _sdpa(q, k, v, mask=None, causal=False, scale=None):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                          attn_mask=None if mask is None else torch.from_numpy(mask),
                                          is_causal=causal, scale=scale).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 2e-6)])
@pytest.mark.parametrize("shape", [(5, 3, 8), (2, 3, 4, 6, 8), (7, 1, 4)])  # (…, m, n, d) as (batch.., m, n, d)
def test_sdpa_parity(backend: str, dtype: str, tol: float, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    *batch, m, n, d = shape
    q = rng.standard_normal((*batch, m, d)).astype(dtype)
    k = rng.standard_normal((*batch, n, d)).astype(dtype)
    v = rng.standard_normal((*batch, n, 5)).astype(dtype)
    t = attend(q, k, v, backend=backend, dtype=dtype)
    np.testing.assert_allclose(t.output, _sdpa(q, k, v), rtol=tol, atol=tol)
    # a boolean mask, True = take part (SDPA's convention and our default), no fully masked row
    keep = rng.random((*batch, m, n)) > 0.4
    keep[..., 0] = True
    t = attend(q, k, v, mask=keep, backend=backend, dtype=dtype)
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, mask=keep), rtol=tol, atol=tol)
    assert np.all(t.weights[~keep] == 0)  # masked keys get exactly zero weight
    # the same mask in the "drop" convention (key_padding_mask, the notes' score += mask·-1e9)
    t = attend(q, k, v, mask=~keep, mask_convention="drop", backend=backend, dtype=dtype)
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, mask=keep), rtol=tol, atol=tol)
    # a float mask is added to the scores
    bias = rng.standard_normal((m, n)).astype(dtype)
    t = attend(q, k, v, mask=bias, backend=backend, dtype=dtype)
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, mask=bias), rtol=tol, atol=tol)
    # causal, top-left aligned as is_causal
    t = attend(q, k, v, causal=True, backend=backend, dtype=dtype)
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, causal=True), rtol=tol, atol=tol)
    # --scale overrides 1/sqrt(d)
    t = attend(q, k, v, scale=0.3, backend=backend, dtype=dtype)
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, scale=0.3), rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_bottom_right_matches_torch(backend: str) -> None:
    from torch.nn.attention.bias import causal_lower_right

    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 8)), rng.standard_normal((6, 8)), rng.standard_normal((6, 2))
    bias = causal_lower_right(3, 6)
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=bias).numpy()
    t = attend(q, k, v, causal=True, causal_align="bottom-right", backend=backend)
    np.testing.assert_allclose(t.output, want, rtol=1e-12, atol=1e-12)
    # bottom-right: query i sees keys 0 .. i + (n - m)
    assert (t.weights > 0).sum(axis=1).tolist() == [4, 5, 6]


# ---- d2l's masked_softmax / DotProductAttention, transcribed from "Dive into Deep Learning" ----

def d2l_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              valid_lens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    d = q.shape[-1]
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
    w = d2l_masked_softmax(scores, valid_lens)
    return torch.bmm(w, v), w


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("valid_lens", [[2, 3], [[1, 3], [2, 4]], [0, 4], [[0, 2], [4, 0]]])
def test_d2l_masked_softmax_parity(backend: str, valid_lens: list) -> None:  # type: ignore[type-arg]
    rng = np.random.default_rng(0)
    q, k, v = rng.random((2, 2, 4)), rng.random((2, 4, 4)), rng.random((2, 4, 3))
    vl = torch.tensor(valid_lens, dtype=torch.float64)
    want_out, want_w = d2l_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), vl)
    t = attend(q, k, v, valid_lens=valid_lens, mask_value=-1e6, backend=backend)
    np.testing.assert_allclose(t.weights, want_w.numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(t.output, want_out.numpy(), rtol=1e-12, atol=1e-15)
    has_dead = 0 in np.ravel(valid_lens)
    assert bool(t.warnings) == has_dead  # fully masked rows are named
    # default -inf: identical except fully masked rows, which get zero weights and a zero output
    t = attend(q, k, v, valid_lens=valid_lens, backend=backend)
    dead = np.isclose(want_w.numpy(), 0.25).all(axis=-1) & has_dead
    np.testing.assert_allclose(t.weights[~dead], want_w.numpy()[~dead], rtol=1e-12, atol=1e-15)
    assert np.all(t.weights[dead] == 0) and np.all(t.output[dead] == 0)


def test_d2l_masked_softmax_example_rows() -> None:
    # d2l: masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3])): the first matrix keeps 2 keys,
    # the second 3; deterministic part: which entries are zero and that rows sum to 1.
    x = np.random.default_rng(1).random((2, 2, 4))
    t = attend(x, np.eye(4)[None].repeat(2, 0), score="dot", valid_lens=[2, 3])
    w = t.weights
    assert (w[0, :, 2:] == 0).all() and (w[1, :, 3:] == 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-15)


def test_heads_and_valid_lens_broadcast() -> None:
    # (B, H, m, d) with valid lengths per batch entry (B,): the same limit for every head and query
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 3, 4, 8)), rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 5, 2))
    t = attend(q, k, v, valid_lens=[2, 5])
    keep = np.zeros((2, 3, 4, 5), dtype=bool)
    keep[0, ..., :2] = True
    keep[1] = True
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, mask=keep), rtol=1e-12, atol=1e-12)
    # (B, m): one length per query, broadcast over heads
    t = attend(q, k, v, valid_lens=[[1, 2, 3, 4], [5, 4, 3, 2]])
    keep = np.arange(5) < np.array([[1, 2, 3, 4], [5, 4, 3, 2]])[:, None, :, None]
    np.testing.assert_allclose(t.output, _sdpa(q, k, v, mask=np.broadcast_to(keep, (2, 3, 4, 5)).copy()),
                               rtol=1e-12, atol=1e-12)


def test_unbatched_valid_lens_and_one_query() -> None:
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    t = attend(np.array([1.0, 0.0]), k, score="dot", valid_lens=2)  # a 1-D q is one query
    np.testing.assert_allclose(t.weights, [softmax_list([1, 0]) + [0.0]], rtol=1e-15)
    t = attend(np.ones((3, 2)), k, score="dot", valid_lens=[1, 2, 3])  # (m,): one per query
    assert (t.weights > 0).sum(axis=1).tolist() == [1, 2, 3]


def test_fully_masked_row_zero_by_default() -> None:
    t = attend(CAT_MILK, query_labels=["cat", "milk", "it", "sweet"], key_labels=["cat", "milk", "it", "sweet"],
               mask=np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 1], [1, 1, 1, 1]]))
    assert t.weights[1].tolist() == [0, 0, 0, 0] and t.output[1].tolist() == [0, 0, 0, 0]
    assert t.warnings == ["query 'milk' has every key masked: its weights and output are zero"]
    np.testing.assert_allclose(t.weights.sum(-1), [1, 0, 1, 1], rtol=1e-15)


@pytest.mark.parametrize("kwargs,match", [
    ({"k": np.ones((3, 5))}, "K has width 5 but Q has width 4.*--score additive"),
    ({"k": np.ones((3, 4)), "v": np.ones((2, 4))}, "V has 2 rows but K has 3 keys"),
    ({"k": np.ones((2, 3, 4)), "v": np.ones((3, 3, 4)), "q2": np.ones((2, 1, 4))}, "batch axes do not match"),
    ({"valid_lens": [5]}, "valid length 5 is out of range: there are 4 keys"),
    ({"valid_lens": [-1]}, "valid length -1 is out of range"),
    ({"valid_lens": [1.5]}, "whole numbers"),
    ({"valid_lens": [[1, 2]]}, "valid lengths have shape"),
    ({"mask": np.ones((3, 3))}, "does not broadcast"),
    ({"q2": [[1.0, float("nan"), 0, 0]]}, "NaN at index \\[0, 1\\]"),
    ({"q2": [[1, 2], [3]]}, "ragged"),
    ({"q2": [["a", "b"]]}, "text where numbers belong"),
    ({"temperature": 0}, "temperature must be a positive number"),
    ({"score": "nope"}, "unknown score 'nope'"),
])
def test_bad_input_messages(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    q = kwargs.pop("q2", CAT_MILK)
    with pytest.raises(InputError, match=match):
        attend(q, **kwargs)
