"""--plot at the size of a real layer, on the pixels: heads in a near-square grid with one colour
bar, masked cells one grey layer, big maps downsampled to the panel (each pixel the largest of
its block). References: the weights computed here in float64 with a plain softmax, and
matplotlib's own colour table (never ours); the PNG is read back with matplotlib.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from matplotlib import colormaps  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.image import imread  # noqa: E402

import attncli  # noqa: E402
from attncli.render.plot import CMAP, MASKED_COLOUR, PlotOptions, panel_title, plot_steps  # noqa: E402


def causal_weights(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scaled-dot self-attention weights with a causal mask, float64, and the mask (True = masked)."""
    q = q.astype(np.float64)
    s = q @ np.swapaxes(q, -1, -2) / np.sqrt(q.shape[-1])
    m = s.shape[-1]
    masked = np.triu(np.ones((m, m), dtype=bool), k=1)
    s = np.where(masked, -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True), np.broadcast_to(masked, s.shape)


def draw(trace: attncli.Trace) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    buf = io.BytesIO()
    boxes = plot_steps(trace, buf, "png", PlotOptions())
    buf.seek(0)
    return imread(buf, format="png")[..., :3], boxes  # (h, w, 3) floats in [0, 1]


def centre(box: tuple[int, int, int, int], i: float, j: float, m: int, n: int) -> tuple[int, int]:
    left, top, right, bottom = box
    return int(top + (i + 0.5) * (bottom - top) / m), int(left + (j + 0.5) * (right - left) / n)


def test_heads_grid_and_masked_cells_on_the_pixels() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 5, 6, 3))  # one batch entry, 5 heads, 6 tokens
    trace = attncli.attend(q, causal=True, dtype="float64")
    png, boxes = draw(trace)
    w, masked = causal_weights(q)
    # 5 panels: ceil(sqrt(5)) = 3 across, 2 rows
    assert len(boxes) == 5
    assert len({b[0] for b in boxes}) == 3 and len({b[1] for b in boxes}) == 2
    assert [b[1] for b in boxes] == sorted(b[1] for b in boxes)  # row-major
    kept = w[~masked]
    lo, hi = kept.min(), kept.max()  # one colour scale shared by every head
    table = colormaps[CMAP]
    grey = np.array(to_rgb(MASKED_COLOUR))
    for h, box in enumerate(boxes):
        for i in range(6):
            for j in range(6):
                y, x = centre(box, i, j, 6, 6)
                want = grey if masked[0, h, i, j] else np.array(table((w[0, h, i, j] - lo) / (hi - lo))[:3])
                assert np.abs(png[y, x] - want).max() <= 2.5 / 255, (h, i, j, png[y, x], want)


def test_a_long_causal_map_is_downsampled_with_one_grey_layer() -> None:
    rng = np.random.default_rng(4)
    q = rng.standard_normal((600, 4))
    trace = attncli.attend(q, causal=True, dtype="float64")
    png, boxes = draw(trace)
    w, masked = causal_weights(q)
    (box,) = boxes
    fr = 2  # 600 cells into a panel of at most 300 pixels: blocks of 2 × 2
    blocks = np.where(masked, -np.inf, w).reshape(300, fr, 300, fr).max(axis=(1, 3))  # the largest kept value
    lo, hi = w[~masked].min(), w[~masked].max()
    table = colormaps[CMAP]
    grey = np.array(to_rgb(MASKED_COLOUR))
    for bi, bj in [(5, 294), (10, 200), (100, 250), (250, 10), (294, 5), (150, 20), (200, 100), (280, 270)]:  # off the spines
        y, x = centre(box, bi, bj, 300, 300)
        if bj > bi + 2:  # wholly above the diagonal: every cell masked
            assert np.abs(png[y, x] - grey).max() <= 2.5 / 255
            continue
        # nearest resampling of 300 blocks onto the panel's pixels may land on a neighbouring block
        near = [np.array(table((blocks[a, b] - lo) / (hi - lo))[:3]) for a in (bi - 1, bi, bi + 1)
                for b in (bj - 1, bj, bj + 1) if 0 <= a < 300 and 0 <= b < 300 and np.isfinite(blocks[a, b])]
        assert min(np.abs(png[y, x] - c).max() for c in near) <= 2.5 / 255, (bi, bj)


def test_titles_name_the_batch_only_when_there_are_several() -> None:
    one = attncli.attend(np.ones((1, 2, 3, 2)))
    two = attncli.attend(np.ones((2, 2, 3, 2)))
    assert panel_title(one, (0, 1), (1, 2)) == "head 1"
    assert panel_title(two, (1, 0), (2, 2)) == "batch 1, head 0"
    assert panel_title(attncli.attend(np.ones((3, 3, 2))), (2,), (3,)) == "batch 2"
