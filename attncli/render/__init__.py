"""Turning a Trace into something to read: terminal tables, JSON, NPZ.

Two registries: ``FORMATS`` (what ``--format`` prints to stdout) and ``SAVERS`` (what
``--save FILE`` writes, by extension). Rendering never computes attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from attncli.core.trace import Trace


@dataclass
class RenderOptions:
    """How to show a trace: decimals, which steps, how much of a big matrix."""

    precision: int = 4
    steps: list[str] | None = None  # None: every step
    full: bool = False  # show every cell of big matrices
    max_rows: int = 12
    max_cols: int = 10
    max_batches: int = 4
    explain: list[str] = field(default_factory=list)  # --explain cells, as typed (QUERY,KEY)
    explain_rows: list[str] = field(default_factory=list)  # --explain-row queries, as typed
    extra: dict[str, Any] = field(default_factory=dict)


Formatter = Callable[[Trace, RenderOptions, Any], None]  # (trace, options, console or stream)
FORMATS: dict[str, Formatter] = {}
Saver = Callable[[Trace, RenderOptions, IO[bytes]], None]
SAVERS: dict[str, Saver] = {}


def output_format(name: str) -> Callable[[Formatter], Formatter]:
    def deco(fn: Formatter) -> Formatter:
        FORMATS[name] = fn
        return fn

    return deco


def saver(*exts: str) -> Callable[[Saver], Saver]:
    def deco(fn: Saver) -> Saver:
        for e in exts:
            SAVERS[e] = fn
        return fn

    return deco


# --format NAME -> the module whose @output_format registers it. The CLI lists these names without importing
# the renderers (numpy, rich: `attncli --help` stays fast); load_renderers imports them, and a test checks
# that they register exactly these formats. A new renderer: its module, and a line here.
FORMAT_MODULES = {"rich": "terminal", "json": "data", "npz": "data", "latex": "latex", "markdown": "latex"}


def load_renderers() -> None:
    """Import the modules that fill the registries (kept out of import time for start-up)."""
    import importlib

    for module in sorted({*FORMAT_MODULES.values(), "explain"}):
        importlib.import_module(f"attncli.render.{module}")
