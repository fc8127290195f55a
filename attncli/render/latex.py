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

from collections.abc import Callable, Sequence
from itertools import groupby
from typing import IO, Any

import numpy as np

from attncli.core.diagnostics import masked_cells
from attncli.core.params import Clip, Dropout, Gating, Normalise, Projection, Rotation, Softmax, Tuning
from attncli.core.trace import FEATURES, KEYS, QUERIES, Step, Trace
from attncli.render import RenderOptions, escape, output_format, saver
from attncli.render.explain import explanations
from attncli.render.numbers import all_whole, column_format
from attncli.render.plot import panel_title
from attncli.render.terminal import INPUT_TITLES, axis_labels, seed_note, shown
from attncli.render.terms import Fn, Formula, Gap, Label, Line, Name, Num, Root, ScoreFormula, Sub, Term, Vector, Words, term_text

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
            k = trace.names().index(t.step)
            return step_tex(trace.step(t.step), trace.steps[k - 1].name if k else "x", trace)
        return in_math(t.text)
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


# ---- each step's formula in LaTeX, written from its name and typed parameters (never from its text) ----

SCORE_TEX = {"dot": r"Q K^{\top}", "scaled-dot": r"Q K^{\top}", "general": r"Q W K^{\top}",
             "additive": r"w_v^{\top} \operatorname{act}(W_q q_i + W_k k_j + b)", "cosine": r"\hat{Q} \hat{K}^{\top}",
             "gaussian": r"-\frac{\|q_i - k_j\|^{2}}{2\sigma^{2}}", "location": r"\operatorname{act}(K W + b)"}
SCORE_ELEMENT = {"dot": r"q_i \cdot k_j", "scaled-dot": r"q_i \cdot k_j / \sqrt{d}", "general": r"q_i^{\top} W k_j",
                 "additive": r"w_v^{\top} \operatorname{act}(W_q q_i + W_k k_j + b)",
                 "cosine": r"\frac{q_i \cdot k_j}{\|q_i\| \, \|k_j\|}", "gaussian": r"-\frac{\|q_i - k_j\|^{2}}{2\sigma^{2}}",
                 "location": r"\operatorname{act}(W^{\top} k_j + b)"}
SCORE_ANY = r"\operatorname{score}(q_i, k_j)"
NORM_TEX = {"rms": r"w \odot \frac{{x}}{{\sqrt{{\operatorname{{mean}}({x}^{{2}}) + {eps}}}}}",
            "rms1p": r"(1 + w) \odot \frac{{x}}{{\sqrt{{\operatorname{{mean}}({x}^{{2}}) + {eps}}}}}",
            "rms-full": r"w \odot \frac{{x}}{{\sqrt{{\operatorname{{mean}}_{{H d}}({x}^{{2}}) + {eps}}}}}",
            "layernorm": r"w \odot \frac{{{x} - \mu}}{{\sqrt{{\sigma^{{2}} + {eps}}}}} + b",
            "layernorm1p": r"(1 + w) \odot \frac{{{x} - \mu}}{{\sqrt{{\sigma^{{2}} + {eps}}}}} + b"}


def step_symbol(name: str) -> str:
    """A step's name as a math symbol: W_q -> W_{q}, q_rot -> q_{\\text{rot}}, a word (scores) as text."""
    base, _, sub = str(name).partition("_")
    if len(base) == 1 and sub:
        return base + "_{" + (sub if len(sub) == 1 else r"\text{" + text(sub) + "}") + "}"
    return name if len(name) == 1 else r"\text{" + text(str(name)) + "}"


def _num(x: float) -> str:
    return _cell(f"{x:.6g}")


def step_tex(st: Step, prev: str, trace: Trace) -> str:
    """``st``'s formula as LaTeX math, from its name and parameters (attncli.core.params, attncli.core.chain);
    ``prev``: the step before it."""
    p, n, x = st.params, str(st.name), step_symbol(prev)
    y = step_symbol(n)
    rule = STEP_TEX.get(n)
    body = rule(p, x, trace) if rule is not None else None
    if body is None:
        return y
    return f"{y} = {body}"


def _projection(p: Any, x: str, t: Trace) -> str | None:
    if not isinstance(p, Projection):
        return None
    inp = {"X": "X", "Y": "Y", "Z": "Z"}.get(p.input, step_symbol(p.input))
    return f"{inp} {step_symbol(p.weight)}" + (f" + {step_symbol(p.bias)}" if p.bias else "")


def _clip(p: Any, x: str, t: Trace) -> str | None:
    return rf"\operatorname{{clamp}}({step_symbol(p.before)}, -{_num(p.c)}, {_num(p.c)})" if isinstance(p, Clip) else None


def _norm(of: str) -> Callable[[Any, str, Trace], str | None]:
    def rule(p: Any, x: str, t: Trace) -> str | None:
        if not isinstance(p, Normalise):
            return None
        return NORM_TEX.get(p.kind, NORM_TEX["rms"]).format(x=of, eps=_num(p.eps))
    return rule


def _rotation(of: str) -> Callable[[Any, str, Trace], str | None]:
    def rule(p: Any, x: str, t: Trace) -> str | None:
        r = p if isinstance(p, Rotation) else None
        x = _rotated(of, x, t)
        base = _num(r.base) if r is not None else r"\theta_0"
        turn = r"\operatorname{rotate\_half}" if r is None or r.mode == "half" else r"\operatorname{rotate\_pairs}"
        return (rf"{x} \odot \cos\theta + {turn}({x}) \odot \sin\theta,\ \theta_{{i,k}} = (P + i)\, "
                rf"{base}^{{-2k/r}}")
    return rule


def _rotated(of: str, x: str, t: Trace) -> str:
    """The row RoPE turns: the last of ``of``'s steps before ``of``_rot (q, q_clip, q_norm), not the step written
    just before it (k_norm comes between q_norm and q_rot); ``x`` when the trace has none."""
    names = list(t.names())
    if f"{of}_rot" not in names:
        return x
    before = names[:names.index(f"{of}_rot")]
    return next((step_symbol(n) for n in reversed(before) if n == of or n.startswith(of + "_")), x)


def _tuning(p: Any, x: str, t: Trace) -> str | None:
    if not isinstance(p, Tuning):
        return None
    return (rf"q_i \left(\log\left(\left\lfloor \frac{{P + i + 1}}{{{_num(p.floor)}}} \right\rfloor + 1\right) "
            rf"{_num(p.scale)} + 1\right)")


def _scores(p: Any, x: str, t: Trace) -> str | None:
    return SCORE_TEX.get(t.meta.score or "", r"\operatorname{score}(Q, K)")


def _scaled(p: Any, x: str, t: Trace) -> str | None:
    tau = getattr(p, "temperature", None)
    f = getattr(p, "factor", None)
    body = rf"{x} \cdot {_num(float(f))}" if isinstance(f, (int, float)) else rf"{x} \cdot f({x})"
    return body + (rf" / {_num(tau)}" if tau not in (None, 1.0) else "")


def _capped(p: Any, x: str, t: Trace) -> str | None:
    c = _num(p.c) if hasattr(p, "c") else "c"
    return rf"{c} \tanh({x} / {c})"


def _bias(p: Any, x: str, t: Trace) -> str | None:
    terms = [x]
    if getattr(p, "alibi", None) is not None:
        terms.append(r"m_h (j - (P + i))")
    if getattr(p, "relative", None) is not None:
        terms.append(r"b_h(\operatorname{bucket}(j - i))")
    return " + ".join(terms) if len(terms) > 1 else rf"{x} + \text{{bias}}"


def _masked(p: Any, x: str, t: Trace) -> str | None:
    fill = r"-\infty" if not hasattr(p, "fill") or p.fill == -np.inf else _num(p.fill)
    return rf"{x}_{{ij}} \text{{ if key $j$ is kept for query $i$, else }} {fill}"


def _softmax(p: Any, x: str, t: Trace) -> str | None:
    before = step_symbol(p.before) if isinstance(p, Softmax) else x
    if isinstance(p, Softmax) and p.sinks:
        return rf"\frac{{\exp({before}_{{ij}})}}{{\exp(\text{{sink}}_h) + \sum_j \exp({before}_{{ij}})}}"
    return rf"\operatorname{{softmax}}_j({before})"


def _sink(p: Any, x: str, t: Trace) -> str | None:
    return rf"\frac{{\exp(\text{{sink}}_h)}}{{\exp(\text{{sink}}_h) + \sum_j \exp({x}_{{ij}})}}"


def _hard(p: Any, x: str, t: Trace) -> str | None:
    return rf"\operatorname{{onehot}}(\operatorname{{argmax}}_j {x}_{{ij}})"


def _dropout(p: Any, x: str, t: Trace) -> str | None:
    pr = _num(p.p) if isinstance(p, Dropout) else "p"
    return rf"{x} \odot \text{{keep}} / (1 - {pr})"


def _weighted(p: Any, x: str, t: Trace) -> str | None:
    return rf"{step_symbol(t.meta.weights_step or 'weights')} \, V"


def _output(p: Any, x: str, t: Trace) -> str | None:
    if isinstance(p, Projection):
        return f"{step_symbol(p.input)} W_{{o}}" + (" + b_{o}" if p.bias else "")
    return _weighted(p, x, t) if "concat" not in t else _concat(p, x, t)


def _concat(p: Any, x: str, t: Trace) -> str | None:
    return r"[\text{head}_0 \;\cdots\; \text{head}_{H-1}]"


def _gate(p: Any, x: str, t: Trace) -> str | None:
    act = p.act if isinstance(p, Gating) else "act"
    src = step_symbol(p.input) if isinstance(p, Gating) else "X"
    return rf"\operatorname{{{act}}}({src} W_{{g}})"


STEP_TEX: dict[str, Callable[[Any, str, Trace], str | None]] = {
    "x_norm": _norm("X"), "q": _projection, "k": _projection, "v": _projection,
    "q_clip": _clip, "k_clip": _clip, "v_clip": _clip, "q_norm": _norm("q"), "k_norm": _norm("k"),
    "q_rot": _rotation("q"), "k_rot": _rotation("k"), "q_temp": _tuning,
    "q_proj": lambda p, x, t: "q W_{q}", "k_proj": lambda p, x, t: "k W_{k}",
    "features": lambda p, x, t: r"\operatorname{act}(q_i W_q + k_j W_k + b)",
    "sq_dist": lambda p, x, t: r"\|q_i - k_j\|^{2}",
    "scores": _scores, "scaled": _scaled, "capped": _capped, "alibi": _bias, "bias": _bias, "masked": _masked,
    "sink": _sink, "softmax": _softmax, "weights": _softmax, "hard": _hard, "dropout": _dropout,
    "head_output": _weighted, "output": _output, "concat": _concat,
    "sub_norm": _norm(r"\text{concat}"), "gate": _gate,
    "gated": lambda p, x, t: r"\text{concat} \odot \text{gate}",
    "avg_weights": lambda p, x, t: r"\frac{1}{H} \sum_h \text{weights}_h",
}


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
        prev = trace.steps[trace.steps.index(st) - 1].name if trace.steps.index(st) else "x"
        out.extend(_step_blocks(trace, ("step", k, st, prev), sym, a, st.axes, p, hid, opts))
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
            k, st, prev = content
            parts.append(r"\subsection*{" + f"{k}. $" + step_tex(st, prev, trace) + "$}")
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
            k, st, prev = content
            parts.append(f"### {k}. $" + escape.markdown_math(step_tex(st, prev, trace)) + "$\n")
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
