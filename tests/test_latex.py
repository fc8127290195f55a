"""--format latex / markdown: the worked solution compiles, and its numbers are the trace's.

Compiled with pdflatex when it is installed (Debian: texlive-latex-base + texlive-latex-recommended,
which .ci/run installs where apt-get works); skipped otherwise. The cat/milk numbers are checked
against a float64 softmax computed here by hand from the notes' matrix (Q = K = V, d = 4).
"""

from __future__ import annotations

import math
import os
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


# node finds KaTeX where .ci/run installs it (npm install --prefix .ci-node katex), or on its own NODE_PATH
NODE_ENV = {**os.environ, "NODE_PATH": os.pathsep.join(
    p for p in (str(ROOT / ".ci-node" / "node_modules"), os.environ.get("NODE_PATH", "")) if p)}


def have_katex() -> bool:
    if NODE is None:
        return False
    return subprocess.run([NODE, "-e", "require.resolve('katex')"], capture_output=True, env=NODE_ENV).returncode == 0


KATEX = have_katex()
needs_latex = pytest.mark.skipif(PDFLATEX is None and not KATEX, reason="neither pdflatex nor KaTeX (node) is installed")


def katex_errors(blocks: list[str]) -> list[str]:
    """What KaTeX (the renderer of many Markdown viewers) says of each math block: nothing when it renders."""
    import json

    proc = subprocess.run([str(NODE), "-e", KATEX_CHECK], input=json.dumps(blocks), capture_output=True, text=True,
                          timeout=120, env=NODE_ENV)
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


def compiles(tex: str, tmp_path: Path, name: str = "doc") -> str:
    """pdflatex makes a PDF of ``tex`` (its log is returned); without pdflatex, KaTeX renders every display
    of it (and the log is empty)."""
    if PDFLATEX is None:
        blocks = math_blocks(tex)
        assert blocks and not katex_errors(blocks)
        return ""
    (tmp_path / f"{name}.tex").write_text(tex, encoding="utf-8")
    proc = subprocess.run([str(PDFLATEX), "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("!")]
    assert proc.returncode == 0 and (tmp_path / f"{name}.pdf").exists(), errors or proc.stdout[-1500:]
    return (tmp_path / f"{name}.log").read_text(encoding="latin-1")


def overfull(log: str) -> list[str]:
    """The lines of a pdflatex log that say a line runs past the margin."""
    return [ln for ln in log.splitlines() if ln.startswith("Overfull \\hbox")]


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
    """Every bundled example, with an explained cell and row, compiles with no line past the margin."""
    log = compiles(document("examples", "run", name, "-x", "0,1", "--explain-row", "0"), tmp_path, name)
    assert overfull(log) == []


@pytest.mark.skipif(PDFLATEX is None, reason="pdflatex is not installed")
def test_long_labels_and_wide_numbers_fit_the_page(tmp_path: Path) -> None:
    """Labels of 40 characters are shortened in the matrices, with a legend naming them in full; a wide matrix
    and long explanation lines still fit (no overfull line)."""
    n = 12
    rng = np.random.default_rng(0)
    x = tmp_path / "x.json"
    x.write_text(str((rng.standard_normal((n, 6)) * 1e-3).tolist()))
    names = [f"a_rather_long_label_for_token_number_{i:02d}" for i in range(n)]
    tex = document("run", str(x), "--labels", ",".join(names), "-x", f"{names[3]},{names[5]}",
                   "--explain-row", names[3])
    assert "a\\_rather\\_long\\_label\\_for\\_token\\_number\\_03" not in tex.split("\\begin{bmatrix}")[1]
    assert "labels shortened above" in tex and "number\\_03" in tex
    assert overfull(compiles(tex, tmp_path)) == []


def test_words_are_text_and_formulas_are_math() -> None:
    """The notes' cat/milk example: 'have a zero factor' is one text run (no math-italic a), arrows and
    subscripts are math (->: \\to, s_ij: s_{ij}), e-notation a power of ten, -inf the infinity sign."""
    tex = document("examples", "run", "cat_milk_sweet", "-x", "milk,cat")
    assert "products have a zero factor and are left out" in tex and "}a\\text{" not in tex
    assert "\\to" in tex and "\\textgreater" not in tex and "s_{ij}" in tex and "s\\_ij" not in tex
    nw = document("examples", "run", "nadaraya_watson", "-x", "0,1")
    assert "e-6" not in nw.split("\\begin{align*}")[1] and "10^{-6}" in nw
    masked = document("examples", "run", "d2l_additive", "-x", "0:0,3")  # keys past the valid length: -inf
    assert "\\text{inf}" not in masked and "\\infty" in masked


def test_label_specials_read_the_same_in_matrices_and_explanations(tmp_path: Path) -> None:
    """Labels from a file are data: u_alpha and c^hotel are escaped text in the matrices' row labels and in the
    explanation's equations alike (not a subscript, not a hat)."""
    x = tmp_path / "x.json"
    x.write_text("[[1, 0], [0, 1], [1, 1]]")
    tex = document("run", str(x), "--labels", "u_alpha,c^hotel,w", "-x", "u_alpha,c^hotel", "--explain-row", "c^hotel")
    for label in ("\\text{u\\_alpha}", "\\text{c\\textasciicircum{}hotel}"):
        matrices, explained = tex.split("\\subsection*{Explain", 1)
        assert label in matrices and label in explained
    assert "\\hat{}" not in tex and "u\\_\\text" not in tex
    if PDFLATEX is not None:
        assert overfull(compiles(tex, tmp_path)) == []


def test_float_noise_does_not_turn_a_column_to_e_notation(tmp_path: Path) -> None:
    """A column holding 0.14 and float noise 3e-18 is written in fixed decimals (0.1400, 0.0000)."""
    q, v = tmp_path / "q.json", tmp_path / "v.json"
    q.write_text("[[1, 0], [0, 1]]")
    v.write_text("[[0.14, 1.5], [3e-18, 2.5]]")
    tex = document("run", str(q), str(q), str(v), "--steps", "v")
    body = tex.split("\\begin{bmatrix}\n", 1)[1].split("\\end{bmatrix}", 1)[0]
    assert [row.split(" & ")[0].strip() for row in body.strip().split("\\\\")] == ["0.1400", "0.0000"]


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


@pytest.mark.skipif(not KATEX, reason="KaTeX is not installed for node (.ci/run installs it: npm install --prefix "
                                       ".ci-node katex)")
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
