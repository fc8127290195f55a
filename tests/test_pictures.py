"""--plot on the pixels: the colour scale spans the data, masked cells are not the colour of 0,
labels are drawn literally, and --dpi/--figsize/--plot-steps/--vmin/--vmax do what they say.

The colour map is matplotlib's own "viridis" (every view's, attncli.render.colours): a pixel's place
on the map is found by looking its colour up in matplotlib's table, not in ours.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

pytest.importorskip("matplotlib")
from matplotlib import colormaps  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib depends on Pillow)

EXAMPLES = Path(__file__).resolve().parent.parent / "attncli" / "examples"
runner = CliRunner()
MAP = (np.asarray(colormaps["viridis"](np.linspace(0, 1, 256)))[:, :3] * 255).astype(np.int16)  # (256, 3)


def pixels(path: Path, left: float = 1.0) -> np.ndarray:
    """The image's pixels (n, 3); ``left`` < 1: only that fraction of its columns from the left (the
    panel, without the colour bar on the right)."""
    a = np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)  # (h, w, 3)
    return a[:, :int(a.shape[1] * left)].reshape(-1, 3)


def map_positions(px: np.ndarray) -> np.ndarray:
    """Indices (0..255) into viridis of the pixels that are a colour of the map (within 2 per channel),
    pure white (the figure's background) left out."""
    px = np.unique(px[(px != 255).any(axis=1)], axis=0)
    d = np.abs(px[:, None, :] - MAP[None, :, :]).max(axis=-1)  # (colours, 256)
    near = d.min(axis=1) <= 2
    return d[near].argmin(axis=1)


def plot(args: list[str], out: Path) -> Path:
    r = runner.invoke(app, [*args, "-q", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_nadaraya_watson_uses_most_of_the_colour_map(tmp_path: Path) -> None:
    # its weights are all <= 0.09: a fixed 0..1 scale would use only the first tenth of the map
    out = plot(["examples", "run", "nadaraya_watson"], tmp_path / "nw.png")
    pos = map_positions(pixels(out, left=0.6))  # the heatmap itself (3 of the figure's 4 inches), not the bar
    assert pos.min() <= 10 and pos.max() >= 245, (pos.min(), pos.max())
    assert len(np.unique(pos)) > 100  # a gradient, not a few colours


def test_vmin_vmax_fix_the_scale(tmp_path: Path) -> None:
    out = plot(["examples", "run", "nadaraya_watson", "--vmin", "0", "--vmax", "1"], tmp_path / "nw01.png")
    pos = map_positions(pixels(out, left=0.6))
    w = np.asarray(json.loads(runner.invoke(app, ["examples", "run", "nadaraya_watson", "-f", "json"]).stdout)["weights"])
    # on a 0..1 scale the largest weight (< 0.1) sits at 255 * max(w) on the map: the panel stays pale
    assert w.max() < 0.1 and pos.max() <= 255 * w.max() + 3


GREY = np.array([176, 176, 176])  # the masked cells' face colour, #b0b0b0


def grey_pixels(path: Path) -> int:
    return int((np.abs(pixels(path) - GREY).max(axis=1) <= 3).sum())


def test_masked_cells_differ_from_zero_weights(tmp_path: Path) -> None:
    # two runs with weight exactly 0 at key k2 of every query: masked (valid length 2) and not masked
    # (its score is 1000 below the others, so exp underflows to 0 in float64)
    q = tmp_path / "q.json"
    q.write_text(json.dumps([[1.0, 0.0], [0.0, 1.0]]))
    masked = tmp_path / "k_masked.json"
    masked.write_text(json.dumps([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
    far = tmp_path / "k_far.json"
    far.write_text(json.dumps([[1.0, 0.0], [0.0, 1.0], [-1000.0, -1000.0]]))
    a = plot(["run", str(q), str(masked), "--score", "dot", "--valid-lens", "2"], tmp_path / "a.png")
    b = plot(["run", str(q), str(far), "--score", "dot"], tmp_path / "b.png")
    wb = np.asarray(json.loads(runner.invoke(app, ["run", str(q), str(far), "--score", "dot", "-f", "json"]).stdout)["weights"])
    assert (wb[:, 2] == 0).all()  # really a zero weight, not masked
    # two masked cells of the 3-inch panel: thousands of grey pixels; without a mask only the
    # anti-aliased edges of some letters come near that grey
    assert grey_pixels(a) > 5000 and grey_pixels(b) < 200, (grey_pixels(a), grey_pixels(b))


def glyphs(svg: str, text: str) -> list[list[str]]:
    """The glyphs matplotlib's SVG draws for each text element ``text`` (each follows a ``<!-- text -->``
    comment; its glyphs are ``<use xlink:href="#FONT-GLYPH">``), in drawing order."""
    out = []
    for m in re.finditer(re.escape(f"<!-- {text} -->"), svg):
        end = svg.find("<!--", m.end())
        out.append(re.findall(r'xlink:href="#(DejaVu[^"]+)"', svg[m.end():end if end >= 0 else None]))  # not tick marks
    return out


@pytest.mark.parametrize("labels", [r"$\frac,b,c", "$x^{$,b,c", "$$,b,c", r"a_1,\alpha,{"])
def test_labels_are_drawn_literally(tmp_path: Path, labels: str) -> None:
    # every tick label of the SVG is drawn with the glyphs matplotlib itself draws for the label's characters as
    # plain text (parse_math=False): one glyph per character, the dollars and backslashes included (mathtext
    # would drop the dollars, set the rest in italics, or fail on "$\frac")
    from matplotlib.figure import Figure

    x = tmp_path / "x.json"
    x.write_text(json.dumps([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    svg = plot(["run", str(x), "--labels", labels], tmp_path / "l.svg").read_text()
    for label in labels.split(","):
        ref = Figure()
        ref.text(0.5, 0.5, label, parse_math=False)
        ref.savefig(tmp_path / "ref.svg")
        want = glyphs((tmp_path / "ref.svg").read_text(), label)[0]
        assert len(want) == len(label.replace(" ", ""))
        drawn = glyphs(svg, label)
        assert len(drawn) == 2 and all(g == want for g in drawn), (label, drawn, want)  # a key and a query tick


def test_dpi_and_figsize_give_the_pixel_size(tmp_path: Path) -> None:
    out = plot(["examples", "run", "cat_milk_sweet", "--figsize", "5,4", "--dpi", "50"], tmp_path / "s.png")
    assert Image.open(out).size == (250, 200)  # 5 x 4 inches at 50 dots per inch


def test_plot_steps_stacks_one_row_per_step(tmp_path: Path) -> None:
    out = plot(["examples", "run", "d2l_masked_softmax", "--plot-steps", "scores,weights"], tmp_path / "two.png")
    assert Image.open(out).size == (2 * 300 + 100, 2 * 350)  # 2 panels across; 2 steps of 3.5 inches down


@pytest.mark.parametrize("args, needle", [
    (["--plot-steps", "nope"], "cannot draw step(s) nope"),
    (["--vmin", "1", "--vmax", "0"], "--vmin 1 must be below --vmax 0"),
    (["--figsize", "big"], "is not WIDTH,HEIGHT"),
])
def test_bad_picture_options_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "w.png"
    r = runner.invoke(app, ["examples", "run", "cat_milk_sweet", "--plot", str(out), *args])
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not out.exists()


def test_svg_has_a_fixed_width_and_a_light_theme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = []
    for columns in ("60", "200"):  # the terminal's width does not matter
        monkeypatch.setenv("COLUMNS", columns)
        out = tmp_path / f"v{columns}.svg"
        r = runner.invoke(app, ["examples", "run", "cat_milk_sweet", "--svg", str(out), "--width", "90",
                                "--theme", "light"])
        assert r.exit_code == 0, r.output
        text = out.read_text()
        sizes.append(text.split('viewBox="', 1)[1].split('"', 1)[0])
        assert "#ffffff" in text.lower()  # the light theme's background
    assert sizes[0] == sizes[1]
