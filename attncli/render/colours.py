"""The one colour map of every view: viridis, in the terminal, the ``--plot`` pictures, the ``--html``
page, the viewer's tiles and the notebook cell.

Why viridis: it is perceptually uniform (equal steps of weight look like equal steps of colour),
readable by the colour-blind and in greyscale, bright where attention is strong on a dark
terminal and on a white page alike, and matplotlib's default, so a user's own plots look the same.
Masked cells are grey (#b0b0b0), a colour viridis never takes.

matplotlib is optional, so the map is kept here as 17 stops of matplotlib's table (at 0, 1/16, ...,
1; tests/test_colours.py checks them against matplotlib) and interpolated linearly between them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

CMAP = "viridis"  # the matplotlib name (for --plot)
MASKED_RGB = (176, 176, 176)  # #b0b0b0
STOPS = ((68, 1, 84), (72, 24, 106), (71, 45, 123), (66, 64, 134), (59, 82, 139), (51, 99, 141), (44, 114, 142),
         (38, 130, 142), (33, 145, 140), (31, 160, 136), (40, 174, 128), (63, 188, 115), (94, 201, 98),
         (132, 212, 75), (173, 220, 48), (216, 226, 25), (253, 231, 37))


def rgb(t: float) -> tuple[int, int, int]:
    """The colour of ``t`` in [0, 1] (clipped)."""
    x = min(max(t, 0.0), 1.0) * (len(STOPS) - 1)
    i = min(int(x), len(STOPS) - 2)
    f = x - i
    r, g, b = (round(c0 + (c1 - c0) * f) for c0, c1 in zip(STOPS[i], STOPS[i + 1]))
    return r, g, b


def table(size: int = 256) -> np.ndarray:
    """The map as a (size, 3) uint8 table: entry k is the colour of k / (size - 1)."""
    import numpy as np

    return np.array([rgb(k / (size - 1)) for k in range(size)], dtype=np.uint8)


def luminance(r: int, g: int, b: int) -> float:
    """WCAG 2's relative luminance of an sRGB colour (0: black, 1: white)."""
    def lin(c: int) -> float:
        x = c / 255
        return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    """WCAG 2's contrast ratio of two colours, 1 to 21 (4.5 is its minimum for text)."""
    la, lb = sorted((luminance(*a), luminance(*b)))
    return (lb + 0.05) / (la + 0.05)


WHITE, BLACK = (255, 255, 255), (0, 0, 0)


def dark(r: int, g: int, b: int) -> bool:
    """Whether text on this background should be white: white contrasts more with it than black does
    (the better of the two is at least 4.58:1 for every colour)."""
    return contrast((r, g, b), WHITE) >= contrast((r, g, b), BLACK)


def text_on(r: int, g: int, b: int) -> tuple[int, int, int]:
    """The text colour for a cell of this background: white or black, whichever contrasts more. An exact
    colour, never a terminal's named one (a theme maps "white" to its own grey)."""
    return WHITE if dark(r, g, b) else BLACK


def palette_js(size: int = 256) -> str:
    """The map as a JavaScript array of [background, text] CSS colours, entry k for k / (size - 1): what
    the pages colour their cells with (the text colour chosen here, by contrast)."""
    out = []
    for k in range(size):
        c = rgb(k / (size - 1))
        fg = "#fff" if dark(*c) else "#000"
        out.append(f'["rgb({c[0]},{c[1]},{c[2]})","{fg}"]')
    return "[" + ",".join(out) + "]"
