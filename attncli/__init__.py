"""attncli: compute attention on matrices you supply, and explain every step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["attend", "Trace", "__version__"]

if TYPE_CHECKING:
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
