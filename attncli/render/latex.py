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
from collections.abc import Callable
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
# a word: two letters or more (not a subscript's: s_ij, d_model), or a one-letter English word before a word
_WORD = rf"(?<![\w\x05])[{LETTER}]{{2,}}[{LETTER}0-9]*(?:-[{LETTER}]{{2,}}[{LETTER}0-9]*)*[',;:.]?"  # scaled-dot too
_ONE_LETTER_WORD = rf"(?<![\w(\x05])[aAI](?=\s+[{LETTER}]{{2}})"
WORDS = re.compile(rf"((?:\s*(?:{_WORD}|{_ONE_LETTER_WORD}))+\s*)")
ROOT = re.compile(r"√\(?([\w.]+)\)?")
SUB_SUP = re.compile(r"([_^])(?![\w(\x05\x07])")
SUBSCRIPT = re.compile(r"(?<=[A-Za-z0-9)])_([A-Za-z0-9]+)")  # s_ij, d_model: a subscript of letters and digits
SUPERSCRIPT = re.compile(r"\^\(([^()]*)\)")  # 10000^(-2k/8): the whole parenthesis is the exponent
SCIENTIFIC = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)e([+-]?\d+)(?![\w.])")  # 5.989e-6, -1e+06
INFINITY = re.compile(r"(?<![\w.])inf(?![\w])")
ASCII_MATH = (("->", "→"), ("<=", "≤"), (">=", "≥"), ("...", "…"), (") x (", ") × ("))
SQRT = re.compile(r"\bsqrt\(([\w.]+)\)")  # sqrt(d) -> √(d), then \sqrt{d}


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


def _normalised(line: str) -> str:
    """An --explain line or a formula with its ASCII math spelled as the symbols it means (-> is →, sqrt(d) is
    √(d), 5.989e-6 a power of ten, inf ∞), after escaping the terminal's controls."""
    line = escape.terminal(line)
    for a, b in ASCII_MATH:
        line = line.replace(a, b)
    line = SQRT.sub(r"√(\1)", line)
    line = INFINITY.sub("∞", line)
    return SCIENTIFIC.sub(lambda m: f"{m.group(1)}\x0e{int(m.group(2))}\x0f", line)


def _labelled(line: str, labels: tuple[str, ...]) -> list[tuple[bool, str]]:
    """``line`` cut into (is a label, text) pieces: a label (from a file: data, whatever its characters, such as
    u_alpha or c^hotel) is set as text, never read as math. Labels that are numbers or one letter are left to the
    formula (they cannot be told from it)."""
    names = sorted({x for x in labels if len(x) > 1 and not _number(x)}, key=len, reverse=True)
    if not names:
        return [(False, line)]
    pattern = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, names)) + r")(?![\w])")
    out: list[tuple[bool, str]] = []
    last = 0
    for m in pattern.finditer(line):
        out += [(False, line[last:m.start()]), (True, m.group(1))]
        last = m.end()
    return [*out, (False, line[last:])]


def _number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def math_text(line: str, labels: tuple[str, ...] = ()) -> str:
    """A line of --explain (or a formula) as LaTeX math: words and ``labels`` in \\text{}, symbols as commands,
    subscripts braced, e-notation as powers of ten."""
    return "".join(in_math(part) if label else _math(_normalised(part))
                   for label, part in _labelled(escape.terminal(line), labels))


def _math(line: str) -> str:
    line = ROOT.sub(lambda m: f"\x00{m.group(1)}\x01", line)  # √4 -> \sqrt{4}
    line = SUPERSCRIPT.sub(lambda m: f"\x07{m.group(1)}\x08", line)
    line = SUBSCRIPT.sub(lambda m: f"\x05{m.group(1)}\x06", line)
    line = re.sub(r"\s{2,}", "\x02", line)  # a gap between the text's columns: \quad
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
                   .replace("\x03", r"\_").replace("\x04", r"\hat{}").replace("\x07", "^{").replace("\x08", "}")
                   .replace("\x0e", r"\times 10^{").replace("\x0f", "}"))
    return re.sub("\x05([^\x06]*)\x06", _subscript, "".join(out))


def _subscript(m: re.Match[str]) -> str:
    body = m.group(1)
    return "_{" + (r"\text{" + body + "}" if len(body) > 2 and body.isalpha() else body) + "}"


MATHY = re.compile(r"[A-Za-z=+\-*/^_<>|\\\x00-\x1f]|[^\x00-\x7f]")  # a piece with these is a formula


IDENTIFIER = re.compile(r"(?<![\w\\])([A-Za-z]{2,}_[A-Za-z0-9_]+)(?![\w])")  # a step's name: avg_weights, head_0


def _identifiers(part: str) -> list[tuple[bool, str]]:
    """``part`` cut into (False, text) pieces, a step's name (avg_weights) a piece of its own."""
    return [(False, x) for x in IDENTIFIER.split(part) if x]


def mixed(s: str, labels: tuple[str, ...] = ()) -> str:
    """Text with formulas in it (a step's title, the score's formula) for LaTeX's text mode: the words (and
    ``labels``) as text, breakable, the formulas between them in math mode ($...$)."""
    out: list[str] = []
    formula = ""  # the formula being gathered (raw), set in math when text follows

    def flush() -> None:
        nonlocal formula
        if formula.strip():
            body = formula.rstrip()
            out.append("$" + _math(body) + "$" + formula[len(body):])
        else:
            out.append(formula)
        formula = ""

    for label, part in (x for y, p in _labelled(escape.terminal(s), labels)
                        for x in ([(y, p)] if y else _identifiers(p))):
        if label or IDENTIFIER.fullmatch(part):
            flush()
            out.append(breakable(part))
            continue
        for k, piece in enumerate(WORDS.split(_normalised(part))):
            if k % 2 and piece.strip() in FUNCTIONS:  # softmax(...), exp(...): part of the formula
                formula += piece
            elif k % 2 or not MATHY.search(piece):
                if formula and not piece.strip():
                    formula += piece
                    continue
                flush()
                out.append(breakable(piece))
            else:
                lead, body, trail = re.fullmatch(r"(\s*)(.*?)([\s,;:.]*)", piece, flags=re.S).groups()  # type: ignore[union-attr]
                if not formula:
                    out.append(lead)
                    lead = ""
                formula += lead + body
                if trail:
                    flush()
                    out.append(breakable(trail))
    flush()
    return "".join(out)


LONG_WORD = 24  # characters of a word without spaces (a long label) before LaTeX may break it


def breakable(s: str) -> str:
    """Text for LaTeX's text mode, words longer than LONG_WORD characters allowed to break every 16."""
    words = re.split(r"(\s+)", s)
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
        base = _num(r.base) if r is not None else r"\theta_0"
        turn = r"\operatorname{rotate\_half}" if r is None or r.mode == "half" else r"\operatorname{rotate\_pairs}"
        return (rf"{x} \odot \cos\theta + {turn}({x}) \odot \sin\theta,\ \theta_{{i,k}} = (P + i)\, "
                rf"{base}^{{-2k/r}}")
    return rule


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
    labels = trace_labels(trace)
    parts = [r"\documentclass[11pt]{article}", r"\usepackage[utf8]{inputenc}", r"\usepackage{amsmath,amssymb}",
             r"\usepackage[margin=1.5cm]{geometry}", r"\allowdisplaybreaks",
             r"\sloppy", r"\begin{document}"]  # \sloppy: a paragraph of long labels breaks, never overflows
    for kind, content in blocks(trace, opts):
        if kind == "heading":
            parts.append(r"\section*{" + mixed(content, labels) + "}")
        elif kind == "heading2":
            parts.append(r"\subsection*{" + mixed(content, labels) + "}")
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
            parts.append("{\\small\n\\begin{align*}\n" + aligned_lines(content, labels) + "\n\\end{align*}}")
    parts.append(r"\end{document}")
    return "\n".join(parts) + "\n"


def trace_labels(trace: Trace) -> tuple[str, ...]:
    """The query and key labels an explanation may name (given, or the q0, k1 the views write)."""
    if "weights" not in trace:
        return tuple(trace.query_labels or ()) + tuple(trace.key_labels or ())
    m, n = trace.weights.shape[-2:]
    return tuple(axis_labels(trace, QUERIES, m)) + tuple(axis_labels(trace, KEYS, n))


LINE_CHARS = 92  # characters of an --explain line set on one line of the page (\small, A4 less 3 cm)
BREAKS = (" = ", " + ", "; ", ", ", " ")  # where a long line is broken, best first (outside parentheses first)


def split_line(line: str, limit: int = LINE_CHARS) -> list[str]:
    """A long --explain line as pieces of at most ``limit`` characters where it can be: broken before '=' or
    '+', else after a comma, else at a space, outside parentheses when it can; a piece starts with its operator."""
    pieces = []
    while len(line) > limit:
        depth, spots = 0, []
        for i, c in enumerate(line):
            depth += (c in "([") - (c in ")]")
            for rank, d in enumerate(BREAKS):
                if line.startswith(d, i) and limit // 3 <= i <= limit:
                    spots.append((depth > 0, rank, -i, i + (len(d) if d in ("; ", ", ") else 0)))
        if not spots:
            break
        cut = min(spots)[3]
        pieces.append(line[:cut].rstrip())
        line = line[cut:].lstrip()
    return [*pieces, line]


def aligned_lines(content: list[str], labels: tuple[str, ...]) -> str:
    """The lines of an explanation as the rows of an align*/aligned block, long ones broken (continued
    indented by a \\qquad)."""
    rows = []
    for line in content:
        for k, piece in enumerate(split_line(line.strip())):
            rows.append(("& " if k == 0 else r"& \qquad ") + math_text(piece, labels))
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
    label_texts = re.findall(r"\\text\{((?:[^{}]|\{[^{}]*\})*)\}", labels)
    label_w = max((_plain_width(x) for x in label_texts), default=0.0)
    return _plain_width(head) + sum(columns) + 15.0 + label_w, 10.0 * len(columns) + 20.0


def _cell_width(cell: str) -> float:
    mant, times, exp = cell.partition(r"\times 10^{")
    if cell in (r"\cdots", r"\ddots"):
        return 13.0
    return _plain_width(mant) + (20.0 + 4.0 * len(exp.strip("}")) if times else 0.0)


def _plain_width(tex: str) -> float:
    """About 5.5 pt per character written (commands and braces not counted, a command as one character)."""
    return 5.5 * len(re.sub(r"\\[A-Za-z]+\s*", "x", tex).replace("{", "").replace("}", "").replace(";", ""))


def markdown_document(trace: Trace, opts: RenderOptions) -> str:
    labels = trace_labels(trace)
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
            parts.append("$$\n" + escape.markdown_math("\\begin{aligned}\n" + aligned_lines(content, labels)
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
