"""A step's formula as HTML: the terms its typed parameters write (attncli.core.formula), each written from its type:
subscripts and powers as <sub> and <sup>, every text (a tensor's name from a file among them) escaped. Never read back
out of the formula's text.

    q_rot = q_norm·cos θ + ...   ->   q<sub>rot</sub> = q<sub>norm</sub>·cos θ + ...
"""

from __future__ import annotations

from collections.abc import Sequence

from attncli.core import formula as f
from attncli.core.trace import Step
from attncli.render.escape import html as esc


def name_html(name: str) -> str:
    """A step's symbol: q_rot -> q<sub>rot</sub>, W_q -> W<sub>q</sub>; a word (scores, kv_latent) as it is."""
    base, _, sub = name.partition("_")
    if len(base) == 1 and sub:
        return f"{esc(base)}<sub>{esc(sub)}</sub>"
    return esc(name)


def term_html(t: f.Term, head: int | None = None) -> str:
    """One term of a formula as HTML."""
    if isinstance(t, f.Name):
        return name_html(t.text)
    if isinstance(t, f.Sub):
        return f"{esc(t.base)}<sub>{esc(t.sub)}</sub>"
    if isinstance(t, f.Sup):
        return f"{esc(t.base)}<sup>{esc(t.exp)}</sup>"
    if isinstance(t, f.Head):
        return f"head<sub>{'h' if head is None else head}</sub>"
    if isinstance(t, f.Hat):
        return esc(t.base) + "&#x302;"
    if isinstance(t, f.Root):
        return "√" + esc(t.arg)
    return esc(f.term_text(t))  # symbols, functions, numbers, words, data: text, escaped


def formula_html(terms: Sequence[f.Term], head: int | None = None) -> str:
    return "".join(term_html(t, head) for t in terms)


def step_html(st: Step) -> str:
    """The step's display formula as HTML: what :attr:`Step.formula` says, with its marks ("head 2: ...",
    "(each head h)") from the step's typed marker."""
    body = formula_html(st.terms().terms, st.head)
    if st.head is not None:
        return f"head {st.head}: {body}"
    return body + "  (each head h)" if st.per_head else body
