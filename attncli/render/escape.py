r"""One escaping helper per output kind: text that came from a file (a tensor name, ``model_type``, a
folder name, a config value, a label) is data, never markup or a terminal command.

- ``terminal``: control characters (ESC, BEL, newlines), bidi overrides and other invisible format
  characters written visibly, as ``\x1b``, ``\u202e`` (attncli.errors.printable, without a length limit).
- ``html`` / ``xml``: the terminal form, then ``& < > " '`` as entities (an SVG is XML 1.0, which has no
  control characters at all; the terminal form has none left).
- ``latex``: the terminal form in LaTeX's text mode: ``\ { } $ & # % _ ^ ~`` and ``< >`` as commands.
- ``markdown``: the terminal form with every CommonMark special backslash-escaped (``<`` included, so no
  tag, autolink or entity comes alive).
- ``markdown_math``: the inside of a ``$$ … $$`` block made inert for a CommonMark renderer while staying
  the same TeX: a raw ``<``/``>`` (math mode) as ``\lt``/``\gt``, and ``]`` followed by an empty group so that
  ``[text](url)`` is never a link.
"""

from __future__ import annotations

import html as _html
import re
from typing import Any

from attncli.errors import printable

NO_LIMIT = 1 << 62

LATEX_TEXT = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
              "%": r"\%", "_": r"\_", "^": r"\textasciicircum{}", "~": r"\textasciitilde{}",
              "<": r"\textless{}", ">": r"\textgreater{}"}
MARKDOWN_SPECIALS = re.compile(r"([\\`*_{}\[\]<>#+!|$&])")


def terminal(s: object) -> str:
    """``s`` with every non-printable character (C0/C1 controls, bidi overrides, zero-width and other
    format characters, line and paragraph separators) written as its Python escape."""
    return printable(str(s), NO_LIMIT)


def terminal_tree(obj: Any) -> Any:
    """Every string in a JSON-like value (keys included) through ``terminal``: for views printed whole."""
    if isinstance(obj, str):
        return terminal(obj)
    if isinstance(obj, dict):
        return {terminal_tree(k): terminal_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(terminal_tree(v) for v in obj)
    return obj


def html(s: object) -> str:
    """Text for an HTML text node or a quoted attribute."""
    return _html.escape(terminal(s), quote=True)


def xml(s: object) -> str:
    """Text for XML (SVG) character data or a quoted attribute: no control character, no markup."""
    return html(s)


def latex(s: object) -> str:
    """Text for LaTeX's text mode (also inside ``\\text{}`` in math, for LaTeX and KaTeX alike)."""
    return "".join(LATEX_TEXT.get(c, c) for c in terminal(s))


def markdown(s: object) -> str:
    """Text for a CommonMark paragraph or heading: every special character backslash-escaped."""
    return MARKDOWN_SPECIALS.sub(r"\\\1", terminal(s))


def markdown_math(tex: str) -> str:
    """The TeX of a ``$$`` block, made inert for a CommonMark renderer (no tag, no link) without changing
    what KaTeX / MathJax draw."""
    return tex.replace("<", r"\lt ").replace(">", r"\gt ").replace("]", "]{}")
