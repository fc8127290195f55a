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

from collections.abc import Sequence
from itertools import groupby
from typing import IO, Any

import numpy as np

from attncli.core import formula as f
from attncli.core.diagnostics import masked_cells
from attncli.core.trace import FEATURES, KEYS, QUERIES, Step, Trace
from attncli.render import RenderOptions, escape, output_format, saver
from attncli.render.explain import explanations
from attncli.render.numbers import all_whole, column_format
from attncli.render.plot import panel_title
from attncli.render.terminal import INPUT_TITLES, axis_labels, seed_note, shown
from attncli.render.terms import (
    Fn,
    Formula,
    Gap,
    Label,
    Line,
    Math,
    Name,
    Num,
    Root,
    ScoreFormula,
    Sub,
    Term,
    Vector,
    Words,
    term_text,
)

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
FUNCTIONS = {"exp": r"\exp", "max": r"\max", "min": r"\min", "cos": r"\cos", "sin": r"\sin", "tanh": r"\tanh",
             "ln": r"\ln", "log": r"\log",
             "softmax": r"\operatorname{softmax}", "sqrt": r"\sqrt"}


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


# ---- the terms of an --explain line (attncli.render.terms) as LaTeX: each term written from its type ----


def symbols(s: str) -> str:
    """Symbols and punctuation (a plain ``str`` term: ' = ', '×', '‖', 'σ²', a one-letter variable) as math,
    character by character: no text is read as anything but itself."""
    return "".join(MATH_SYMBOLS[c] if c in MATH_SYMBOLS else (r"\text{" + text(c) + "}" if not c.isascii() else c)
                   for c in escape.terminal(s))


def _number(t: Num) -> str:
    s = _cell(t.text().strip("()"))
    return f"({s})" if t.text().startswith("(") else s


def _sub_base(base: str) -> str:
    return r"\text{" + text(base) + "}" if len(base) > 1 and base.isalpha() else symbols(base)


def term_tex(t: Term, trace: Trace | None) -> str:
    """One term of an explanation line as LaTeX math."""
    if isinstance(t, str):
        return symbols(t) if t.strip() or not t else r"\ "  # a column's padding: one space
    if isinstance(t, (Words, Label)):
        return in_math(t.text)
    if isinstance(t, Num):
        return _number(t)
    if isinstance(t, Name):
        return step_symbol(t.text)
    if isinstance(t, Fn):
        return FUNCTIONS.get(t.text, r"\operatorname{" + text(t.text) + "}") + " "
    if isinstance(t, Sub):
        return _sub_base(t.base) + "_{" + (r"\text{" + text(t.sub) + "}" if len(t.sub) > 2 else text(t.sub)) + "}"
    if isinstance(t, Root):
        return r"\sqrt{" + text(t.arg) + "}"
    if isinstance(t, Formula):
        if trace is not None and t.step in trace.names():
            return step_tex(trace.step(t.step))
        return in_math(t.text)
    if isinstance(t, Math):
        return formula_tex(t.terms)
    if isinstance(t, ScoreFormula):
        return SCORE_ELEMENT[t.name] if t.name in SCORE_ELEMENT else in_math(t.text)
    if isinstance(t, Vector):
        return "(" + ", ".join(r"\dots " if x == "…" else _cell(x) for x in t.items()) + ")"
    return r"\quad "  # Gap


def line_tex(terms: Sequence[Term], trace: Trace | None) -> str:
    """An explanation line (its terms) as LaTeX math; its leading indent is the layout's business."""
    terms = list(terms)
    while terms and isinstance(terms[0], str) and not terms[0].strip():
        terms.pop(0)
    if terms and isinstance(terms[0], str):
        terms[0] = terms[0].lstrip()
    return "".join(term_tex(t, trace) for t in terms)


def heading_tex(line: str | Line, trace: Trace | None) -> str:
    """A heading for LaTeX's text mode: words and labels as (breakable) text, the terms between them as $math$."""
    if not isinstance(line, Line):
        return breakable(line)
    out: list[str] = []
    run: list[Term] = []
    for t in line.terms:
        if isinstance(t, (Words, Label, Fn)) or (isinstance(t, str) and t.isascii()):  # text, punctuation
            if run:
                out.append("$" + "".join(term_tex(x, trace) for x in run) + "$")
                run = []
            out.append(breakable(term_text(t)))
        else:
            run.append(t)
    if run:
        out.append("$" + "".join(term_tex(x, trace) for x in run) + "$")
    return "".join(out)


LONG_WORD = 24  # characters of a word without spaces (a long label) before LaTeX may break it


def breakable(s: str) -> str:
    """Text for LaTeX's text mode, words longer than LONG_WORD characters allowed to break every 16."""
    words = ["".join(g) for _, g in groupby(s, key=str.isspace)]  # words and the spaces between them
    return "".join(r"\allowbreak{}".join(text(w[i:i + 16]) for i in range(0, len(w), 16))
                   if len(w) > LONG_WORD else text(w) for w in words)


def _labels(trace: Trace, axis: str, count: int) -> list[str]:
    return axis_labels(trace, axis, count)


def matrix(a: np.ndarray, rows: list[str], cols: list[str], precision: int, hidden: np.ndarray | None = None,
           full: bool = False) -> tuple[str, str]:
    """(bmatrix with row labels beside it, 'columns: ...') for the 2-D ``a``; masked cells are 0 written
    as \\cdot, the middle of a big matrix as \\cdots / \\vdots."""
    m, n = a.shape
    side = MAX_SIDE
    while True:
        tex, names = _matrix(a, rows, cols, precision, hidden, full, side)
        if full or side <= 2 or fits(SYMBOL_ROOM + tex, SIZES[-2][1]):  # fits at \scriptsize: keep these columns
            return tex, names
        side -= 2


SYMBOL_ROOM = "A = \\operatorname{softmax}(S') [batch 0] =\n"  # room kept for the step's symbol before a matrix


def _matrix(a: np.ndarray, rows: list[str], cols: list[str], precision: int, hidden: np.ndarray | None,
            full: bool, side: int) -> tuple[str, str]:
    m, n = a.shape
    ri, ci = shown(m, MAX_SIDE, full), shown(n, side, full)
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


# ---- each step's formula in LaTeX: the terms its parameters write (attncli.core.formula), never its text ----

SCORE_ELEMENT = {"dot": r"q_i \cdot k_j", "scaled-dot": r"q_i \cdot k_j / \sqrt{d}", "general": r"q_i^{\top} W k_j",
                 "additive": r"w_v^{\top} \operatorname{act}(W_q q_i + W_k k_j + b)",
                 "cosine": r"\frac{q_i \cdot k_j}{\|q_i\| \, \|k_j\|}", "gaussian": r"-\frac{\|q_i - k_j\|^{2}}{2\sigma^{2}}",
                 "location": r"\operatorname{act}(W^{\top} k_j + b)"}
SCORE_ANY = r"\operatorname{score}(q_i, k_j)"
FORMULA_FUNCTIONS = {k: v for k, v in FUNCTIONS.items() if k != "sqrt"}  # sqrt(...) keeps its parentheses


def step_symbol(name: str) -> str:
    """A step's name as a math symbol: W_q -> W_{q}, q_rot -> q_{\\text{rot}}, a word (scores) as text."""
    base, _, sub = str(name).partition("_")
    if len(base) == 1 and sub:
        return base + "_{" + (sub if len(sub) == 1 else r"\text{" + text(sub) + "}") + "}"
    return name if len(name) == 1 else r"\text{" + text(str(name)) + "}"


def formula_term_tex(t: f.Term, head: int | None = None) -> str:
    """One term of a step's formula (attncli.core.formula) as LaTeX math, written from its type."""
    if isinstance(t, f.Sym):
        return symbols(t.text)
    if isinstance(t, f.Name):
        return step_symbol(t.text)
    if isinstance(t, f.Sub):
        return term_tex(Sub(t.base, t.sub), None)
    if isinstance(t, f.Sup):
        return symbols(t.base) + "^{" + symbols(t.exp) + "}"
    if isinstance(t, f.Hat):
        return r"\hat{" + symbols(t.base) + "}"
    if isinstance(t, f.Root):
        return r"\sqrt{" + symbols(t.arg) + "}"
    if isinstance(t, f.Fn):
        return FORMULA_FUNCTIONS.get(t.text, r"\operatorname{" + text(t.text) + "}")
    if isinstance(t, f.Num):
        return _cell(t.text())
    if isinstance(t, (f.Words, f.Data)):
        return in_math(t.text)
    return r"\text{head}_{" + ("h" if head is None else str(head)) + "}"


def formula_tex(terms: Sequence[f.Term], head: int | None = None) -> str:
    """Terms of a formula as LaTeX math."""
    return "".join(formula_term_tex(t, head) for t in terms)


def remark_tex(terms: Sequence[f.Term], head: int | None = None) -> str:
    """A formula's remark for LaTeX's text mode: its words as (breakable) text, its symbols as $math$."""
    out = []
    for t in terms:
        if isinstance(t, (f.Words, f.Data, f.Sym, f.Num, f.Fn)):
            out.append(breakable(f.term_text(t)))
        else:
            out.append("$" + formula_term_tex(t, head) + "$")
    return "".join(out)


def step_tex(st: Step) -> str:
    """``st``'s formula as LaTeX math: the equation its parameters write (attncli.core.params, attncli.core.chain),
    never its display text."""
    return formula_tex(st.terms().eq, st.head)


STEP_SYMBOLS = {"scores": r"S = Q K^{\top}", "scaled": "S'", "masked": r"S'_{\text{masked}}",
                "weights": r"A = \operatorname{softmax}(S')", "output": "A V"}


def blocks(trace: Trace, opts: RenderOptions) -> list[tuple[str, Any]]:
    """The document as ('heading' | 'heading2' | 'score' | 'step' | 'para' | 'math' | 'lines', content) blocks, for LaTeX
    and Markdown alike: the score's and each step's formula are written from their names and parameters
    (SCORE_ELEMENT, step_tex), never read back from their display text."""
    out: list[tuple[str, Any]] = []
    meta = trace.meta
    out.append(("heading", f"Attention, step by step ({meta.score or 'attention'})"))
    if meta.score:
        out.append(("score", meta.score))  # the score's formula, written from its name (SCORE_ELEMENT)
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
        heading = ("input", name, "X: Q = K = V" if same and name == "q" else title)  # written from the name
        out.extend(_step_blocks(trace, heading, symbol, a, axes, p, None, opts))
    for k, st in enumerate((s for s in trace.steps if wanted is None or s.name in wanted), 1):
        a = np.atleast_2d(st.numpy())
        hid = (marked if st.axes == (QUERIES, KEYS) and marked is not None and marked.shape == a.shape
               and st.name in ("weights", "hard", "dropout") else None)
        if hid is not None:
            hid = hid & (a == 0)  # a finite fill leaves masked keys a weight: written as it is
        sym = STEP_SYMBOLS.get(st.name, in_math(st.name))
        out.extend(_step_blocks(trace, ("step", k, st), sym, a, st.axes, p, hid, opts))
    for e in explanations(trace, opts) if "weights" in trace else []:
        out.append(("heading2", e["heading"]))
        out.append(("lines", e["lines"]))
    return out


def _step_blocks(trace: Trace, title: str | tuple[Any, ...], symbol: str, a: np.ndarray, axes: Any, p: int,
                 hid: np.ndarray | None, opts: RenderOptions) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("heading2", title) if isinstance(title, str) else title[:1] + (title[1:],)]
    lead = a.shape[:-2]
    entries = list(np.ndindex(*lead)) if lead else [()]
    rows, legend = short_labels(_labels(trace, axes[0], a.shape[-2]))
    cols, more = short_labels(_labels(trace, axes[1], a.shape[-1]))
    legend += [x for x in more if x not in legend]
    limit = len(entries) if opts.full else MAX_ENTRIES
    for idx in entries[:limit]:
        tex, names = matrix(a[idx], rows, cols, p, hid[idx] if hid is not None else None, opts.full)
        where = (panel_title(trace, idx) if "weights" in trace and len(idx) == len(trace.weights.shape[:-2])
                 else ", ".join(map(str, idx)))  # --steps without the weights: the entry's indices
        label = f"{symbol}\\;[{in_math(where)}]" if idx else symbol
        out.append(("math", f"{label} =\n{tex}"))
        out.append(("para", f"columns ({axes[1]}): {names}" + (f"; {where}" if idx else "")))
    if len(entries) > limit:
        out.append(("para", f"… {len(entries) - limit} more not written (--full writes every one)"))
    if legend:
        out.append(("para", "labels shortened above: " + "; ".join(f"{short} = {full}" for short, full in legend)))
    return out


LABEL_MAX = 16  # characters of a label written whole in a matrix; a longer one is shortened, with a legend


def short_labels(labels: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``labels`` with those longer than LABEL_MAX shortened to their start and '…' (made unique with the
    position), and the legend of the shortened ones: (short, full)."""
    shorts = [x if len(x) <= LABEL_MAX else x[:LABEL_MAX - 4] + "…" for x in labels]
    shared = {x for x in shorts if shorts.count(x) > 1} | {x for x, full in zip(shorts, labels) if x != full and x in labels}
    out: list[str] = []
    legend: list[tuple[str, str]] = []
    for k, (x, short) in enumerate(zip(labels, shorts)):
        if short in shared and short != x:
            short = f"{x[:LABEL_MAX - 8]}…{k}"  # shortened alike: told apart by their position
        out.append(short)
        if short != x:
            legend.append((short, x))
    return out, legend


def latex_document(trace: Trace, opts: RenderOptions) -> str:
    parts = [r"\documentclass[11pt]{article}", r"\usepackage[utf8]{inputenc}", r"\usepackage{amsmath,amssymb}",
             r"\usepackage[margin=1.5cm]{geometry}", r"\allowdisplaybreaks",
             r"\sloppy", r"\begin{document}"]  # \sloppy: a paragraph of long labels breaks, never overflows
    for kind, content in blocks(trace, opts):
        if kind == "heading":
            parts.append(r"\section*{" + heading_tex(content, trace) + "}")
        elif kind == "heading2":
            parts.append(r"\subsection*{" + heading_tex(content, trace) + "}")
        elif kind == "input":  # an input: Q, K, V (its title is text), or a score weight by name (math)
            name, title = content
            parts.append(r"\subsection*{" + (breakable(title) if name in ("q", "k", "v") else
                                               "$" + step_symbol(name) + "$") + "}")
        elif kind == "step":  # a step: its name, and its formula written from its parameters (step_tex)
            k, st = content
            parts.append(r"\subsection*{" + f"{k}. $" + step_tex(st) + "$" + remark_tex(st.terms().remark, st.head) + "}")
        elif kind == "score":
            parts.append(f"Score: {text(content)}, $s_{{ij}} = {SCORE_ELEMENT.get(content, SCORE_ANY)}$\n")
        elif kind == "para":  # text (label lists among it): never read as math
            parts.append(breakable(content) + "\n")
        elif kind == "math":
            size = font_size(content)
            display = "\\[\n" + content + "\n\\]"
            parts.append(display if size is None else "{" + size + "\n" + display + "\\par}")
        elif kind == "lines":
            parts.append("{\\small\n\\begin{align*}\n" + aligned_lines(content, trace) + "\n\\end{align*}}")
    parts.append(r"\end{document}")
    return "\n".join(parts) + "\n"


LINE_CHARS = 92  # characters of an --explain line set on one line of the page (\small, A4 less 3 cm)
BREAKS = (" = ", " + ", "    = ", " / ")  # terms a long line is broken before, best first


def split_terms(terms: Sequence[Term], limit: int = LINE_CHARS) -> list[list[Term]]:
    """A long --explain line's terms as pieces of at most ``limit`` characters where it can be: broken before a
    ' = ' or ' + ' term, outside parentheses when it can (a piece starts with its operator)."""
    pieces: list[list[Term]] = []
    rest = list(terms)
    while sum(len(term_text(t)) for t in rest) > limit:
        spots, depth, pos = [], 0, 0
        for k, t in enumerate(rest):
            tx = term_text(t)
            if k and isinstance(t, str) and limit // 3 <= pos <= limit:
                spots += [(depth > 0, rank, -pos, k) for rank, d in enumerate(BREAKS) if tx.startswith(d)]
            if k and isinstance(t, (Vector, Gap, Label, Words)) and limit // 3 <= pos <= limit:  # else between terms
                spots.append((depth > 0, len(BREAKS), -pos, k + isinstance(t, Gap)))
            if isinstance(t, str):
                depth += tx.count("(") + tx.count("[") - tx.count(")") - tx.count("]")
            pos += len(tx)
        if not spots:
            break
        cut = min(spots)[3]
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return [*pieces, rest]


def aligned_lines(content: list[Line], trace: Trace | None) -> str:
    """The lines of an explanation as the rows of an align*/aligned block, each written from its terms, long ones
    broken (continued indented by a \\qquad)."""
    rows = []
    for line in content:
        terms = line.terms if isinstance(line, Line) else (Words(str(line)),)
        for k, piece in enumerate(split_terms(terms)):
            rows.append(("& " if k == 0 else r"& \qquad ") + line_tex(piece, trace))
    return " \\\\\n".join(rows)


TEXT_WIDTH = 500.0  # pt a display may take: A4 (597 pt) less 1.5 cm margins each side, and a little room
SIZES = ((None, 1.0), (r"\small", 10 / 10.95), (r"\footnotesize", 9 / 10.95), (r"\scriptsize", 8 / 10.95),
         (r"\tiny", 6 / 10.95))


def font_size(tex: str) -> str | None:
    """The largest font size (None: the document's) at which the display ``tex`` (a label, a bmatrix and its row
    labels) fits the text width, by an estimate of its width."""
    for size, scale in SIZES:
        if fits(tex, scale):
            return size
    return SIZES[-1][0]


def fits(tex: str, scale: float) -> bool:
    glyphs, gaps = display_width(tex)
    return glyphs * scale + gaps <= TEXT_WIDTH


def display_width(tex: str) -> tuple[float, float]:
    """Width in points of a display ('SYMBOL =', a bmatrix, a matrix of row labels): (its glyphs at 11 pt,
    which scale with the font size; the gaps between columns, which do not)."""
    head, _, rest = tex.partition("\\begin{bmatrix}\n")
    body, _, labels = rest.partition("\n\\end{bmatrix}")
    columns: list[float] = []
    for row in body.split(" \\\\\n"):
        for j, cell in enumerate(row.split(" & ")):
            w = _cell_width(cell.strip())
            columns += [0.0] * (j + 1 - len(columns))
            columns[j] = max(columns[j], w)
    label_texts = labels.partition("\\begin{matrix}")[2].partition("\\end{matrix}")[0].split(" \\\\ ")
    label_w = max((_plain_width(x) - 5.5 * x.count("\\text{") for x in label_texts), default=0.0)
    return _plain_width(head) + sum(columns) + 15.0 + label_w, 10.0 * len(columns) + 20.0


def _cell_width(cell: str) -> float:
    mant, times, exp = cell.partition(r"\times 10^{")
    if cell in (r"\cdots", r"\ddots"):
        return 13.0
    return _plain_width(mant) + (20.0 + 4.0 * len(exp.strip("}")) if times else 0.0)


def _plain_width(tex: str) -> float:
    """About 5.5 pt per character written (commands and braces not counted, a command as one character)."""
    count, i = 0, 0
    while i < len(tex):
        if tex[i] == "\\" and tex[i + 1:i + 2].isascii() and tex[i + 1:i + 2].isalpha():  # a command: one character
            i += 1
            while i < len(tex) and tex[i].isascii() and tex[i].isalpha():
                i += 1
            while i < len(tex) and tex[i].isspace():
                i += 1
            count += 1
            continue
        count += tex[i] not in "{};"
        i += 1
    return 5.5 * count


def markdown_document(trace: Trace, opts: RenderOptions) -> str:
    parts = []
    for kind, content in blocks(trace, opts):
        if kind == "heading":
            parts.append(f"## {_md(content)}\n")
        elif kind == "heading2":
            parts.append(f"### {_md(content)}\n")
        elif kind == "input":
            name, title = content
            parts.append(f"### {_md(title)}\n")
        elif kind == "step":
            k, st = content
            parts.append(f"### {k}. $" + escape.markdown_math(step_tex(st)) + "$" + _md(f.text(st.terms().remark, st.head))
                         + "\n")
        elif kind == "para":
            parts.append(_md(content) + "\n")
        elif kind == "score":
            parts.append(f"Score: {_md(content)}, $s_{{ij}} = " + escape.markdown_math(SCORE_ELEMENT.get(content, SCORE_ANY))
                         + "$\n")
        elif kind == "math":
            parts.append("$$\n" + escape.markdown_math(content) + "\n$$\n")
        elif kind == "lines":
            parts.append("$$\n" + escape.markdown_math("\\begin{aligned}\n" + aligned_lines(content, trace)
                                                       + "\n\\end{aligned}") + "\n$$\n")
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
