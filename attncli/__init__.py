"""attncli: compute attention on matrices you supply, and explain every step."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["attend", "Trace", "__version__"]

# No import at all here (not even typing): the console script imports this package before its signal
# handlers are in place, so the less it does, the smaller the window where Ctrl-C is Python's own.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from attncli.core.engine import attend
    from attncli.core.trace import Trace


def __getattr__(name: str) -> Any:  # lazy: `attncli --help` need not import the engine
    if name == "attend":
        from attncli.core.engine import attend

        _notebook()
        return attend
    if name == "Trace":
        from attncli.core.trace import Trace

        _notebook()
        return Trace
    raise AttributeError(name)


def _notebook() -> None:
    """Let a Trace display itself in Jupyter (``_repr_html_``): core.trace holds a hook, filled here with the
    page renderer (the top-level package may import any layer; core never imports render). The renderer
    module is imported only when a notebook first shows a trace."""
    from attncli.core import trace

    if trace.HTML_VIEW is None:
        def cell_html(t: Any) -> str:
            from attncli.render.notebook import cell_html as render

            return render(t)

        trace.HTML_VIEW = cell_html
