"""--html beyond a page of tables, and a Trace in a notebook (``_repr_html_``).

References: the weights computed here in float64 (a plain causal softmax), the PNGs decoded by
Pillow, matplotlib's viridis; the arithmetic compared with ``--format json --explain-row`` of the
same row (the CLI's full trace); the notebook cell rendered in chromium.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()


def causal(x: np.ndarray) -> np.ndarray:
    s = x @ np.swapaxes(x, -1, -2) / np.sqrt(x.shape[-1])  # (..., T, d) x (..., d, T) -> (..., T, T)
    T = s.shape[-1]
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def images(text: str) -> list[tuple[str, np.ndarray]]:
    from PIL import Image

    out = []
    for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"', text):
        out.append((alt, np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")).astype(int)))
    return out


@pytest.mark.slow
def test_every_head_as_a_heatmap_and_the_named_rows_exact(tmp_path: Path) -> None:
    from matplotlib import colormaps

    x = np.random.default_rng(3).standard_normal((1, 20, 70, 4))  # 20 heads of 70 tokens: beyond 16 x 64
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "p.html"
    r = runner.invoke(app, ["run", str(tmp_path / "x.npy"), "--causal", "-q", "--html", str(out),
                            "--explain-row", "0,3:69", "--explain", "0,7:40,2"])
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert "20 heads / batch entries of 70 queries × 70 keys: more than a page of tables holds" in text
    assert "the cells and rows named with --explain / --explain-row" in text
    maps = images(text)
    assert [alt for alt, _ in maps] == [f"head {h}" for h in range(20)]
    w = causal(x)[0]  # (20, 70, 70)
    masked = np.triu(np.ones((70, 70), bool), 1)
    lo, hi = w[:, ~masked].min(), w[:, ~masked].max()
    for h in (0, 3, 19):
        got = maps[h][1]
        assert got.shape == (70, 70, 3)  # 70 cells fit in 256 pixels: one pixel a cell
        assert (got[masked] == (176, 176, 176)).all()
        want = np.asarray(colormaps["viridis"]((w[h][~masked] - lo) / (hi - lo)))[:, :3] * 255
        assert np.abs(got[~masked] - want).max() <= 7
    doc = json.loads(runner.invoke(app, ["run", str(tmp_path / "x.npy"), "--causal", "-f", "json",
                                         "--explain-row", "0,3:69", "--explain", "0,7:40,2"]).stdout)
    for e in doc["explanations"]:
        block = html.escape(e["heading"]) + "</h3>"
        assert block in text
        assert html.escape("\n".join(e["lines"])) in text
    # the row's table: its 16 strongest keys with their weights
    row = w[3, 69]
    for j in np.argsort(-row)[:16]:
        assert f"<tr><th>k{j}</th>" in text and f"<td>{row[j]:.4f}</td></tr>" in text


def test_without_named_rows_every_heads_first_and_last_row(tmp_path: Path) -> None:
    x = np.random.default_rng(4).standard_normal((100, 3))
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "p.html"
    r = runner.invoke(app, ["run", str(tmp_path / "x.npy"), "--causal", "-q", "--html", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert html.escape("each head's first and last query") in text
    assert text.count("<section class=ex>") == 2 and "Explain row q0" in text and "Explain row q99" in text
    assert not re.search(r"<script|https?://", text)  # no script, nothing from the network


# ---- notebooks ----




def test_a_trace_displays_itself_in_a_notebook_cell(browser: Any) -> None:
    import attncli

    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = ["a", "</iframe><script>parent.pwned = 1</script>", "c"]
    t = attncli.attend(q, score="dot", query_labels=labels, key_labels=labels)
    cell = t._repr_html_()
    assert cell is not None and cell.startswith("<iframe") and "<script>parent" not in cell
    page = browser.new_page(viewport={"width": 900, "height": 700})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content(f"<!doctype html><html><body><div class='jp-OutputArea-output'>{cell}</div></body></html>")
    page.wait_for_function("() => document.querySelector('iframe').contentDocument === null || true")
    frame = page.frames[1]
    frame.wait_for_selector("table.qk td")
    cells = frame.eval_on_selector_all('table.qk[data-step="weights"] td', "ts => ts.map((t) => t.textContent)")
    s = q @ q.T
    w = np.exp(s - s.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    assert [float(c) for c in cells] == pytest.approx(w.ravel().tolist(), abs=5e-5)
    assert labels[1] in frame.inner_text("body")  # the label, as text
    assert page.evaluate("() => window.pwned") is None and errors == []
    box = page.locator("iframe").bounding_box()
    assert box is not None and box["height"] >= 400


def test_a_big_trace_in_a_notebook_is_the_heatmap_page() -> None:
    import attncli

    t = attncli.attend(np.random.default_rng(0).standard_normal((1, 4, 80, 4)), causal=True)
    cell = t._repr_html_()
    assert cell is not None
    doc = html.unescape(re.search(r'srcdoc="([^"]*)"', cell).group(1))  # type: ignore[union-attr]
    assert "4 heads / batch entries of 80 queries × 80 keys" in doc and len(images(doc)) == 4
