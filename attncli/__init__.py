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

        return attend
    if name == "Trace":
        from attncli.core.trace import Trace

        return Trace
    raise AttributeError(name)
