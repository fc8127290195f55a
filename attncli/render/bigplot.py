"""``--plot`` of maps larger than their panels, drawn from blocks of queries: attncli.render.viewer's Layer
sweeps the rows a block at a time and keeps each step's largest value per pixel (what attncli.render.plot's
downsampling shows), so no step's every weight is ever held; attncli.render.plot draws the figure.
"""

from __future__ import annotations

import math
from typing import IO, Any

import numpy as np

from attncli.errors import InputError
from attncli.render.plot import PlotOptions, StepPanels, draw, figure_size, grid, panel_pixels, range_of
from attncli.render.viewer import Layer


def plot_problem(problem: Any, out: IO[bytes], fmt: str, opts: PlotOptions) -> list[tuple[int, int, int, int]] | None:
    """--plot of a problem whose maps are larger than their panels, drawn from blocks of queries (never every
    weight at once: attncli.render.viewer.Layer keeps each step's maximum per pixel); None (nothing drawn)
    when the maps fit their panels (plot_steps draws them from the trace, cell by cell)."""
    layer = Layer(problem, "plot")  # its shape first: the steps' leading axes, m and n
    lead = layer.lead
    _, cols, count = grid(lead)
    size = opts.figsize or figure_size(lead + (layer.m, layer.n), len(opts.steps))
    px = panel_pixels(size, cols, opts.dpi)
    if layer.m <= px and layer.n <= px:
        return None
    bad = [s for s in opts.steps if s not in layer.steps]
    if bad:
        raise InputError(f"cannot draw step(s) {', '.join(bad)}; this run's query × key steps are "
                         f"{', '.join(map(str, layer.steps))}", "--plot-steps")
    layer.resize(px)
    layer.sweep_all([layer.weights_step if s == "weights" else s for s in opts.steps])
    if layer.failed:
        raise RuntimeError(layer.failed)
    entries = list(np.ndindex(*lead)) if lead else [()]
    panels = []
    for name in opts.steps:
        ov = layer.overviews[layer.weights_step if name == "weights" else name]
        lo, hi = (ov.lo, ov.hi) if math.isfinite(ov.lo) else (0.0, 1.0)
        lo, hi = range_of(lo, hi, opts)
        panels.append(StepPanels([ov.values[e] for e in entries[:count]], (ov.fr, ov.fc), lo, hi, ov.masked))
    return draw(layer.p.trace, lead, layer.m, layer.n, panels, out, fmt, opts)
