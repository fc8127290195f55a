"""Formulas as data (issue 30, item 7): each step's typed parameters write its formula once, as terms
(attncli.core.formula); the text (JSON, NPZ, terminal, check), LaTeX and HTML are that one formula written three ways,
and nothing reads a formula back out of its text.

- every step of a broad set of runs (tests/formula_runs.py) has parameters that write its formula, and its text is the
  text those terms write, byte for byte what main wrote before the change (tests/golden/formulas_main.json, made by
  ``python tests/formula_runs.py`` on main: a regression guard beside the tests below);
- the formula follows the numbers of the parameters and nothing else: a cap of 2.5 writes 2.5, a window of 3 writes 3,
  whatever else the run holds (values written here by hand from the parameters, not from our renderers);
- the HTML of every formula is its text with sub- and superscripts as markup: undoing the markup gives the text
  back, for every step of every run; a tensor name read from a file is escaped, in the page and in a real browser;
- a LaTeX document whose steps carry a hostile tensor name compiles and shows it as text.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from formula_runs import formulas, runs
from test_latex import compiles, needs_latex

from attncli.core import chain
from attncli.core.engine import attend, multihead
from attncli.core.formula import Formula, Name, Num, Sub, Sym, Words, formula, text
from attncli.core.options import Options
from attncli.core.projections import Projections
from attncli.core.trace import Trace
from attncli.errors import InputError
from attncli.render import RenderOptions
from attncli.render.formulas import step_html
from attncli.render.latex import latex_document, markdown_document, step_tex
from attncli.render.page import page, page_data

GOLDEN = Path(__file__).parent / "golden" / "formulas_main.json"
HOSTILE = "model.<img src=x onerror=alert(1)>_$^{}&#%~\\.weight"


@pytest.fixture(scope="module")
def traces() -> dict[str, Trace]:
    return runs()


def test_every_step_writes_its_formula_from_its_parameters(traces: dict[str, Trace]) -> None:
    names = set()
    for run, t in traces.items():
        for s in t.steps:
            names.add(s.name)
            assert s.params is not None and callable(getattr(s.params, "formula", None)), (run, s.name)
            f = s.params.formula()
            assert isinstance(f, Formula) and s.text == text(f, s.head), (run, s.name)
    assert len(names) >= 56  # every StepName, and the scores' and MLA's own steps


def test_formulas_are_those_main_wrote(traces: dict[str, Trace]) -> None:
    """The JSON/NPZ formula strings did not change (a regression guard: the sample was taken from main)."""
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    got = formulas(traces)
    assert sorted(got) == sorted(want)
    for run in want:
        assert got[run] == want[run], run


def test_the_formula_follows_the_parameters() -> None:
    """Written by hand from the options: each number of the formula is the parameter's, in its place."""
    q = np.random.default_rng(0).standard_normal((3, 4))
    t = attend(q, softcap=2.5, window=3, causal=True, score="scaled-dot", temperature=4.0)
    assert t.step("scaled").formula == "scaled = (S / √d = S / √4) / T = (S / √d = S / √4) / 4"
    assert t.step("capped").formula == "capped = 2.5 · tanh(scaled / 2.5): scores squashed into (-2.5, 2.5)"
    assert t.step("masked").formula == ("masked = capped with masked keys set to -inf; the sliding window keeps the 3 "
                                        "keys up to each query")
    assert t.step("weights").formula == "weights = softmax(masked, over keys)"
    # the parameters alone write it: another cap, the same run
    cap = t.step("capped").params
    assert isinstance(cap, chain.Cap)
    assert text(chain.Cap(7.0, "alibi").formula()) == "capped = 7 · tanh(alibi / 7): scores squashed into (-7, 7)"
    out = attend(q, q, q, score="scaled-dot", rope="half", q_offset=2, rope_base=500.0)
    assert out.step("q_rot").formula == ("q_rot = q·cos θ + rotate_half(q)·sin θ, θ = position · 500^(-2k/4), "
                                         "position P + i = 2 + i (RoPE, half)")
    assert out.step("k_rot").formula.endswith("position j (RoPE, half)")


def test_json_formula_is_the_steps_text(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from attncli.cli import app

    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(1).standard_normal((2, 3, 4)))
    r = CliRunner().invoke(app, ["run", str(x), "--alibi", "--softcap", "3", "--causal", "--format", "json"])
    assert r.exit_code == 0, r.output
    steps = {s["name"]: s["formula"] for s in json.loads(r.stdout)["steps"]}
    assert steps["capped"] == "capped = 3 · tanh(scaled / 3): scores squashed into (-3, 3)"
    assert steps["alibi"] == "alibi = capped + slope_h · (j - i) = capped - slope_h · distance (ALiBi)"


def _undo_markup(s: str) -> str:
    """An HTML formula back to the text notation: <sub>x</sub> -> _x, <sup>x</sup> -> ^(x), entities decoded."""
    s = re.sub(r"<sub>(.*?)</sub>", r"_\1", s)
    s = re.sub(r"<sup>(.*?)</sup>", r"^(\1)", s)
    assert "<" not in s, s  # no other markup
    return html.unescape(s)


def test_html_is_the_same_formula_with_markup(traces: dict[str, Trace]) -> None:
    for run, t in traces.items():
        for s in t.steps:
            assert _undo_markup(step_html(s)) == s.formula, (run, s.name)
    layer = traces["layer-b"]
    assert "q<sub>rot</sub> = q<sub>norm</sub>" in step_html(layer.step("q_rot"))
    assert "10000<sup>-2k/4</sup>" in step_html(layer.step("q_rot"))
    assert step_html(traces["layer@head1"].step("head_output")) == "head 1: head<sub>1</sub> = weights · V"


def _hostile_layer() -> Trace:
    rng = np.random.default_rng(3)
    w = {n: rng.standard_normal((8, 8)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}
    return multihead(rng.standard_normal((4, 8)), weights=Projections(**w, origin={"W_q": HOSTILE, "W_o": HOSTILE}),
                     heads=2, options=Options(rope="half"))


def test_a_tensor_name_is_text_in_every_output() -> None:
    t = _hostile_layer()
    assert t.step("W_q").formula == f"W_q (from {HOSTILE}), textbook convention (in, out)"
    h = step_html(t.step("W_q"))
    assert "<img" not in h and html.escape(HOSTILE, quote=True) in h
    data = page_data(t)
    titles = {tb["name"]: tb["title_html"] for tb in data["tables"] if "title_html" in tb}
    assert "<img" not in titles["W_q"] and "W<sub>q</sub>" in titles["W_q"]
    assert "<img" not in page(t)


@needs_latex
def test_latex_with_a_tensor_name_compiles(tmp_path: Path) -> None:
    t = _hostile_layer()
    doc = latex_document(t, RenderOptions())
    assert "onerror" in doc and "<img" not in doc  # as text, its specials escaped
    compiles(doc, tmp_path)
    assert "\\text{rotate\\_half}" not in step_tex(t.step("q_rot"))  # a function, not a word
    md = markdown_document(t, RenderOptions())
    assert "\\<img" in md and not re.search(r"(?<!\\)<img", md)  # Markdown: backslash-escaped, never a tag


def test_page_in_a_browser_shows_formulas_with_subscripts(tmp_path: Path, browser) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "p.html"
    out.write_text(page(_hostile_layer()), encoding="utf-8")
    p = browser.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(out.as_uri())
    heads = p.locator("h3")
    texts = heads.all_inner_texts()
    assert any(x.startswith("1. X") for x in texts)
    assert p.locator("h3 sub").count() > 10 and p.locator("h3 sup").count() >= 2  # q_rot's power, k_rot's
    assert p.locator("img").count() == 0  # the tensor's name stayed text
    w_q = next(x for x in texts if "textbook convention" in x and "onerror" in x)
    assert HOSTILE in w_q
    assert errors == []
    p.close()


def test_formula_terms_write_each_kind_from_their_type() -> None:
    f = formula([Name("q_rot"), " = ", Sub("slope", "h"), " · ", Num(0.5)], [": ", Words("a <b> & c")])
    assert text(f) == "q_rot = slope_h · 0.5: a <b> & c"
    from attncli.render.formulas import formula_html
    from attncli.render.latex import formula_tex, remark_tex

    assert formula_html(f.terms) == "q<sub>rot</sub> = slope<sub>h</sub> · 0.5: a &lt;b&gt; &amp; c"
    assert formula_tex(f.eq) == r"q_{\text{rot}} = \text{slope}_{h} \cdot  0.5"
    assert remark_tex(f.remark) == r": a \textless{}b\textgreater{} \& c"
    assert text([Sym("x")]) == "x"


def test_score_weights_and_their_former_name() -> None:
    q = np.random.default_rng(2).standard_normal((2, 3))
    w = {"W": np.eye(3)}
    a = attend(q, score="general", score_weights=w)
    b = attend(q, score="general", params=w)  # the former keyword, still accepted
    np.testing.assert_array_equal(a.weights, b.weights)
    np.testing.assert_allclose(a["scores"], q @ q.T, rtol=0, atol=1e-12)  # W = I: q_i · k_j
    with pytest.raises(InputError, match="once"):
        attend(q, score="general", score_weights=w, params=w)
