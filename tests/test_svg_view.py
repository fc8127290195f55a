"""--svg: the dark theme (the default) is dark and the light one light, each with readable text
(WCAG contrast ratio computed here from the colours the SVG itself declares), no font fetched from
the network, and long lines wrapped to --width instead of cut."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()
NS = "{http://www.w3.org/2000/svg}"


def luminance(hex_colour: str) -> float:
    """WCAG 2 relative luminance of #rrggbb."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def svg(tmp_path: Path, theme: str | None, *args: str) -> str:
    out = tmp_path / f"view_{theme}.svg"
    r = runner.invoke(app, ["examples", "run", "cat_milk_sweet", "-x", "milk,sweet", "--svg", str(out),
                            "--width", "80", *(["--theme", theme] if theme else []), *args])
    assert r.exit_code == 0, r.output
    return out.read_text(encoding="utf-8")


@pytest.mark.parametrize("theme", [None, "dark", "light"])
def test_background_and_text_contrast(tmp_path: Path, theme: str | None) -> None:
    text = svg(tmp_path, theme)
    root = ET.fromstring(text)  # well-formed XML
    background = next(r.get("fill") for r in root.iter(f"{NS}rect") if r.get("rx"))  # the terminal window
    assert background is not None and re.fullmatch(r"#[0-9a-f]{6}", background)
    if theme == "light":
        assert luminance(background) > 0.9
    else:
        assert luminance(background) < 0.05  # dark means dark
    style = "".join(s.text or "" for s in root.iter(f"{NS}style"))
    fills = set(re.findall(r"fill: (#[0-9a-f]{6})", style))
    readable = [f for f in fills if contrast(f, background) > 1.5]  # text colours (not the window's own fill)
    assert readable and min(contrast(f, background) for f in readable) >= 4.5
    plain = re.search(r"-r2 \{ fill: (#[0-9a-f]{6}) \}", style)
    assert plain is not None and contrast(plain.group(1), background) >= 7  # the body text


def test_no_network_font(tmp_path: Path) -> None:
    text = svg(tmp_path, None)
    assert "@font-face" not in text and "https://" not in text.replace("https://www.textualize.io", "")
    assert "monospace" in text


def test_long_lines_wrap_instead_of_being_cut(tmp_path: Path) -> None:
    """The explanation's last number (softmax(4, 5, 4, 6)[3] = 0.6103, the README's headline line) is in the picture."""
    import math

    w = math.exp(6) / (2 * math.exp(4) + math.exp(5) + math.exp(6))
    text = svg(tmp_path, None)
    cells = re.sub(r"<[^>]+>", "", text).replace("&#160;", " ")
    assert f"= {w:.4f}" in cells


def test_table_borders_meet_between_rows(tmp_path: Path) -> None:
    """A box-drawing glyph of a monospace font is about 1.17 em tall (DejaVu Sans Mono: ascent 0.928 +
    descent 0.236): at the matrix's font size it must reach from one row of text to the next, or the
    table's vertical borders show gaps between rows (as they did at rich's 20 px on 24.4 px lines)."""
    root = ET.fromstring(svg(tmp_path, None))
    style = "".join(s.text or "" for s in root.iter(f"{NS}style"))
    size = float(re.search(r"-matrix \{[^}]*font-size: ([0-9.]+)px", style).group(1))  # type: ignore[union-attr]
    rows = sorted({float(t.get("y", "nan")) for t in root.iter(f"{NS}text") if "│" in "".join(t.itertext())})
    spacing = min(b - a for a, b in zip(rows, rows[1:]))
    assert size * (0.928 + 0.236) >= spacing, (size, spacing)
