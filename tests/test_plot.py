"""--plot: matplotlib heatmaps of the weights (PNG/SVG/PDF), one panel per batch entry / head.

Pixel sizes follow the documented rule in attncli/render/plot.py: 3 inches per panel each way,
+1 inch across for the colour bar, +0.5 inch down for the title, at 100 dpi.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "attncli" / "examples"
runner = CliRunner()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_of_one_matrix(tmp_path: Path) -> None:
    out = tmp_path / "w.png"
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--quiet", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert png_size(out) == (400, 350)  # (3 + 1) x (3 + 0.5) inches at 100 dpi


def test_png_grid_of_batch_by_heads(tmp_path: Path) -> None:
    # weights (2, 5, 6, 6): 10 panels in a near-square grid, ceil(sqrt(10)) = 4 across, 3 rows
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).standard_normal((2, 5, 6, 3)))
    out = tmp_path / "w.png"
    r = runner.invoke(app, ["run", str(x), "-q", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert png_size(out) == (4 * 300 + 100, 3 * 300 + 50)


def test_multihead_example_plots_every_head(tmp_path: Path) -> None:
    out = tmp_path / "heads.png"
    r = runner.invoke(app, ["examples", "run", "multihead_cat_milk", "-q", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert png_size(out) == (2 * 300 + 100, 350)  # 2 heads side by side


def test_svg_and_pdf(tmp_path: Path) -> None:
    svg, pdf = tmp_path / "w.svg", tmp_path / "w.pdf"
    for out in (svg, pdf):
        r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "-q", "--plot", str(out)])
        assert r.exit_code == 0, r.output
    text = svg.read_text()
    # matplotlib writes SVG sizes in points: 4 x 3.5 inches = 288 x 252 pt
    assert re.search(r'width="288(\.0+)?pt"', text) and re.search(r'height="252(\.0+)?pt"', text)
    # every word is drawn twice, as a key and as a query tick (matplotlib's SVG puts each text's string in a comment
    # before its glyphs), and the title names the step
    assert all(text.count(f"<!-- {w} -->") == 2 for w in ("cat", "milk", "it", "sweet")), re.findall("<!-- .* -->", text)
    assert "<!-- attention weights" in text
    assert pdf.read_bytes().startswith(b"%PDF")


def test_bad_plot_extension_exit_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--plot", str(tmp_path / "w.gif")])
    assert r.exit_code == 2 and "use one of .png, .svg, .pdf" in r.output
    assert not (tmp_path / "w.gif").exists()


def test_without_matplotlib_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attncli.render.plot as plot  # Pictures asks attncli.render.plot whether matplotlib is there

    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    r = runner.invoke(app, ["run", str(EXAMPLES / "cat_milk_sweet.yaml"), "--plot", str(tmp_path / "w.png")])
    assert r.exit_code == 2 and "pip install 'attncli[plot]'" in r.output
    assert len(r.output.strip().splitlines()) == 1  # nothing printed before the error
