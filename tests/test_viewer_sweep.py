"""The viewer's (and the big ``--html`` page's) sweep, which computes a block of queries only against the keys some
row of the block can see (attncli.core.engine.hidden_after), against an independent reference: the weights of the
whole map computed here in float64 (a plain masked softmax, every key), max-pooled by a plain loop over blocks of
cells, NaN where every cell of a block is masked."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attncli.core.engine import hidden_after
from attncli.core.options import Options
from attncli.core.problem import Problem
from attncli.render import viewer

T, H, D = 37, 3, 4


def reference(x: np.ndarray, keep: np.ndarray, fill: float) -> np.ndarray:
    """Scaled-dot self-attention weights of x (B, H, T, d) in float64, masked keys set to ``fill`` before the
    softmax; keep (B, 1, T, T)."""
    s = x @ np.swapaxes(x, -1, -2) / math.sqrt(x.shape[-1])
    s = np.where(keep, s, fill)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def pooled(w: np.ndarray, keep: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """Each fr × fc block's largest kept weight, NaN where the block keeps none: a plain loop."""
    lead = w.shape[:-2]
    m, n = w.shape[-2:]
    out = np.full(lead + (math.ceil(m / fr), math.ceil(n / fc)), np.nan)
    keep = np.broadcast_to(keep, w.shape)
    for e in np.ndindex(*lead):
        for a in range(out.shape[-2]):
            for b in range(out.shape[-1]):
                cells = w[e][a * fr:(a + 1) * fr, b * fc:(b + 1) * fc][keep[e][a * fr:(a + 1) * fr, b * fc:(b + 1) * fc]]
                if cells.size:
                    out[e + (a, b)] = cells.max()
    return out


CASES = {  # options, keep (B, 1, T, T) as the option means it, the value a masked score becomes
    "causal": ({"causal": True}, np.tril(np.ones((T, T), bool))[None, None], -np.inf),
    "window": ({"window": 5}, (np.tril(np.ones((T, T), bool)) & ~np.tril(np.ones((T, T), bool), -5))[None, None],
               -np.inf),
    "valid lengths": ({"valid_lens": np.array([20, 31])}, (np.arange(T) < np.array([20, 31])[:, None])[:, None, None, :],
                      -np.inf),
    "causal, mask value": ({"causal": True, "mask_value": -1e6}, np.tril(np.ones((T, T), bool))[None, None], -1e6),
    "no mask": ({}, np.ones((1, 1, T, T), bool), -np.inf),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("overview", [T, 8])
def test_sweep_overview_is_the_pooled_reference(case: str, overview: int, monkeypatch: pytest.MonkeyPatch) -> None:
    given, keep, fill = CASES[case]
    opts = dict(given)
    x = np.random.default_rng(3).standard_normal((2, H, T, D))
    valid = opts.pop("valid_lens", None) if "valid_lens" in opts else None
    options = Options().merged({**opts, "dtype": "float64"}, "test")
    problem = Problem.build(x, x, x, valid_lens=valid, options=options) if valid is not None else \
        Problem.build(x, x, x, options=options)
    monkeypatch.setattr(viewer, "BLOCK_BYTES", viewer.WORKERS * 2 * H * T * 8 * 5 * 6)  # ~6 rows a block: many blocks
    monkeypatch.setattr(viewer, "BLOCK_ROWS", 1)
    layer = viewer.Layer(problem, "attention", overview=overview)
    assert 1 < layer.block < T
    layer.sweep(layer.weights_step)
    assert layer.failed is None
    ov = layer.overviews[layer.weights_step]
    w = reference(x, keep, fill)
    want = pooled(w, keep, ov.fr, ov.fc)
    np.testing.assert_allclose(ov.values, want.astype(np.float32), rtol=1e-6, atol=0, equal_nan=True)
    kept = np.broadcast_to(keep, w.shape)
    assert ov.lo == pytest.approx(w[kept].min(), rel=1e-12, abs=1e-300)
    assert ov.hi == pytest.approx(w[kept].max(), rel=1e-12)
    assert ov.masked == (not keep.all())


def test_hidden_after_names_the_keys_no_row_of_the_block_sees() -> None:
    x = np.random.default_rng(0).standard_normal((1, H, T, D))

    def keys(opts: dict[str, object], rows: range) -> int | None:
        return hidden_after(Problem.build(x, options=Options().merged(opts, "test")), np.arange(rows.start, rows.stop))

    assert keys({"causal": True}, range(0, 8)) == 8  # rows 0..7 see keys 0..7
    assert keys({"causal": True}, range(30, T)) is None  # the last row sees every key: nothing to leave out
    assert keys({"window": 5}, range(8, 16)) == 16
    assert keys({"causal": True, "mask_value": -1e6}, range(0, 8)) is None  # masked keys weigh exp(-1e6 - max)
    assert keys({"causal": True, "dropout": 0.5}, range(0, 8)) is None  # dropout's draws follow the shape
    assert keys({}, range(0, 8)) is None
