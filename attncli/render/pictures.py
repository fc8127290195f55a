"""What ``--plot``, ``--html`` and ``--svg`` ask for, checked before anything is printed, and
written at the end: ``--plot`` (attncli.render.plot), ``--html`` (the interactive page,
attncli.render.page) and ``--svg`` (the terminal view as a picture, at a fixed ``--width``, in
the dark or light ``--theme``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attncli.core.trace import KEYS, QUERIES, Trace
from attncli.errors import InputError
from attncli.render import plot as heatmaps
from attncli.render.plot import PLOT_FORMATS, PLOT_HINT, THEMES, PlotOptions, plain_help


@dataclass
class Pictures:
    """What ``--svg``, ``--html`` and ``--plot`` asked for; the file names are checked on creation."""

    svg: Path | None = None
    html: Path | None = None
    plot_path: Path | None = None
    plot: PlotOptions = field(default_factory=PlotOptions)
    theme: str = "dark"  # of --svg
    width: int = 100  # columns of the --svg view

    def __post_init__(self) -> None:
        for path, exts, opt in ((self.svg, (".svg",), "--svg"), (self.html, (".html", ".htm"), "--html")):
            if path is not None and path.suffix.lower() not in exts:
                raise InputError(f"{opt} writes {exts[0]} files; give a file name ending in {exts[0]}", str(path))
        if self.theme not in THEMES:
            raise InputError(f"unknown theme {self.theme!r}; use one of {', '.join(THEMES)}", "--theme")
        if self.plot_path is not None:
            if self.plot_path.suffix.lower() not in PLOT_FORMATS:
                raise InputError(f"cannot plot to {self.plot_path.suffix or '(no extension)'!r}; use one of "
                                 f"{', '.join(PLOT_FORMATS)}", str(self.plot_path))
            if not heatmaps.have_matplotlib():
                raise InputError(plain_help(PLOT_HINT), "--plot")
        p = self.plot
        if p.vmin is not None and p.vmax is not None and not p.vmin < p.vmax:
            raise InputError(f"--vmin {p.vmin:g} must be below --vmax {p.vmax:g}", "--vmin")

    def check(self, trace: Trace) -> None:
        """Refuse --plot/--html early when the run kept no weights (an output-only run), or a step is unknown."""
        for path, opt in ((self.plot_path, "--plot"), (self.html, "--html")):
            if path is not None and "weights" not in trace:
                raise InputError("this run kept no weights to draw (an output-only run, e.g. --steps output); "
                                 "include weights in --steps", opt)
        if self.plot_path is not None:
            drawable = [s.name for s in trace.steps if s.axes == (QUERIES, KEYS)]
            bad = [s for s in self.plot.steps if s not in drawable]
            if bad:
                raise InputError(f"cannot draw step(s) {', '.join(bad)}; this run's query × key steps are "
                                 f"{', '.join(drawable)}", "--plot-steps")

    @property
    def wanted(self) -> bool:
        """Whether any picture is asked for."""
        return self.svg is not None or self.html is not None or self.plot_path is not None

    def write(self, trace: Trace, render: Any, protect: Iterable[str] = ()) -> None:
        """Write every picture asked for, atomically; ``render(console)`` prints the terminal view (for --svg)."""
        from attncli.io.files import atomic_write

        if self.svg is not None:
            with atomic_write(self.svg, protect=protect) as f:
                f.write(svg_view(render, self.width, self.theme).encode())
        if self.html is not None:
            from attncli.render.bigpage import big_page, too_big
            from attncli.render.page import page

            text = big_page(trace) if too_big(trace) else page(trace)  # beyond a page of tables: heatmaps
            with atomic_write(self.html, protect=protect) as f:
                f.write(text.encode())
        if self.plot_path is not None:
            with atomic_write(self.plot_path, protect=protect) as f:
                heatmaps.plot_steps(trace, f, PLOT_FORMATS[self.plot_path.suffix.lower()], self.plot)


MONOSPACE = "ui-monospace, 'DejaVu Sans Mono', Menlo, Consolas, 'Liberation Mono', monospace"  # local fonts only


def svg_template() -> str:
    """rich's SVG template without its web fonts: no @font-face fetched from a CDN, a local monospace stack."""
    import re

    from rich._export_format import CONSOLE_SVG_FORMAT

    fmt = re.sub(r"\s*@font-face \{\{.*?\}\}", "", CONSOLE_SVG_FORMAT, flags=re.S)
    # The rows of a table's borders meet: rich sets 20 px text on 24.4 px lines, and a monospace box-drawing
    # glyph is about 1.17 em tall, so 20 px leaves a gap between rows; at 21.4 px it reaches the next line
    # (each text run keeps its width: rich gives it a textLength).
    fmt = fmt.replace("font-size: {char_height}px;", "font-size: 21.4px;", 1)
    return fmt.replace("font-family: Fira Code, monospace;", f"font-family: {MONOSPACE};").replace(
        "font-family: arial;", "font-family: sans-serif;")


def svg_themes() -> dict[str, Any]:
    """The --svg themes: a dark one (light text on near-black, as a terminal) and a light one."""
    from rich.terminal_theme import TerminalTheme

    dark = TerminalTheme((24, 24, 27), (225, 225, 225), [
        (24, 24, 27), (240, 90, 90), (110, 205, 110), (225, 190, 80), (110, 160, 245), (210, 120, 210),
        (90, 200, 210), (200, 200, 200)], [(140, 140, 140), (255, 120, 120), (140, 230, 140), (245, 215, 110),
                                            (140, 185, 255), (230, 150, 230), (120, 225, 235), (255, 255, 255)])
    light = TerminalTheme((255, 255, 255), (20, 20, 20), [
        (20, 20, 20), (170, 20, 20), (20, 120, 20), (130, 90, 0), (20, 60, 170), (130, 30, 130), (0, 110, 120),
        (90, 90, 90)], [(80, 80, 80), (200, 40, 40), (30, 150, 30), (150, 110, 0), (40, 80, 200), (160, 50, 160),
                        (0, 130, 140), (0, 0, 0)])
    return {"dark": dark, "light": light}


def svg_view(render: Any, width: int, theme: str) -> str:
    """The terminal view, rendered at ``width`` columns, as an SVG picture in the dark or light theme;
    the text is wrapped to ``width`` by the views (never cut), the font is the reader's own monospace."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), record=True, width=width, soft_wrap=False, force_terminal=True,
                      color_system="truecolor", markup=False, emoji=False, legacy_windows=False)
    render(console)
    themes = svg_themes()
    return console.export_svg(title="attncli", theme=themes.get(theme, themes["dark"]), code_format=svg_template())
