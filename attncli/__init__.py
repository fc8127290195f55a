"""attncli: compute attention on matrices you supply, and explain every step.

    import attncli
    trace = attncli.attend(q, k, v, score="scaled-dot", causal=True)     # a Trace: every step, labelled
    layer = attncli.load_layer("./tiny-llama", layer=3)                  # one attention layer of a checkpoint
    trace = layer.attend(x)                                              # the same Trace as `attncli self`
    attncli.Options                                                      # every option, typed

Errors are exceptions of attncli.errors (InputError: bad input, one line naming its source); the library never
exits and installs nothing process-wide.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["attend", "load_layer", "ModelLayer", "Options", "Trace", "errors", "__version__"]

# No import at all here (not even typing): the console script imports this package before its signal
# handlers are in place, so the less it does, the smaller the window where Ctrl-C is Python's own.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from attncli import errors
    from attncli.core.engine import attend
    from attncli.core.options import Options
    from attncli.core.trace import Trace
    from attncli.library import ModelLayer, load_layer


def __getattr__(name: str) -> Any:  # lazy: `attncli --help` need not import the engine
    if name == "attend":
        from attncli.core.engine import attend

        _notebook()
        return attend
    if name == "Trace":
        from attncli.core.trace import Trace

        _notebook()
        return Trace
    if name in ("load_layer", "ModelLayer"):
        from attncli import library

        _notebook()
        return getattr(library, name)
    if name == "Options":
        from attncli.core.options import Options

        return Options
    if name == "errors":
        import importlib

        return importlib.import_module("attncli.errors")
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
