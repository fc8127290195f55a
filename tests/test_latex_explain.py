"""Formulas as data (issue 30, item 7): the arithmetic of --explain / --explain-row in the LaTeX document is written
from the lines' typed terms (attncli.render.terms), never read back from their text. For runs that reach every step
kind and every score's explainer, the document compiles with pdflatex and each explanation line shows the numbers the
terminal text shows (read from both outputs as they are written: e-notation there, ×10^{} here)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_latex import compiles, needs_latex
from test_latex_steps import _runs

from attncli.core.engine import attend
from attncli.core.trace import Trace
from attncli.render import RenderOptions
from attncli.render.explain import explanations
from attncli.render.latex import latex_document

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def _more_runs() -> list[Trace]:
    """The scores' own explainers and the scaling rules: dot with RoPE and grouped-query heads, cosine, general,
    location, a temperature, the sequence and norm scalings, a causal mask."""
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((4, 3, 4)), rng.standard_normal((2, 3, 4))
    return [attend(q, k, k, rope="half", causal=True), attend(q[0], score="cosine"),
            attend(q[0], score="general"), attend(q[0], score="location"), attend(q[0], temperature=2.0),
            attend(q[0], scaling="seq"), attend(q[0], scaling="norm"), attend(q[0], scale=0.3), attend(q[0] * 1e-7, score="dot")]


RUNS = [*_runs(), *_more_runs()]


def _numbers(s: str) -> Counter[float]:
    return Counter(abs(round(float(x), 12)) for x in NUMBER.findall(s))


def _terminal(line: str, t: Trace) -> str:
    """An --explain line without the display text of the steps' and the score's formulas (LaTeX writes those from
    their parameters: tests/test_latex_steps.py)."""
    for text in sorted({st.formula for st in t.steps} | {str(t.meta.score_formula)}, key=len, reverse=True):
        line = line.replace(text, "")
    return line


def _latex_rows(tex: str) -> list[str]:
    """The explanation lines of the LaTeX document: the rows of its align* blocks, continuations joined, with
    a×10^{b} written as aeb again."""
    rows: list[str] = []
    for block in tex.split("\\begin{align*}\n")[1:]:
        for row in block.split("\n\\end{align*}")[0].split(" \\\\\n"):
            row = re.sub(r"(-?\d+(?:\.\d+)?)\\times 10\^\{(-?\d+)\}", r"\1e\2", row)
            if row.startswith("& \\qquad "):
                rows[-1] += " " + row
            else:
                rows.append(row)
    return rows


@needs_latex
@pytest.mark.parametrize("which", range(len(RUNS)))
def test_explain_lines_in_latex_show_the_terminal_numbers(which: int, tmp_path: Path) -> None:
    t = RUNS[which]
    m, n = t.weights.shape[-2:]
    opts = RenderOptions(explain=[f"{m - 1},{n - 1}", "0,0"], explain_rows=[str(m - 1)])
    lines = [str(x) for e in explanations(t, opts) for x in e["lines"]]
    tex = latex_document(t, opts)
    rows = _latex_rows(tex)
    assert len(rows) == len(lines)
    for text, row in zip(lines, rows):
        want, got = _numbers(_terminal(text, t)), _numbers(row)
        assert not want - got, (text, row)
    compiles(tex, tmp_path)


def test_no_renderer_of_formulas_reads_text_with_regular_expressions() -> None:
    """The modules that write explanations and formulas (terminal text, LaTeX, Markdown) import no ``re``: what
    they write comes from typed terms and parameters."""
    import ast

    import attncli.render.explain
    import attncli.render.latex
    import attncli.render.terms

    for module in (attncli.render.explain, attncli.render.latex, attncli.render.terms):
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        imported |= {str(node.module) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "re" not in imported, module.__name__


def test_rope_turns_its_own_row() -> None:
    """QK-norm then RoPE (the trace writes q_norm, k_norm, q_rot, k_rot): q_rot turns q_norm, k_rot turns k_norm —
    never the step written just before it."""
    from attncli.render.latex import step_tex

    t = _runs()[0]
    names = t.names()
    assert names.index("k_norm") < names.index("q_rot")
    q_rot, k_rot = (step_tex(t.step(n)) for n in ("q_rot", "k_rot"))
    assert r"\operatorname{rotate\_half}(q_{\text{norm}})" in q_rot and "k_{" not in q_rot
    assert r"\operatorname{rotate\_half}(k_{\text{norm}})" in k_rot and "q_{" not in k_rot
