"""``--plot``: steps as heatmaps with matplotlib, as d2l's ``show_heatmaps`` draws them: queries
down, keys across, a colour bar; one panel per batch entry and head. (What ``--plot``, ``--html``
and ``--svg`` ask for is gathered in attncli.render.pictures.)

matplotlib is optional and imported only here, only when ``--plot`` is given.

Heatmap rules (each is tested on the pixels):

- the colour scale runs from the smallest to the largest value drawn (masked and non-finite
  cells left out), shared by the panels of one step; ``--vmin/--vmax`` fix either end;
- masked cells (from the trace's ``masked`` step) are grey, never a colour of the map, and the
  legend says so: they are the image's "bad" cells (one layer, whatever the size), never one patch
  per cell;
- panels (batch entries × heads) form a near-square grid with one colour bar per step; a panel's
  title names the batch entry only when there are several;
- a map larger than its panel's pixels is downsampled to them before drawing: each pixel shows the
  largest value of its block of cells (grey only when every cell of the block is masked), and the
  figure's title says so;
- a label is written horizontally when every label fits its cell's width, else turned 90°;
- labels are drawn literally (``parse_math=False``): ``$x^{$`` is text, not mathtext.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from attncli.core.diagnostics import masked_cells
from attncli.core.trace import Trace
from attncli.errors import InputError
from attncli.render import colours

PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
PLOT_HINT = r"matplotlib is not installed; install it with: pip install 'attncli\[plot]' (or pip install matplotlib)"
DPI = 100
PANEL = 3.0  # inches per heatmap panel, each way
BAR = 1.0  # inches added to the width for the colour bar
TOP = 0.5  # inches added to the height for the title
MAX_PANELS = 64  # beyond this many batch/head entries only the first are drawn (the title says so)
MAX_TICKS = 30  # label every query/key up to this many; beyond it matplotlib picks the ticks
CMAP = colours.CMAP  # viridis, as every view (attncli.render.colours says why)
MASKED_COLOUR = "#b0b0b0"  # grey: a colour viridis never takes
TICK_POINTS = 8.0  # tick label font size
CHAR_WIDTH = 0.62  # width of an average character in font sizes (for "does a label fit its cell")
THEMES = ("dark", "light")


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plain_help(text: str) -> str:
    """The hint without rich's escape (for plain-text output)."""
    return text.replace("\\[", "[")


@dataclass
class PlotOptions:
    """How ``--plot`` draws: which steps, the colour scale, the size and resolution."""

    steps: list[str] = field(default_factory=lambda: ["weights"])
    vmin: float | None = None
    vmax: float | None = None
    dpi: int = DPI
    figsize: tuple[float, float] | None = None  # inches (width, height) of the whole figure


def parse_figsize(text: str | None) -> tuple[float, float] | None:
    """'8,6' or '8x6' (inches) as (8.0, 6.0); InputError naming --figsize otherwise."""
    if text is None:
        return None
    parts = text.lower().replace("x", ",").split(",")
    try:
        w, h = (float(p) for p in parts)
    except ValueError:
        raise InputError(f"{text!r} is not WIDTH,HEIGHT in inches, e.g. 8,6", "--figsize") from None
    if not (1 <= w <= 100 and 1 <= h <= 100):  # below an inch the panels have no room: an empty image
        raise InputError(f"{text!r}: width and height must be between 1 and 100 inches", "--figsize")
    return w, h


def grid(lead: tuple[int, ...]) -> tuple[int, int, int]:
    """Panels as (rows, cols, count): every batch entry and head (row-major) in a near-square grid,
    ceil(sqrt(count)) across, as few rows as hold them; at most MAX_PANELS panels are drawn (count),
    the first ones."""
    total = int(np.prod(lead)) if lead else 1
    count = min(total, MAX_PANELS)
    cols = math.ceil(math.sqrt(count))
    return math.ceil(count / cols), cols, count


def panel_inches(cols: int) -> float:
    """Inches per panel: PANEL up to 4 across, then smaller so the figure stays about 12 inches wide
    (never below 1.5)."""
    return PANEL if cols <= 4 else max(1.5, 12.0 / cols)


def figure_size(weights_shape: tuple[int, ...], steps: int = 1) -> tuple[float, float]:
    """Figure size in inches: panel_inches per panel each way, plus BAR across for the colour bar and
    TOP for the title; several steps are stacked."""
    rows, cols, _ = grid(tuple(weights_shape[:-2]))
    p = panel_inches(cols)
    return cols * p + BAR, steps * (rows * p + TOP)


def panel_title(trace: Trace, idx: tuple[int, ...], lead: tuple[int, ...] | None = None) -> str:
    """'head 1', 'batch 0, head 1', 'batch 2': what a panel shows. An axis of one entry (``lead``:
    the sizes of the leading axes) is left out: 'batch 0' only when there are several batch entries."""
    names = trace.meta.batch_axes  # e.g. ["batch", "head"] when a command names its leading axes
    if not idx:
        return ""
    if not (isinstance(names, list) and len(names) == len(idx)):
        names = ["batch", "head"] if len(idx) == 2 and trace.meta.heads else ["batch"] * len(idx)
    keep = [k for k in range(len(idx)) if lead is None or lead[k] > 1] or ([] if lead else list(range(len(idx))))
    parts = [(str(names[k]), idx[k]) for k in keep]
    if parts and all(n == "batch" for n, _ in parts):
        return "batch " + ", ".join(str(i) for _, i in parts)
    return ", ".join(f"{n} {i}" for n, i in parts)


def downsample(a: np.ndarray, hidden: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, int, int]:
    """``a`` (m, n) shrunk to at most (rows, cols): each output cell the largest finite, unmasked value
    of its block of cells (NaN when the block has none), and the block's size (fr, fc). Unchanged
    (as floats, hidden cells NaN) when it already fits."""
    m, n = a.shape
    fr, fc = max(1, math.ceil(m / max(rows, 1))), max(1, math.ceil(n / max(cols, 1)))
    shown = np.where(hidden | ~np.isfinite(a), np.nan, a)
    if fr == 1 and fc == 1:
        return shown, 1, 1
    pad = np.full((math.ceil(m / fr) * fr, math.ceil(n / fc) * fc), -np.inf)
    pad[:m, :n] = np.where(np.isnan(shown), -np.inf, shown)
    big = pad.reshape(pad.shape[0] // fr, fr, pad.shape[1] // fc, fc).max(axis=(1, 3))
    return np.where(np.isneginf(big), np.nan, big), fr, fc


def labels_fit(labels: Sequence[str], panel_inches: float) -> bool:
    """Whether every label, written horizontally in TICK_POINTS type, fits its cell of the panel's width."""
    if not labels:
        return True
    cell = panel_inches / len(labels) * 72  # points
    return max(len(s) for s in labels) * TICK_POINTS * CHAR_WIDTH <= cell * 0.95


def colour_range(a: np.ndarray, hidden: np.ndarray, opts: PlotOptions) -> tuple[float, float]:
    """The colour scale of one step: its smallest and largest drawn value unless fixed by --vmin/--vmax."""
    drawn = a[~hidden & np.isfinite(a)]
    lo = float(np.min(drawn)) if drawn.size else 0.0
    hi = float(np.max(drawn)) if drawn.size else 1.0
    return range_of(lo, hi, opts)


def range_of(lo: float, hi: float, opts: PlotOptions) -> tuple[float, float]:
    """The colour scale from the smallest and largest drawn values, --vmin/--vmax fixing either end."""
    lo = opts.vmin if opts.vmin is not None else lo
    hi = opts.vmax if opts.vmax is not None else hi
    if opts.vmax is None and hi <= lo:
        hi = lo + 1.0 if opts.vmin is not None or lo == hi else hi
    if opts.vmin is None and hi <= lo:
        lo = hi - 1.0
    if (opts.vmin is not None or opts.vmax is not None) and not (math.isfinite(hi - lo) and hi > lo):
        # 1e308 + 1 rounds to 1e308, and 1e308 - (-1e308) overflows: no colour bar can be drawn between them
        which = "--vmin" if opts.vmin is not None else "--vmax"
        raise InputError(f"the colour scale from {lo:g} to {hi:g} has no width a picture can draw (its ends are "
                         "too far apart or too large); give --vmin and --vmax a narrower finite range", which)
    return lo, hi


def fit_title(text: str, inches: float, points: float) -> str:
    """``text`` wrapped at word boundaries to the figure's width (a centred title wider than the figure is
    cut at both edges)."""
    import textwrap

    width = max(20, int(inches * 72 * 0.95 / (points * CHAR_WIDTH)))
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in text.split("\n"))


STEP_LABELS = {"weights": "attention weight", "scores": "score", "scaled": "scaled score",
               "masked": "masked score"}


@dataclass
class StepPanels:
    """One step as drawn: per drawn entry its cells (NaN: masked or not finite), already shrunk to the
    panel's pixels, and the block (fr, fc) each pixel stands for; the colour range; whether any cell is masked."""

    cells: list[np.ndarray]
    block: tuple[int, int]
    lo: float
    hi: float
    masked: bool


def plot_steps(trace: Trace, out: IO[bytes], fmt: str, opts: PlotOptions) -> list[tuple[int, int, int, int]]:
    """Draw ``opts.steps`` (each (..., m, n)) as heatmaps into ``out`` in ``fmt`` (png, svg, pdf):
    per step a near-square grid of panels (batch entries × heads) and one colour bar. Returns each
    drawn panel's image area in the picture's pixels, (left, top, right, bottom), in drawing order."""
    w = np.asarray(trace.weights)
    lead = tuple(w.shape[:-2])
    _, cols, count = grid(lead)
    entries = list(np.ndindex(*lead)) if lead else [()]
    size = opts.figsize or figure_size(w.shape, len(opts.steps))
    px = panel_pixels(size, cols, opts.dpi)
    masked = masked_cells(trace)
    hidden = masked if masked is not None else np.zeros(w.shape, dtype=bool)
    panels = []
    for name in opts.steps:
        a = np.broadcast_to(np.asarray(trace[name], dtype=np.float64), w.shape)
        lo, hi = colour_range(a, hidden, opts)
        cells, block, any_masked = [], (1, 1), False
        for idx in entries[:count]:
            c, fr, fc = downsample(a[idx], hidden[idx], px, px)
            cells.append(c)
            block = max(block, (fr, fc))
            any_masked = any_masked or bool(hidden[idx].any())
        panels.append(StepPanels(cells, block, lo, hi, any_masked))
    return draw(trace, lead, w.shape[-2], w.shape[-1], panels, out, fmt, opts)


def panel_pixels(size: tuple[float, float], cols: int, dpi: int) -> int:
    """The most pixels a panel's image can show each way."""
    return max(8, int((size[0] - BAR) / cols * dpi))


def draw(trace: Trace, lead: tuple[int, ...], m: int, n: int, panels: list[StepPanels], out: IO[bytes], fmt: str,
         opts: PlotOptions) -> list[tuple[int, int, int, int]]:
    """The figure of ``panels`` (one per step of opts.steps), saved to ``out``; each panel's image area."""
    import matplotlib as mpl
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed (Agg)
    from matplotlib.patches import Patch

    rows, cols, count = grid(lead)
    entries = list(np.ndindex(*lead)) if lead else [()]
    drawn = entries[:count]
    size = opts.figsize or figure_size(lead + (m, n), len(opts.steps))
    fig = Figure(figsize=size, dpi=opts.dpi, layout="constrained", facecolor="white")
    subs = fig.subfigures(len(opts.steps), 1, squeeze=False)[:, 0] if len(opts.steps) > 1 else [fig]
    qlab, klab = trace.query_labels or [str(i) for i in range(m)], trace.key_labels or [str(j) for j in range(n)]
    panel_width = (size[0] - BAR) / cols
    fit = labels_fit(klab, panel_width)
    cmap = mpl.colormaps[CMAP].with_extremes(bad=MASKED_COLOUR)
    areas: list[Any] = []
    any_masked = any(p.masked for p in panels)
    for name, sub, step in zip(opts.steps, subs, panels):
        axes = sub.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
        image = None
        for k, ax in enumerate(axes.flat):
            if k >= len(drawn):
                ax.set_visible(False)
                continue
            idx = drawn[k]
            # one image: masked and non-finite cells are its "bad" cells (grey), whatever their number
            image = ax.imshow(np.ma.masked_invalid(step.cells[k]), cmap=cmap, vmin=step.lo, vmax=step.hi, aspect="auto",
                              interpolation="nearest", extent=(-0.5, n - 0.5, m - 0.5, -0.5))
            areas.append(ax)
            title = panel_title(trace, idx, lead)
            if title:
                ax.set_title(title, fontsize=9, parse_math=False)
            r, c = divmod(k, cols)
            if r == rows - 1 or k + cols >= len(drawn):
                ax.set_xlabel("keys", parse_math=False)
            if c == 0:
                ax.set_ylabel("queries", parse_math=False)
            if n <= MAX_TICKS:
                ax.set_xticks(range(n), labels=klab, rotation=0 if fit else 90, fontsize=TICK_POINTS, parse_math=False)
            if m <= MAX_TICKS:
                ax.set_yticks(range(m), labels=qlab, fontsize=TICK_POINTS, parse_math=False)
        head = f"{STEP_LABELS.get(name, name)}s" if name != "weights" else "attention weights"
        sub_title = f"{head} ({trace.meta.score or 'attention'})"
        if len(drawn) < len(entries):
            sub_title += f": first {len(drawn)} of {len(entries)} panels"
        if step.block != (1, 1):
            sub_title += (f"\n{m}×{n} cells downsampled to the picture's pixels: each pixel shows the largest value "
                          f"of {step.block[0]}×{step.block[1]} cells")
        sub.suptitle(fit_title(sub_title, size[0], 10), fontsize=10, parse_math=False)
        if image is not None:
            bar = sub.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
            bar.set_label(STEP_LABELS.get(name, name), parse_math=False)
    if any_masked:
        fig.legend(handles=[Patch(facecolor=MASKED_COLOUR, edgecolor="#606060", label="masked key")],
                   loc="outside lower right", fontsize=8, frameon=False)
    fig.savefig(out, format=fmt, dpi=opts.dpi, facecolor="white")
    height = fig.bbox.height
    boxes = []
    for ax in areas:  # after drawing: where constrained layout put each image, in the picture's pixels
        b = ax.get_window_extent()
        boxes.append((round(b.x0), round(height - b.y1), round(b.x1), round(height - b.y0)))
    return boxes
