r"""Worked solutions as documents: ``--format latex`` / ``--save x.tex`` and ``--format markdown`` /
``--save x.md``.

The steps are written as the notes in ../shared/seeds write them: each matrix a ``bmatrix`` with
its row labels beside it and its column labels named, under the step's formula (``Q K^\top``,
the scaled scores, the softmax, the output), and the arithmetic of every ``--explain`` cell and
``--explain-row`` row as equations. The text of that arithmetic is the text of ``--explain``
(attncli.render.explain), turned into math by ``math_text``; the numbers are written by
attncli.render.numbers, as in the terminal tables.

The LaTeX document needs amsmath only (pdflatex, tectonic); the Markdown puts the same math in
``$$`` blocks (GitHub, KaTeX, MathJax).
"""

from __future__ import annotations

import re
from typing import IO, Any

import numpy as np

from attncli.core.diagnostics import masked_cells
from attncli.core.trace import FEATURES, KEYS, QUERIES, Trace
from attncli.render import RenderOptions, escape, output_format, saver
from attncli.render.explain import explanations
from attncli.render.numbers import all_whole, column_format
from attncli.render.plot import panel_title
from attncli.render.terminal import INPUT_TITLES, axis_labels, seed_note, shown

MAX_SIDE = 8  # rows / columns written before eliding the middle (\cdots, \vdots)
MAX_ENTRIES = 4  # batch entries / heads written

TEXT_ESCAPES = escape.LATEX_TEXT
MATH_SYMBOLS = {"·": r"\cdot ", "×": r"\times ", "−": "-", "→": r"\to ", "↓": r"\downarrow ", "Σ": r"\sum ",
                "‖": r"\|", "ᵀ": r"^{\top}", "≤": r"\le ", "≥": r"\ge ", "σ": r"\sigma ", "²": "^{2}",
                "…": r"\dots ", "≈": r"\approx ", "±": r"\pm ", "∞": r"\infty ", "\\": r"\backslash ",
                "$": r"\$", "%": r"\%", "&": r"\&", "#": r"\#", "{": r"\{", "}": r"\}", "~": r"\sim ",
                "√": r"\surd ", "⊙": r"\odot ", "∘": r"\circ ", "⊗": r"\otimes ", "∈": r"\in ", "≠": r"\neq ",
                "∑": r"\sum ", "π": r"\pi ", "λ": r"\lambda ", "α": r"\alpha ", "β": r"\beta ", "θ": r"\theta ",
                "μ": r"\mu ", "τ": r"\tau ", "ε": r"\epsilon ", "←": r"\leftarrow ", "↑": r"\uparrow ",
                "⟨": r"\langle ", "⟩": r"\rangle ", "⁻": "^{-}", "¹": "^{1}", "³": "^{3}", "∂": r"\partial ",
                "∗": "*", "⋅": r"\cdot ", "–": "-", "—": "-", "“": "``", "”": "''", "’": "'"}
FUNCTIONS = {"exp": r"\exp", "max": r"\max", "min": r"\min", "cos": r"\cos", "tanh": r"\tanh", "ln": r"\ln",
             "softmax": r"\operatorname{softmax}", "sqrt": r"\sqrt"}
LETTER = "A-Za-z\u00c0-\u024f"  # Latin letters: words of these are text; σ, ² and other scripts are math
WORDS = re.compile(rf"((?:\s*[{LETTER}]{{2,}}[{LETTER}0-9]*[',;:.]?)+\s*)")
ROOT = re.compile(r"√\(?([\w.]+)\)?")
SUB_SUP = re.compile(r"([_^])(?![\w(])")


def text(s: str) -> str:
    """Plain text for LaTeX's text mode: every special character escaped, math symbols as math."""
    return "".join(TEXT_ESCAPES.get(c) or (r"\ensuremath{" + MATH_SYMBOLS[c] + "}" if not c.isascii() and c in MATH_SYMBOLS
                                           else c) for c in escape.terminal(s))


def in_math(s: str) -> str:
    """Text (a label, a word) inside math: \\text{} runs, math symbols (σ, ², ·) as math commands,
    so both LaTeX and KaTeX read it (KaTeX has no \\ensuremath)."""
    out, run = [], ""
    for c in s:
        if not c.isascii() and c in MATH_SYMBOLS:
            out.append((r"\text{" + text(run) + "}" if run else "") + MATH_SYMBOLS[c])
            run = ""
        else:
            run += c
    return "".join(out) + (r"\text{" + text(run) + "}" if run else "")


def math_text(line: str) -> str:
    """A line of --explain (or a formula) as LaTeX math: words in \\text{}, symbols as commands."""
    line = ROOT.sub(lambda m: f"\x00{m.group(1)}\x01", escape.terminal(line))  # √4 -> \sqrt{4}, after escaping
    line = re.sub(r"\s{2,}", "\x02", line.strip())  # a gap between the text's columns: \quad
    out = []
    for k, part in enumerate(WORDS.split(line)):
        if k % 2 and part.strip() in FUNCTIONS:  # exp, max, softmax: operators, with their spaces
            out.append(" " + FUNCTIONS[part.strip()] + " ")
            continue
        if k % 2:  # words
            out.append(in_math(part.replace("\x00", "√").replace("\x01", "")))
            continue
        part = SUB_SUP.sub(lambda m: "\x03" if m.group(1) == "_" else "\x04", part)  # put back after the symbols
        s = "".join(MATH_SYMBOLS.get(c, c) if not (c.isascii() and c not in "\\$%&#{}~") or c in MATH_SYMBOLS
                    else c for c in part)
        s = "".join(c if c.isascii() or c in "\x00\x01" else r"\text{" + text(c) + "}" for c in s)
        out.append(s.replace("\x00", r"\sqrt{").replace("\x01", "}").replace("\x02", r"\quad ")
                   .replace("\x03", r"\_").replace("\x04", r"\hat{}"))
    return "".join(out)


def _labels(trace: Trace, axis: str, count: int) -> list[str]:
    return axis_labels(trace, axis, count)


def matrix(a: np.ndarray, rows: list[str], cols: list[str], precision: int, hidden: np.ndarray | None = None,
           full: bool = False) -> tuple[str, str]:
    """(bmatrix with row labels beside it, 'columns: ...') for the 2-D ``a``; masked cells are 0 written
    as \\cdot, the middle of a big matrix as \\cdots / \\vdots."""
    m, n = a.shape
    ri, ci = shown(m, MAX_SIDE, full), shown(n, MAX_SIDE, full)
    hid = np.zeros(a.shape, dtype=bool) if hidden is None else hidden
    good = [float(a[i, j]) for i in ri if i is not None for j in ci if j is not None and not hid[i, j]]
    integers = all_whole(good)
    fmts = {j: column_format([a[i, j] for i in ri if i is not None and not hid[i, j]], precision, integers)
            for j in ci if j is not None}
    body = []
    for i in ri:
        if i is None:
            body.append(" & ".join(r"\vdots" if j is not None else r"\ddots" for j in ci))
            continue
        body.append(" & ".join(r"\cdots" if j is None else (r"\cdot" if hid[i, j] else _cell(fmts[j](a[i, j])))
                               for j in ci))
    lab = r" \\ ".join(r"\vdots" if i is None else in_math(rows[i]) for i in ri)
    tex = ("\\begin{bmatrix}\n" + " \\\\\n".join(body) + "\n\\end{bmatrix}\n\\begin{matrix}" + lab + "\\end{matrix}")
    names = ", ".join("…" if j is None else cols[j] for j in ci)
    return tex, names


def _cell(s: str) -> str:
    """A written number as math: 1.597e-6 -> 1.597\\times 10^{-6}, -inf -> -\\infty."""
    if s in ("inf", "-inf"):
        return s.replace("inf", r"\infty")
    if s == "nan":
        return r"\text{nan}"
    if "e" in s:
        mant, _, exp = s.partition("e")
        return (f"{mant}\\times 10^{{{exp}}}" if mant not in ("1", "-1") else f"{'-' if mant == '-1' else ''}10^{{{exp}}}")
    return s


STEP_SYMBOLS = {"scores": r"S = Q K^{\top}", "scaled": "S'", "masked": r"S'_{\text{masked}}",
                "weights": r"A = \operatorname{softmax}(S')", "output": "A V"}


def blocks(trace: Trace, opts: RenderOptions) -> list[tuple[str, Any]]:
    """The document as ('heading' | 'para' | 'math' | 'lines', content) blocks, for LaTeX and Markdown alike."""
    out: list[tuple[str, Any]] = []
    meta = trace.meta
    out.append(("heading", f"Attention, step by step ({meta.score or 'attention'})"))
    if meta.score_formula:
        out.append(("para", f"Score: {meta.score_formula}"))
    note = seed_note(meta)
    if note:
        out.append(("para", note))
    p = opts.precision
    wanted = opts.steps
    same = bool(meta.self_attention)
    marked = masked_cells(trace)
    for name, a in trace.inputs_numpy().items():
        if (wanted is not None and name not in wanted) or (same and name in ("k", "v")):
            continue
        a = np.asarray(a)
        if a.ndim < 1 or not np.issubdtype(a.dtype, np.number):
            continue
        a = np.atleast_2d(a)
        title, axes = INPUT_TITLES.get(name, (name, (FEATURES, FEATURES)))
        symbol = "Q = K = V" if same and name == "q" else {"q": "Q", "k": "K", "v": "V"}.get(name, in_math(name))
        out.extend(_step_blocks(trace, f"{'X: Q = K = V' if same and name == 'q' else title}", symbol, a, axes, p,
                                None, opts))
    for k, st in enumerate((s for s in trace.steps if wanted is None or s.name in wanted), 1):
        a = np.atleast_2d(st.numpy())
        hid = (marked if st.axes == (QUERIES, KEYS) and marked is not None and marked.shape == a.shape
               and st.name in ("weights", "hard", "dropout") else None)
        if hid is not None:
            hid = hid & (a == 0)  # a finite fill leaves masked keys a weight: written as it is
        symbol = STEP_SYMBOLS.get(st.name, in_math(st.name))
        out.extend(_step_blocks(trace, f"{k}. {st.formula}", symbol, a, st.axes, p, hid, opts))
    for e in explanations(trace, opts) if "weights" in trace else []:
        out.append(("heading2", e["heading"]))
        out.append(("lines", e["lines"]))
    return out


def _step_blocks(trace: Trace, title: str, symbol: str, a: np.ndarray, axes: Any, p: int, hid: np.ndarray | None,
                 opts: RenderOptions) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("heading2", title)]
    lead = a.shape[:-2]
    entries = list(np.ndindex(*lead)) if lead else [()]
    rows, cols = _labels(trace, axes[0], a.shape[-2]), _labels(trace, axes[1], a.shape[-1])
    limit = len(entries) if opts.full else MAX_ENTRIES
    for idx in entries[:limit]:
        tex, names = matrix(a[idx], rows, cols, p, hid[idx] if hid is not None else None, opts.full)
        where = panel_title(trace, idx) if len(idx) == len(trace.weights.shape[:-2]) else ", ".join(map(str, idx))
        label = f"{symbol}\\;[{in_math(where)}]" if idx else symbol
        out.append(("math", f"{label} =\n{tex}"))
        out.append(("para", f"columns ({axes[1]}): {names}" + (f"; {where}" if idx else "")))
    if len(entries) > limit:
        out.append(("para", f"… {len(entries) - limit} more not written (--full writes every one)"))
    return out


def latex_document(trace: Trace, opts: RenderOptions) -> str:
    parts = [r"\documentclass[11pt]{article}", r"\usepackage[utf8]{inputenc}", r"\usepackage{amsmath,amssymb}",
             r"\usepackage[margin=1.5cm]{geometry}", r"\allowdisplaybreaks", r"\begin{document}"]
    for kind, content in blocks(trace, opts):
        if kind == "heading":
            parts.append(r"\section*{" + text(content) + "}")
        elif kind == "heading2":
            parts.append(r"\subsection*{" + text(content) + "}")
        elif kind == "para":
            parts.append(text(content) + "\n")
        elif kind == "math":
            parts.append("\\[\n" + content + "\n\\]")
        elif kind == "lines":
            parts.append("{\\small\n\\begin{align*}\n" + " \\\\\n".join("& " + math_text(s.strip()) for s in content)
                         + "\n\\end{align*}}")
    parts.append(r"\end{document}")
    return "\n".join(parts) + "\n"


def markdown_document(trace: Trace, opts: RenderOptions) -> str:
    parts = []
    for kind, content in blocks(trace, opts):
        if kind == "heading":
            parts.append(f"## {_md(content)}\n")
        elif kind == "heading2":
            parts.append(f"### {_md(content)}\n")
        elif kind == "para":
            parts.append(_md(content) + "\n")
        elif kind == "math":
            parts.append("$$\n" + escape.markdown_math(content) + "\n$$\n")
        elif kind == "lines":
            parts.append("$$\n" + escape.markdown_math("\\begin{aligned}\n" + " \\\\\n".join(
                "& " + math_text(s.strip()) for s in content) + "\n\\end{aligned}") + "\n$$\n")
    return "\n".join(parts)


def _md(s: str) -> str:
    """Markdown text with its specials escaped (labels are text, never markup)."""
    return escape.markdown(s)


@output_format("latex")
def print_latex(trace: Trace, opts: RenderOptions, out: Any) -> None:
    out.write(latex_document(trace, opts))


@output_format("markdown")
def print_markdown(trace: Trace, opts: RenderOptions, out: Any) -> None:
    out.write(markdown_document(trace, opts))


@saver(".tex")
def save_latex(trace: Trace, opts: RenderOptions, f: IO[bytes]) -> None:
    f.write(latex_document(trace, opts).encode())


@saver(".md")
def save_markdown(trace: Trace, opts: RenderOptions, f: IO[bytes]) -> None:
    f.write(markdown_document(trace, opts).encode())
