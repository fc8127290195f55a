"""One colour map for every view: the terminal, --plot, --html and the viewer all use viridis.
Reference: matplotlib's own viridis table."""

from __future__ import annotations

import re

import numpy as np
import pytest

from attncli.render import colours
from attncli.render.terminal import heat_style

pytest.importorskip("matplotlib")
from matplotlib import colormaps  # noqa: E402

VIRIDIS = colormaps["viridis"]


def test_the_stops_are_matplotlibs_viridis() -> None:
    for k, stop in enumerate(colours.STOPS):
        want = np.round(np.asarray(VIRIDIS(k / (len(colours.STOPS) - 1))[:3]) * 255)
        assert np.abs(np.asarray(stop) - want).max() <= 1, (k, stop, want)


@pytest.mark.parametrize("t", np.linspace(0, 1, 41))
def test_every_view_draws_viridis(t: float) -> None:
    want = np.asarray(VIRIDIS(t)[:3]) * 255
    assert np.abs(np.asarray(colours.rgb(t)) - want).max() <= 6  # 17 stops, linear between them
    assert np.abs(colours.table()[round(t * 255)] - want).max() <= 6
    if t > 0:
        bg = heat_style(t, False).bgcolor
        assert bg is not None and np.abs(np.asarray(bg.get_truecolor()) - want).max() <= 6


def test_plot_and_page_use_it() -> None:
    from attncli.render import page, plot

    assert plot.CMAP == "viridis"
    import json

    import attncli

    text = page.page(attncli.attend(np.eye(3)))  # the palette the page's script colours its cells with
    js = re.search(r"const PALETTE = (\[\[.*?\]\]);", text, re.S)
    assert js is not None
    palette = json.loads(js.group(1))
    assert len(palette) == 256
    for k, (bg, _) in enumerate(palette):
        got = [int(x) for x in re.fullmatch(r"rgb\((\d+),(\d+),(\d+)\)", bg).groups()]  # type: ignore[union-attr]
        assert np.abs(np.asarray(got) - np.asarray(VIRIDIS(k / 255)[:3]) * 255).max() <= 6, k
