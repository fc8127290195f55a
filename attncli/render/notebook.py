"""A Trace in a Jupyter notebook: ``_repr_html_`` (attncli.core.trace) asks this module, through the
hook that ``attncli/__init__.py`` sets when ``attncli.attend`` or ``attncli.Trace`` is first used
(core never imports render: imports run downward only).

The cell shows the static page's view (attncli.render.page, or attncli.render.bigpage beyond a page
of tables) in an ``<iframe srcdoc>``, sized for a notebook cell: the page keeps its own styles and
script, and nothing leaks into the notebook's. Labels are escaped twice over: as text in the page,
and the whole page as an attribute value.
"""

from __future__ import annotations

import html

from attncli.core.trace import Trace

HEIGHT = 560  # pixels of the cell's frame


def cell_html(trace: Trace, precision: int = 4) -> str:
    """The notebook cell's HTML for ``trace``: its page in a sandboxed frame (scripts, no same origin)."""
    from attncli.core.diagnostics import attach as diagnose
    from attncli.render.bigpage import big_page, too_big
    from attncli.render.page import page

    if "weights" not in trace:
        return f"<pre>{html.escape(repr(trace.names()))}</pre>"
    if "diagnostics" not in trace.extra:
        diagnose(trace)
    doc = big_page(trace, precision) if too_big(trace) else page(trace, precision)
    return (f'<iframe title="attncli" sandbox="allow-scripts" style="width: 100%; height: {HEIGHT}px; '
            f'border: 1px solid #ddd; border-radius: 4px" srcdoc="{html.escape(doc, quote=True)}"></iframe>')
