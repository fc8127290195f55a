"""Text on every coloured cell is readable: WCAG 2 contrast >= 4.5:1 in the terminal's styles (--svg, both
themes), the --html page and the viewer. The contrast is computed here from the colours each output
declares (WCAG 2.x relative luminance, https://www.w3.org/TR/WCAG21/#dfn-contrast-ratio), not from
attncli's own helper.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attncli
from attncli.render import page as page_module
from attncli.render import viewer_page

WCAG_TEXT = 4.5


def luminance(hex_or_rgb: str) -> float:
    s = hex_or_rgb.strip().lower()
    if s.startswith("rgb("):
        r, g, b = (int(x) for x in re.findall(r"\d+", s))
    else:
        s = s.lstrip("#")
        if len(s) == 3:
            s = "".join(c * 2 for c in s)
        r, g, b = int(s[0:2], 16), int(s[2:4], 16), int(s[4:6], 16)

    def lin(c: int) -> float:
        x = c / 255
        return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(a: str, b: str) -> float:
    la, lb = sorted((luminance(a), luminance(b)))
    return (lb + 0.05) / (la + 0.05)


def spread_input(path: Path) -> None:
    """Q = K = V whose weights cover the colour map: rows from uniform to one-hot."""
    n = 12
    x = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        x[i] = np.linspace(0, 0.8 * i, n)
    np.save(path, x)


def svg_cells(text: str) -> list[tuple[str, str]]:
    """(background, text colour) of every text run drawn on a coloured rectangle of rich's SVG export:
    a rectangle at (x, y) lies under the text at (x, y + 18.5) (rich: y·line_height + 1.5 and + char_height)."""
    classes = dict(re.findall(r"\.(terminal-\d+-r\d+) \{ fill: (#[0-9a-fA-F]{6})", text))
    assert classes
    rects = {(float(x), round(float(y), 1)): fill for fill, x, y in
             re.findall(r'<rect fill="(#[0-9a-fA-F]{6})" x="([\d.]+)" y="([\d.]+)" width="[\d.]+" height="[\d.]+"', text)}
    out = []
    for cls, x, y, body in re.findall(r'<text class="(terminal-\d+-r\d+)" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>',
                                      text):
        if not body.replace("&#160;", "").strip():
            continue
        bg = rects.get((float(x), round(float(y) - 18.5, 1)))
        if bg is not None and cls in classes:
            out.append((bg, classes[cls]))
    return out


@pytest.mark.parametrize("theme", ["dark", "light"])
def test_svg_text_on_every_coloured_cell(tmp_path: Path, theme: str) -> None:
    x = tmp_path / "x.npy"
    spread_input(x)
    out = tmp_path / "v.svg"
    r = subprocess.run([sys.executable, "-m", "attncli", "run", str(x), "-q", "--svg", str(out), "--theme", theme],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cells = svg_cells(out.read_text())
    viridis = [(bg, fg) for bg, fg in cells if bg.lower() not in ("#18181b", "#ffffff")]  # the theme's own ground
    assert len({bg for bg, _ in viridis}) >= 20, "the input should colour cells across the map"
    worst = min(viridis, key=lambda c: contrast(*c))
    assert contrast(*worst) >= WCAG_TEXT, worst


def palette(text: str) -> list[tuple[str, str]]:
    m = re.search(r"const PALETTE = (\[\[.*?\]\]);", text, re.S)
    assert m is not None, "the page colours its cells from a palette it embeds"
    return [(bg, fg) for bg, fg in json.loads(m.group(1))]


def test_html_page_palette_every_level() -> None:
    text = page_module.page(attncli.attend(np.eye(4)))
    pairs = palette(text)
    assert len(pairs) == 256
    worst = min(pairs, key=lambda c: contrast(*c))
    assert contrast(*worst) >= WCAG_TEXT, worst
    # the cells are coloured from it (the page's script: one function, the palette's entry)
    assert "PALETTE[Math.round(" in text and "0.299 * c[0]" not in text


def test_viewer_palette_every_level() -> None:
    pairs = palette(viewer_page.page())
    worst = min(pairs, key=lambda c: contrast(*c))
    assert contrast(*worst) >= WCAG_TEXT, worst


@pytest.mark.parametrize("t", np.linspace(0, 1, 101))
def test_terminal_style_every_level(t: float) -> None:
    from attncli.render.terminal import heat_style

    s = heat_style(float(t), False)
    if t == 0:
        return  # a weight of exactly 0: dim text, no colour
    assert s.bgcolor is not None and s.color is not None
    bg, fg = s.bgcolor.get_truecolor(), s.color.get_truecolor()
    assert s.color.is_system_defined is False  # an exact colour: a theme cannot map it to its own grey
    assert contrast("rgb({},{},{})".format(*bg), "rgb({},{},{})".format(*fg)) >= WCAG_TEXT
