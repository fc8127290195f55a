"""The step-by-step terminal view: one titled table per step (and per batch entry).

Big matrices show their corners around an ellipsis; only the cells shown are formatted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from attncli.render import RenderOptions, output_format
from attncli.trace import FEATURES, KEYS, QUERIES, Trace

ELLIPSIS = "…"
INPUT_TITLES = {"q": ("Q: queries", (QUERIES, FEATURES)), "k": ("K: keys", (KEYS, FEATURES)),
                "v": ("V: values", (KEYS, FEATURES))}


def fmt(x: float, precision: int) -> str:
    """A number with a fixed number of decimals (scientific beyond 1e8); ±inf spelled out."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if x != 0 and (abs(x) >= 1e8 or abs(x) < 10.0 ** -precision / 2):
        return f"{x:.{max(precision - 1, 1)}e}"
    return f"{x:.{precision}f}"


def shown(count: int, limit: int, full: bool) -> list[int | None]:
    """Indices to show of ``count``: all, or the first and last halves of ``limit`` with None between."""
    if full or count <= limit:
        return list(range(count))
    head = (limit + 1) // 2
    tail = limit - head
    return [*range(head), None, *range(count - tail, count)]


def axis_labels(trace: Trace, axis: str, count: int) -> list[str]:
    if axis == QUERIES and trace.query_labels:
        return trace.query_labels
    if axis == KEYS and trace.key_labels:
        return trace.key_labels
    prefix = {QUERIES: "q", KEYS: "k", FEATURES: "d"}.get(axis, "")
    return [f"{prefix}{i}" for i in range(count)]


def matrix_table(a: np.ndarray, title: str, axes: Sequence[str], trace: Trace, opts: RenderOptions,
                 caption: str | None = None, highlight_max: bool = False) -> Table:
    """A rich Table of the 2-D array ``a`` with labelled rows and columns."""
    rows, cols = a.shape
    rlab, clab = axis_labels(trace, axes[0], rows), axis_labels(trace, axes[1], cols)
    table = Table(title=title, caption=caption, title_justify="left", show_lines=False, pad_edge=True)
    table.add_column(f"{axes[0]} ↓ {axes[1]} →", style="bold", no_wrap=True)
    ci = shown(cols, opts.max_cols, opts.full)
    for j in ci:
        table.add_column(ELLIPSIS if j is None else clab[j], justify="right", no_wrap=True)
    for i in shown(rows, opts.max_rows, opts.full):
        if i is None:
            table.add_row(ELLIPSIS, *[ELLIPSIS for _ in ci])
            continue
        best = int(np.argmax(a[i])) if highlight_max else -1
        cells: list[Text | str] = []
        for j in ci:
            if j is None:
                cells.append(ELLIPSIS)
                continue
            x = float(a[i, j])
            style = "bold" if j == best else ("dim" if math.isinf(x) else "")
            cells.append(Text(fmt(x, opts.precision), style=style))
        table.add_row(rlab[i], *cells)
    return table


def show_array(console: Console, a: np.ndarray, title: str, axes: Sequence[str], trace: Trace,
               opts: RenderOptions, highlight_max: bool = False) -> None:
    """Print ``a`` (..., rows, cols): one table per batch entry, the first few unless --full."""
    batch = a.shape[:-2]
    if not batch:
        console.print(matrix_table(a, title, axes, trace, opts, highlight_max=highlight_max))
        console.print()
        return
    entries = list(np.ndindex(*batch))
    limit = len(entries) if opts.full else opts.max_batches
    for idx in entries[:limit]:
        cap = f"batch [{', '.join(map(str, idx))}] of {tuple(batch)}"
        console.print(matrix_table(a[idx], title, axes, trace, opts, caption=cap, highlight_max=highlight_max))
    if len(entries) > limit:
        console.print(Text(f"{ELLIPSIS} {len(entries) - limit} more batch entries not shown "
                           "(use --full to show all, or --save FILE.npz)", style="italic"))
    console.print()


def header(trace: Trace) -> Text:
    m = trace.meta
    shapes = "  ".join(f"{k.upper()} {tuple(s)}" for k, s in m.get("shapes", {}).items())
    t = Text()
    t.append("attncli", style="bold")
    t.append(f" · score {m.get('score')} · {m.get('backend')} on {m.get('device')} · {m.get('dtype')}\n")
    t.append(f"inputs: {shapes}")
    if m.get("score_formula"):
        t.append(f"\nscore: {m['score_formula']}")
    return t


@output_format("rich")
def print_rich(trace: Trace, opts: RenderOptions, console: Console) -> None:
    console.print(header(trace))
    console.print()
    wanted = opts.steps
    same = trace.meta.get("self_attention", False)
    for name, a in trace.inputs_numpy().items():
        if (wanted is not None and name not in wanted) or (same and name != "q"):
            continue
        title, axes = INPUT_TITLES.get(name, (name, (QUERIES, FEATURES)))
        if same:
            title = "X: Q = K = V"
        show_array(console, a, f"{title} {tuple(a.shape)}", axes, trace, opts)
    for i, step in enumerate((s for s in trace.steps if wanted is None or s.name in wanted), 1):
        show_array(console, step.numpy(), f"{i}. {step.formula}", step.axes, trace, opts,
                   highlight_max=step.name == "weights")
        for note in step.notes:
            console.print(Text(f"  {note}", style="italic"))


def render_to_string(trace: Trace, opts: RenderOptions | None = None, width: int = 100) -> str:
    """The terminal view as plain text (no colour) at a fixed width: for goldens and --svg."""
    import io

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    print_rich(trace, opts or RenderOptions(), console)
    return buf.getvalue()


