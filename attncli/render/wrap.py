"""Lines of text that fit the terminal: broken at spaces only, never inside a word, a number or a
formula token (``10000^(-2k/8)``, ``1.400e-1``, ``[[2,3,4,5]]``), and a short bracketed group such
as ``exp(4 − 4)`` or ``(0, 1.2500, 2.7500, 0)`` kept on one line. Continuation lines hang: they
are indented past the line's own indent, so a wrapped sentence reads as one item.

One helper for every view that prints prose: ``--explain``, the ``check`` report, the notes under
tables, the examples list.
"""

from __future__ import annotations

import re
from typing import Any

from rich.cells import cell_len

HANG = 4  # continuation lines are indented this much past the first line's indent
GLUE = 32  # a bracketed group up to this many characters is never broken
_OPEN, _CLOSE = "([{", ")]}"
_SPACE = re.compile(r"\s+")
_ALIGNED = re.compile(r"( *\S.*?\s{2,})\S")  # '  computed as    X': X's column
OPERATORS = set("=+-−×·/÷Σ∑→<>≤≥≈*^|")  # a token of these alone stays with what follows it


def _glued(text: str) -> list[bool]:
    """For each character: whether a space there lies inside a short bracketed group."""
    glued = [False] * len(text)
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch in _OPEN:
            stack.append(i)
        elif ch in _CLOSE and stack:
            start = stack.pop()
            if i - start < GLUE:
                for j in range(start, i):
                    glued[j] = True
    return glued


def pieces(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each token of ``text``: tokens hold no space except inside a short
    bracketed group, and an operator token ('Σ', '=', '/') is one with the token after it."""
    glued = _glued(text)
    out: list[tuple[int, int]] = []
    pos = 0
    for m in _SPACE.finditer(text):
        if glued[m.start()]:
            continue
        if m.start() > pos:
            out.append((pos, m.start()))
        pos = m.end()
    if pos < len(text):
        out.append((pos, len(text)))
    merged: list[tuple[int, int]] = []
    last = ""
    for a, b in out:  # 'Σ exp(x)', '= 0.25': an operator opens what follows, never ends a line
        if merged and set(last) <= OPERATORS:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
        last = text[a:b]
    return merged


def hanging_indent(line: str, hang: int = HANG, align: bool = False) -> int:
    """The indent of continuation lines: the line's indent plus ``hang``, or with ``align`` the column
    where a '  label     value' line's value starts."""
    lead = len(line) - len(line.lstrip(" "))
    if align and (m := _ALIGNED.match(line)):
        return m.end(1)
    return lead + hang


def spans(line: str, width: int, hang: int = HANG, align: bool = False) -> tuple[list[tuple[int, int]], int]:
    """Where ``line`` breaks to fit ``width`` cells: the (start, end) of each output line's text in
    ``line`` (the first keeps the line's indent) and the indent of the continuations."""
    indent = min(hanging_indent(line, hang, align), max(width // 2, 0))
    if width <= 0 or cell_len(line) <= width:
        return [(0, len(line))], indent
    out: list[tuple[int, int]] = []
    start, end = 0, 0
    for a, b in pieces(line):
        room = width - (0 if not out else indent)
        if end > start and cell_len(line[start:b]) > room and (out or line[start:a].strip()):
            out.append((start, end))
            start = a
        end = b
    out.append((start, end))
    return out, indent


def wrap(line: str, width: int, hang: int = HANG, align: bool = False) -> list[str]:
    """``line`` broken at spaces into lines of at most ``width`` cells (a single token wider than that
    stays whole on a line of its own); continuations indented ``hang`` past the line's indent (with
    ``align``: under the value of a '  label   value' line)."""
    where, indent = spans(line, width, hang, align)
    return [line[a:b].rstrip() if k == 0 else " " * indent + line[a:b].rstrip() for k, (a, b) in enumerate(where)]


def say(console: Any, line: Any, style: str | None = None, hang: int = HANG, align: bool = False) -> None:
    """Print ``line`` (a str, or a rich Text whose styles are kept) wrapped to ``console``'s width:
    rich's own wrapping would lose the indent and may break inside a token. A str is plain text
    (labels like [milk, d2] are not markup)."""
    from rich.text import Text

    text = line if isinstance(line, Text) else Text(line, style=style or "")
    for part in text.split("\n", allow_blank=True):
        where, indent = spans(part.plain, console.width, hang, align)
        for k, (a, b) in enumerate(where):
            piece = part[a:b]
            piece.rstrip()
            console.print(piece if k == 0 else Text(" " * indent) + piece, soft_wrap=True)
