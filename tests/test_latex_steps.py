"""Formulas as data (issue 30, item 7): the LaTeX and Markdown documents write each step's formula from the terms its
typed parameters write (attncli.render.latex.step_tex), never from its display text: a document still compiles, and
shows none of that text, when every step's text is replaced by garbage. Every step kind (StepName) has a formula that
compiles, with its real parameters (from runs that reach it) and without any."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_latex import compiles, needs_latex

from attncli.core.engine import attend, multihead
from attncli.core.options import Options
from attncli.core.projections import Projections
from attncli.core.trace import Step, StepName, Trace
from attncli.render import RenderOptions
from attncli.render.latex import latex_document, markdown_document, step_tex

GARBAGE = "@@ }{ $ not a formula & # _ ^ \\"


def _runs() -> list[Trace]:
    """Traces that reach most step kinds: a layer with biases, clipping, QK-norm, RoPE, soft-cap, a window, sinks
    and hard attention; additive, gaussian and ALiBi with dropout."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 8))
    w = {n: rng.standard_normal((8, 8)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}
    w |= {n: rng.standard_normal(8) / 3 for n in ("b_q", "b_k", "b_v", "b_o")}
    w |= {"q_norm": 1 + rng.random(4) / 2, "k_norm": 1 + rng.random(4) / 2}
    layer = multihead(x, weights=Projections(**w), heads=2, sinks=np.array([0.5, -1.0]),
                      options=Options(rope="half", qk_norm="rms", softcap=5.0, window=3, causal=True, clip_qkv=2.0,
                                      hard=True))
    q = rng.standard_normal((2, 3, 4))
    return [layer, attend(q, score="additive"), attend(q, score="gaussian"),
            attend(q, alibi=True, causal=True, dropout=0.3, seed=1)]


@needs_latex
def test_every_step_kind_has_a_formula_that_compiles(tmp_path: Path) -> None:
    runs = _runs()
    seen = {s.name for t in runs for s in t.steps}
    assert len(seen) >= 30  # most kinds, with their real parameters
    lines = []
    for t in runs:
        lines.extend(step_tex(s) for s in t.steps)
    for name in StepName:  # every kind, also without parameters
        lines.append(step_tex(Step(name.value, np.zeros((1, 1)))))
    assert not any("@@" in x for x in lines)
    doc = "\\documentclass{article}\\usepackage{amsmath,amssymb}\\begin{document}\n" + \
        "\n".join("\\[\n" + x + "\n\\]" for x in lines) + "\n\\end{document}\n"
    compiles(doc, tmp_path)


@needs_latex
@pytest.mark.parametrize("which", range(4))
def test_documents_never_read_the_display_text(which: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step's text replaced by garbage: the LaTeX document compiles, and neither document shows it."""
    t = _runs()[which]
    monkeypatch.setattr(Step, "text", property(lambda self: GARBAGE))
    monkeypatch.setattr(Step, "formula", property(lambda self: GARBAGE))
    assert t.steps[0].formula == GARBAGE
    opts = RenderOptions()
    tex, md = latex_document(t, opts), markdown_document(t, opts)
    assert "@@" not in tex and "@@" not in md
    compiles(tex, tmp_path)
