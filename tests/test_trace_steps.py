"""Steps are built once, in order, with a typed per-head marker (issue 30, item 6): the merge of a layer's heads
marks its per-head steps (``Step.per_head``) instead of rewriting their text, and a view of one head
(``select_head``) is a new trace whose steps say which head they are (``Step.head``), the original untouched. The
display formula (what JSON, the terminal and the documents show) is written from the marker."""

from __future__ import annotations

import numpy as np

from attncli.core.engine import multihead, select_head
from attncli.core.projections import Projections
from attncli.core.trace import Trace


def _trace() -> Trace:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8))
    w = Projections(**{n: rng.standard_normal((8, 8)) for n in ("W_q", "W_k", "W_v", "W_o")})
    return multihead(x, weights=w, heads=2)


def test_per_head_steps_are_marked_not_rewritten() -> None:
    t = _trace()
    marked = [s.name for s in t.steps if s.per_head]
    assert marked == t.meta.per_head_steps and {"scores", "weights", "head_output"} <= set(marked)
    out = t.step("head_output")
    assert out.text == "head_h = weights · V" and "each head" not in out.text
    assert out.formula == "head_h = weights · V  (each head h)"
    assert t.step("output").formula == "output = concat · W_o" and not t.step("output").per_head


def test_a_view_of_one_head_names_it_and_leaves_the_trace_as_it_was() -> None:
    t = _trace()
    before = [(s.name, s.formula) for s in t.steps]
    v = select_head(t, 1)
    out = v.step("head_output")
    assert out.head == 1 and out.formula == "head 1: head_1 = weights · V" and not out.per_head
    np.testing.assert_array_equal(v["weights"], t["weights"][:, 1] if t["weights"].ndim == 4 else t["weights"][1])
    assert [(s.name, s.formula) for s in t.steps] == before
