"""Pictures of a run: ``--svg``/``--html`` (the terminal view as recorded by rich) and ``--plot``
(the weights as heatmaps with matplotlib, as d2l's ``show_heatmaps`` draws them: queries
down, keys across, a colour bar; one panel per batch entry and head).

matplotlib is optional and imported only here, only when ``--plot`` is given.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from attncli.errors import InputError
from attncli.trace import Trace

PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
PLOT_HINT = "matplotlib is not installed; install it with: pip install 'attncli[plot]' (or pip install matplotlib)"
DPI = 100
PANEL = 3.0  # inches per heatmap panel, each way
BAR = 1.0  # inches added to the width for the colour bar
TOP = 0.5  # inches added to the height for the title
MAX_PANELS = 64  # beyond this many batch/head entries only the first are drawn (the title says so)
MAX_TICKS = 30  # label every query/key up to this many; beyond it matplotlib picks the ticks


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


@dataclass
class Pictures:
    """What ``--svg``, ``--html`` and ``--plot`` asked for; the file names are checked on creation."""

    svg: Path | None = None
    html: Path | None = None
    plot_path: Path | None = None
    saved: bool = False

    def __post_init__(self) -> None:
        for path, ext, opt in ((self.svg, ".svg", "--svg"), (self.html, ".html", "--html")):
            if path is not None and path.suffix.lower() not in (ext, ".htm" if ext == ".html" else ext):
                raise InputError(f"{opt} writes {ext} files; give a file name ending in {ext}", str(path))
        if self.plot_path is not None:
            if self.plot_path.suffix.lower() not in PLOT_FORMATS:
                raise InputError(f"cannot plot to {self.plot_path.suffix or '(no extension)'!r}; use one of "
                                 f"{', '.join(PLOT_FORMATS)}", str(self.plot_path))
            if not have_matplotlib():
                raise InputError(PLOT_HINT, "--plot")

    def check(self, trace: Trace) -> None:
        """Refuse --plot early when the run kept no weights (an output-only run)."""
        if self.plot_path is not None and "weights" not in trace:
            raise InputError("this run kept no weights to plot (an output-only run, e.g. --steps output); "
                             "include weights in --steps", "--plot")

    @property
    def wanted(self) -> bool:
        """Whether the terminal view must be recorded (for --svg or --html)."""
        return self.svg is not None or self.html is not None

    def save(self, console: Any, protect: Iterable[str] = ()) -> None:
        """Write what ``console`` recorded as SVG and/or HTML, atomically."""
        from attncli.io import atomic_write

        if self.svg is not None:
            with atomic_write(self.svg, protect=protect) as f:
                f.write(console.export_svg(title="attncli", clear=False).encode())
        if self.html is not None:
            with atomic_write(self.html, protect=protect) as f:
                f.write(console.export_html(clear=False).encode())
        self.saved = self.wanted

    def plot(self, trace: Trace, protect: Iterable[str] = ()) -> None:
        if self.plot_path is None:
            return
        from attncli.io import atomic_write

        with atomic_write(self.plot_path, protect=protect) as f:
            plot_weights(trace, f, PLOT_FORMATS[self.plot_path.suffix.lower()])


def grid(lead: tuple[int, ...]) -> tuple[int, int, int]:
    """Panels as (rows, cols, count): one matrix 1×1; a batch (or head) axis of b in rows of at most 4;
    batch × heads as rows × columns (as d2l's show_heatmaps); more axes: the last one across. At most
    MAX_PANELS panels are drawn (count), the first ones in row-major order."""
    total = int(np.prod(lead)) if lead else 1
    if len(lead) <= 1:
        cols = min(total, 4)
    else:
        cols = lead[-1]
    count = min(total, MAX_PANELS)
    cols = min(cols, count)
    return math.ceil(count / cols), cols, count


def figure_size(weights_shape: tuple[int, ...]) -> tuple[float, float]:
    """Figure size in inches: PANEL per panel, plus BAR across for the colour bar and TOP for the title."""
    rows, cols, _ = grid(tuple(weights_shape[:-2]))
    return cols * PANEL + BAR, rows * PANEL + TOP


def panel_title(trace: Trace, idx: tuple[int, ...]) -> str:
    names = trace.meta.get("batch_axes")  # e.g. ["batch", "head"] when a command names its leading axes
    if not idx:
        return "weights"
    if isinstance(names, list) and len(names) == len(idx):
        return ", ".join(f"{n} {i}" for n, i in zip(names, idx))
    if len(idx) == 2 and trace.meta.get("heads"):
        return f"batch {idx[0]}, head {idx[1]}"
    return "batch " + ", ".join(map(str, idx))


def plot_weights(trace: Trace, out: IO[bytes], fmt: str = "png") -> None:
    """Draw the weights (..., m, n) as heatmaps into ``out`` in ``fmt`` (png, svg, pdf). Labels are
    text, shown as written: ``$\\frac$`` or ``$x^{$`` is no mathtext to parse (and fail on)."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        _plot_weights(trace, out, fmt)


def _plot_weights(trace: Trace, out: IO[bytes], fmt: str = "png") -> None:
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed (Agg)

    w = np.asarray(trace.weights, dtype=np.float64)
    lead = tuple(w.shape[:-2])
    rows, cols, count = grid(lead)
    entries = list(np.ndindex(*lead)) if lead else [()]
    drawn = entries[:count]
    fig = Figure(figsize=figure_size(w.shape), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    m, n = w.shape[-2:]
    qlab, klab = trace.query_labels, trace.key_labels
    vmax = max(1.0, float(np.nanmax(w))) if w.size else 1.0
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(drawn):
            ax.set_visible(False)
            continue
        idx = drawn[k]
        image = ax.imshow(w[idx], cmap="Reds", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        if lead:
            ax.set_title(panel_title(trace, idx), fontsize=9)
        r, c = divmod(k, cols)
        if r == rows - 1 or k + cols >= len(drawn):
            ax.set_xlabel("keys")
        if c == 0:
            ax.set_ylabel("queries")
        if n <= MAX_TICKS:
            ax.set_xticks(range(n), labels=klab if klab else [str(j) for j in range(n)], rotation=90 if klab else 0,
                          fontsize=8)
        if m <= MAX_TICKS:
            ax.set_yticks(range(m), labels=qlab if qlab else [str(i) for i in range(m)], fontsize=8)
    title = f"attention weights ({trace.meta.get('score', 'attention')})"
    if len(drawn) < len(entries):
        title += f": first {len(drawn)} of {len(entries)} panels"
    fig.suptitle(title, fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="weight")
    fig.savefig(out, format=fmt, dpi=DPI)
