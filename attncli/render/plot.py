"""``--plot``: steps as heatmaps with matplotlib, as d2l's ``show_heatmaps`` draws them: queries
down, keys across, a colour bar; one panel per batch entry and head. (What ``--plot``, ``--html``
and ``--svg`` ask for is gathered in attncli.render.pictures.)

matplotlib is optional and imported only here, only when ``--plot`` is given.

Heatmap rules (each is tested on the pixels):

- the colour scale runs from the smallest to the largest value drawn (masked and non-finite
  cells left out), shared by the panels of one step; ``--vmin/--vmax`` fix either end;
- masked cells (from the trace's ``masked`` step) are grey and hatched, never the colour of 0,
  and the legend says so;
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

PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
PLOT_HINT = r"matplotlib is not installed; install it with: pip install 'attncli\[plot]' (or pip install matplotlib)"
DPI = 100
PANEL = 3.0  # inches per heatmap panel, each way
BAR = 1.0  # inches added to the width for the colour bar
TOP = 0.5  # inches added to the height for the title
MAX_PANELS = 64  # beyond this many batch/head entries only the first are drawn (the title says so)
MAX_TICKS = 30  # label every query/key up to this many; beyond it matplotlib picks the ticks
CMAP = "Reds"  # d2l's show_heatmaps colour map
MASKED_COLOUR = "#b0b0b0"  # grey, hatched: outside the colour map (Reds runs white -> dark red)
MASKED_HATCH = "////"
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
    """Panels as (rows, cols, count): one matrix 1×1; a batch (or head) axis of b in rows of at most 4;
    batch × heads as rows × columns (as d2l's show_heatmaps); more axes: the last one across. At most
    MAX_PANELS panels are drawn (count), the first ones in row-major order."""
    total = int(np.prod(lead)) if lead else 1
    cols = min(total, 4) if len(lead) <= 1 else lead[-1]
    count = min(total, MAX_PANELS)
    cols = min(cols, count)
    return math.ceil(count / cols), cols, count


def figure_size(weights_shape: tuple[int, ...], steps: int = 1) -> tuple[float, float]:
    """Figure size in inches: PANEL per panel, plus BAR across for the colour bar and TOP for the title;
    several steps are stacked."""
    rows, cols, _ = grid(tuple(weights_shape[:-2]))
    return cols * PANEL + BAR, steps * (rows * PANEL + TOP)


def panel_title(trace: Trace, idx: tuple[int, ...]) -> str:
    """'head 1', 'batch 0, head 1', 'batch 2': what a panel shows."""
    names = trace.meta.batch_axes  # e.g. ["batch", "head"] when a command names its leading axes
    if not idx:
        return ""
    if isinstance(names, list) and len(names) == len(idx):
        return ", ".join(f"{n} {i}" for n, i in zip(names, idx))
    if len(idx) == 2 and trace.meta.heads:
        return f"batch {idx[0]}, head {idx[1]}"
    return "batch " + ", ".join(map(str, idx))


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
    lo = opts.vmin if opts.vmin is not None else lo
    hi = opts.vmax if opts.vmax is not None else hi
    if opts.vmax is None and hi <= lo:
        hi = lo + 1.0 if opts.vmin is not None or lo == hi else hi
    if opts.vmin is None and hi <= lo:
        lo = hi - 1.0
    return lo, hi


STEP_LABELS = {"weights": "attention weight", "scores": "score", "scaled": "scaled score",
               "masked": "masked score"}


def plot_weights(trace: Trace, out: IO[bytes], fmt: str = "png") -> None:
    """The weights alone, with the default options (kept for callers of the library)."""
    plot_steps(trace, out, fmt, PlotOptions())


def plot_steps(trace: Trace, out: IO[bytes], fmt: str, opts: PlotOptions) -> None:
    """Draw ``opts.steps`` (each (..., m, n)) as heatmaps into ``out`` in ``fmt`` (png, svg, pdf):
    one row of panels per step (heads across, batch entries down), a colour bar per step."""
    import matplotlib as mpl
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed (Agg)
    from matplotlib.patches import Patch

    w = np.asarray(trace.weights)
    lead = tuple(w.shape[:-2])
    rows, cols, count = grid(lead)
    entries = list(np.ndindex(*lead)) if lead else [()]
    drawn = entries[:count]
    size = opts.figsize or figure_size(w.shape, len(opts.steps))
    fig = Figure(figsize=size, dpi=opts.dpi, layout="constrained", facecolor="white")
    subs = fig.subfigures(len(opts.steps), 1, squeeze=False)[:, 0] if len(opts.steps) > 1 else [fig]
    m, n = w.shape[-2:]
    qlab, klab = trace.query_labels or [str(i) for i in range(m)], trace.key_labels or [str(j) for j in range(n)]
    masked = masked_cells(trace)
    any_masked = False
    panel_width = (size[0] - BAR) / cols
    fit = labels_fit(klab, panel_width)
    cmap = mpl.colormaps[CMAP].with_extremes(bad=MASKED_COLOUR)
    for name, sub in zip(opts.steps, subs):
        a = np.broadcast_to(np.asarray(trace[name], dtype=np.float64), w.shape)
        hidden = masked if masked is not None else np.zeros(w.shape, dtype=bool)
        lo, hi = colour_range(a, hidden, opts)
        axes = sub.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
        image = None
        for k, ax in enumerate(axes.flat):
            if k >= len(drawn):
                ax.set_visible(False)
                continue
            idx = drawn[k]
            cells = np.ma.masked_array(a[idx], mask=hidden[idx] | ~np.isfinite(a[idx]))
            image = ax.imshow(cells, cmap=cmap, vmin=lo, vmax=hi, aspect="auto", interpolation="nearest")
            for i, j in np.argwhere(np.ma.getmaskarray(cells)):
                any_masked = True
                ax.add_patch(_masked_patch(j, i))
            title = panel_title(trace, idx)
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
        sub.suptitle(sub_title, fontsize=10, parse_math=False)
        if image is not None:
            bar = sub.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
            bar.set_label(STEP_LABELS.get(name, name), parse_math=False)
    if any_masked:
        fig.legend(handles=[Patch(facecolor=MASKED_COLOUR, hatch=MASKED_HATCH, edgecolor="#606060",
                                  label="masked key")], loc="outside lower right", fontsize=8,
                   frameon=False)
    fig.savefig(out, format=fmt, dpi=opts.dpi, facecolor="white")


def _masked_patch(j: int, i: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="none", edgecolor="#606060", hatch=MASKED_HATCH,
                     linewidth=0)
