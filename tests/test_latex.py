"""--format latex / markdown: the worked solution compiles, and its numbers are the trace's.

Compiled with pdflatex when it is installed (Debian: texlive-latex-base + texlive-latex-recommended,
which .ci/run installs where apt-get works); skipped otherwise. The cat/milk numbers are checked
against a float64 softmax computed here by hand from the notes' matrix (Q = K = V, d = 4).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "attncli" / "examples").glob("*.yaml"))
CAT_MILK = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=np.float64)
PDFLATEX = shutil.which("pdflatex")
NODE = shutil.which("node")
KATEX_CHECK = r"""
const katex = require("katex");
const blocks = JSON.parse(require("fs").readFileSync(0, "utf8"));
const bad = [];
for (const b of blocks) {
  try { katex.renderToString(b, { displayMode: true, throwOnError: true }); }
  catch (e) { bad.push(e.message.slice(0, 300)); }
}
console.log(JSON.stringify(bad));
"""


def have_katex() -> bool:
    if NODE is None:
        return False
    return subprocess.run([NODE, "-e", "require.resolve('katex')"], capture_output=True).returncode == 0


KATEX = have_katex()
needs_latex = pytest.mark.skipif(PDFLATEX is None and not KATEX, reason="neither pdflatex nor KaTeX (node) is installed")


def katex_errors(blocks: list[str]) -> list[str]:
    """What KaTeX (the renderer of many Markdown viewers) says of each math block: nothing when it renders."""
    import json

    proc = subprocess.run([str(NODE), "-e", KATEX_CHECK], input=json.dumps(blocks), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def math_blocks(tex: str) -> list[str]:
    """The display math of a LaTeX document: \\[ ... \\] and align* environments."""
    return [*re.findall(r"\\\[\n(.*?)\n\\\]", tex, flags=re.S),
            *re.findall(r"(\\begin\{align\*\}.*?\\end\{align\*\})", tex, flags=re.S)]


def document(*args: str, fmt: str = "latex") -> str:
    r = runner.invoke(app, [*args, "--format", fmt])
    assert r.exit_code == 0, r.output
    return r.stdout


def compiles(tex: str, tmp_path: Path, name: str = "doc") -> None:
    """pdflatex makes a PDF of ``tex``; without pdflatex, KaTeX renders every display of it."""
    if PDFLATEX is None:
        blocks = math_blocks(tex)
        assert blocks and not katex_errors(blocks)
        return
    (tmp_path / f"{name}.tex").write_text(tex, encoding="utf-8")
    proc = subprocess.run([str(PDFLATEX), "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("!")]
    assert proc.returncode == 0 and (tmp_path / f"{name}.pdf").exists(), errors or proc.stdout[-1500:]


def matrix_after(tex: str, symbol: str) -> np.ndarray:
    """The numbers of the bmatrix that follows ``symbol =``."""
    body = tex.split(symbol + " =\n\\begin{bmatrix}\n", 1)[1].split("\\end{bmatrix}", 1)[0]
    return np.array([[float(x) for x in row.split("&")] for row in body.strip().split("\\\\")])


def hand() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = CAT_MILK @ CAT_MILK.T  # (4, 4) x (4, 4) -> (4, 4): the notes' Q·Kᵀ (8 8 8 8 / 8 10 8 12 / ...)
    e = np.exp(s / math.sqrt(4))
    w = e / e.sum(axis=1, keepdims=True)
    return s, w, w @ CAT_MILK  # (4, 4) x (4, 4) -> (4, 4)


def test_cat_milk_numbers_are_the_hand_computed_ones() -> None:
    tex = document("examples", "run", "cat_milk_sweet", "-x", "milk,cat")
    s, w, out = hand()
    assert (matrix_after(tex, r"S = Q K^{\top}") == s).all()  # whole numbers written as such
    assert np.array_equal(matrix_after(tex, r"A = \operatorname{softmax}(S')"), np.round(w, 4))
    assert np.array_equal(matrix_after(tex, "A V"), np.round(out, 4))
    assert r"\begin{matrix}\text{cat} \\ \text{milk} \\ \text{it} \\ \text{sweet}\end{matrix}" in tex  # row labels
    # the --explain cell as equations: exp(4) / (e^4 + e^5 + e^4 + e^6) = 0.0826
    total = math.exp(4) * 2 + math.exp(5) + math.exp(6)
    assert f"= {total:.4f}" in tex and f"= {math.exp(4) / total:.4f}" in tex and r"\sqrt{4}" in tex


@needs_latex
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_compiles(tmp_path: Path, name: str) -> None:
    compiles(document("examples", "run", name, "-x", "0,0", "--explain-row", "0"), tmp_path, name)


@needs_latex
def test_awkward_labels_compile(tmp_path: Path) -> None:
    x = tmp_path / "x.json"
    x.write_text("[[1, 0], [0, 1], [1, 1], [2, 0]]")
    tex = document("run", str(x), "--labels", r"$\frac,x^{$,50% & #1,a_b~{}", "-x", "1,2", "--explain-row", "0")
    compiles(tex, tmp_path)


@needs_latex
def test_markdown_math_is_the_same_latex(tmp_path: Path) -> None:
    md = document("examples", "run", "cat_milk_sweet", "-x", "milk,cat", fmt="markdown")
    blocks = re.findall(r"^\$\$\n(.*?)\n\$\$$", md, flags=re.S | re.M)
    assert len(blocks) >= 5 and md.count("$$") == 2 * len(blocks)  # every block closed
    assert "### Explain weight(milk, cat)" in md
    tex = ("\\documentclass{article}\\usepackage{amsmath,amssymb}\\begin{document}\n"
           + "\n".join(f"\\[\n{b}\n\\]" for b in blocks) + "\n\\end{document}\n")
    compiles(tex, tmp_path, "md")


@pytest.mark.skipif(not KATEX, reason="KaTeX is not installed for node (npm install katex)")
def test_markdown_renders_with_katex() -> None:
    for args in (["cat_milk_sweet", "-x", "milk,cat", "--explain-row", "it"],
                 ["d2l_masked_softmax", "-x", "1:0,2", "--explain-row", "0:1"], ["multihead_cat_milk", "-x", "1:it,milk"]):
        md = document("examples", "run", *args, fmt="markdown")
        blocks = re.findall(r"^\$\$\n(.*?)\n\$\$$", md, flags=re.S | re.M)
        assert blocks and katex_errors(blocks) == []


def test_save_tex_and_md(tmp_path: Path) -> None:
    for ext in ("tex", "md"):
        out = tmp_path / f"cat.{ext}"
        r = runner.invoke(app, ["examples", "run", "cat_milk_sweet", "-q", "--save", str(out)])
        assert r.exit_code == 0, r.output
        assert "0.0826" in out.read_text(encoding="utf-8")


def test_readme_shows_the_latex_its_command_makes() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("```latex\n", 1)[1].split("```", 1)[0]
    assert block == document("examples", "run", "cat_milk_sweet", "--steps", "scores,weights,output", "-x", "milk,cat")
