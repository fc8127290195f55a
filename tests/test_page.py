"""--html: one self-contained page whose cells show the --explain text, tested as data and in a
real browser (Debian's chromium driven headless by playwright; skipped only when either is missing).

References: the arithmetic shown for a cell is compared with the lines ``--format json --explain``
prints for the same cell (one source of the text), and its numbers with a float64 softmax
computed here by hand for the notes' cat/milk sentence (Q = K = V, d = 4).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()
CAT_MILK = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=np.float64)
WORDS = ["cat", "milk", "it", "sweet"]


def make_page(tmp_path: Path, *args: str) -> tuple[Path, dict]:
    out = tmp_path / "page.html"
    r = runner.invoke(app, ["examples", "run", *args, "-q", "--html", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S).group(1))
    return out, data


def explained(args: list[str], spec: str, row: bool = False) -> list[str]:
    r = runner.invoke(app, ["examples", "run", *args, "-f", "json", "--explain-row" if row else "--explain", spec])
    e = json.loads(r.stdout)["explanations"][0]
    return [e["heading"], *e["lines"]]


def hand_weights() -> np.ndarray:
    s = CAT_MILK @ CAT_MILK.T / math.sqrt(4)  # (4, 4) x (4, 4) -> (4, 4), the notes' scaled scores
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_page_is_self_contained_and_explains_every_cell(tmp_path: Path) -> None:
    out, data = make_page(tmp_path, "cat_milk_sweet")
    text = out.read_text(encoding="utf-8")
    assert not re.search(r"(src|href)\s*=|https?://|@import", text)  # nothing fetched: scripts and styles inline
    # every cell's arithmetic is the --explain text of that cell
    for i, q in enumerate(WORDS):
        for j, k in enumerate(WORDS):
            assert data["cells"][0][i][j] == explained(["cat_milk_sweet"], f"{q},{k}")
        assert data["rows"][0][i] == explained(["cat_milk_sweet"], q, row=True)
    w = hand_weights()
    milk_cat = "\n".join(data["cells"][0][1][0])
    assert f"= {w[1, 0]:.4f}" in milk_cat and f"{w[1, 0]:.4f}" == "0.0826"
    weights = next(t for t in data["tables"] if t["name"] == "weights")
    assert [[float(x) for x in row] for row in weights["cells"][0]] == np.round(w, 4).tolist()


def test_labels_are_text_not_markup(tmp_path: Path) -> None:
    x = tmp_path / "x.json"
    x.write_text(json.dumps([[1.0, 0.0], [0.0, 1.0]]))
    out = tmp_path / "p.html"
    r = runner.invoke(app, ["run", str(x), "--labels", "</script><b>x,<img src=y>", "-q", "--html", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text(encoding="utf-8")
    assert "</script><b>" not in text and "<img src=y>" not in text  # JSON with '</' escaped, shown by textContent


def test_page_in_a_browser_cat_milk(tmp_path: Path, browser) -> None:  # type: ignore[no-untyped-def]
    out, data = make_page(tmp_path, "cat_milk_sweet")
    page = browser.new_page(viewport={"width": 1024, "height": 768})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(out.as_uri())
    shot = tmp_path / "page.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    # readable at 1024x768: nothing wider than the window
    assert page.evaluate("document.documentElement.scrollWidth") <= 1024
    page.click("table[data-step=weights] td[data-q='1'][data-k='0']")  # weight(milk, cat)
    shown = page.inner_text("#explain")
    assert shown.splitlines() == explained(["cat_milk_sweet"], "milk,cat")
    assert "exp(4) / Σ exp(row)" in shown and f"= {hand_weights()[1, 0]:.4f}" in shown
    page.click("table[data-step=weights] th.row[data-q='2']")  # the row of "it": its softmax and output
    row = page.inner_text("#explain")
    assert row.splitlines() == explained(["cat_milk_sweet"], "it", row=True)
    assert "= (0, 1.2500, 2.7500, 0)" in row  # the mean of the value rows (uniform weights), by hand
    assert not errors


def test_page_in_a_browser_switches_heads(tmp_path: Path, browser) -> None:  # type: ignore[no-untyped-def]
    out, data = make_page(tmp_path, "multihead_cat_milk")
    doc = json.loads(runner.invoke(app, ["examples", "run", "multihead_cat_milk", "-f", "json"]).stdout)
    w = np.asarray(next(s for s in doc["steps"] if s["name"] == "weights")["values"])  # (heads, 4, 4)
    page = browser.new_page(viewport={"width": 1024, "height": 768})
    page.goto(out.as_uri())

    def table() -> np.ndarray:
        rows = page.inner_text("table[data-step=weights]").strip().splitlines()[1:]
        return np.array([[float(x) for x in r.split("\t")[1:]] for r in rows])

    assert page.inner_text("#entry option:checked") == "head 0"
    assert np.allclose(table(), w[0], atol=5e-5)
    page.select_option("#entry", "1")
    assert np.allclose(table(), w[1], atol=5e-5) and not np.allclose(w[0], w[1], atol=1e-3)
    page.click("table[data-step=weights] td[data-q='0'][data-k='3']")
    assert page.inner_text("#explain").splitlines()[0] == "Explain weight(cat, sweet) (head 1)"
    page.screenshot(path=str(tmp_path / "heads.png"))
