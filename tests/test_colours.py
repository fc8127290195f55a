"""One colour map for every view: the terminal, --plot, --html and the viewer all use viridis.
Reference: matplotlib's own viridis table."""

from __future__ import annotations

import re
from pathlib import Path

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
    js = re.search(r"const STOPS = (\[\[.*?\]\]);", Path(page.__file__).read_text(), re.S)
    assert js is not None and [list(s) for s in colours.STOPS] == eval(js.group(1))  # noqa: S307
