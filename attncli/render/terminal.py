"""The step-by-step terminal view: one titled table per step (and per batch entry).

Big matrices show their corners around an ellipsis; only the cells shown are formatted.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from rich.cells import cell_len
from rich.color import Color
from rich.console import Console
from rich.style import Style
from rich.table import Table
from rich.text import Text

from attncli.core.diagnostics import SATURATION, masked_cells, query_labels
from attncli.core.params import Meta
from attncli.core.trace import FEATURES, KEYS, QUERIES, Trace
from attncli.render import RenderOptions, colours, escape, output_format
from attncli.render.numbers import MASKED, all_whole, column_format, num
from attncli.render.wrap import say

ELLIPSIS = "…"
INPUT_TITLES = {"q": ("Q: queries", (QUERIES, FEATURES)), "k": ("K: keys", (KEYS, FEATURES)),
                "v": ("V: values", (KEYS, FEATURES))}


def fmt(x: float, precision: int) -> str:
    """One number alone, as the tables and --explain write it (attncli.render.numbers.num)."""
    return num(x, precision)


def shown(count: int, limit: int, full: bool, keep: Sequence[int] = ()) -> list[int | None]:
    """Indices to show of ``count``: all, or the first and last halves of ``limit`` with None (an
    ellipsis) where indices are left out of the middle; the indices in ``keep`` are always shown."""
    if full or count <= limit:
        return list(range(count))
    head = (limit + 1) // 2
    tail = limit - head
    chosen = sorted({*range(head), *range(count - tail, count), *(k for k in keep if 0 <= k < count)})
    out: list[int | None] = []
    for p, i in enumerate(chosen):
        if p and i != chosen[p - 1] + 1:
            out.append(None)
        out.append(i)
    return out


def axis_labels(trace: Trace, axis: str, count: int) -> list[str]:
    if axis == QUERIES and trace.query_labels:
        return trace.query_labels
    if axis == KEYS and trace.key_labels:
        return trace.key_labels
    if count == 1 and axis not in (QUERIES, KEYS, FEATURES, ""):
        return [axis]  # a one-column step over its own axis (e.g. the sink's share): the axis names the column
    prefix = {QUERIES: "q", KEYS: "k", FEATURES: "d"}.get(axis, "")
    return [f"{prefix}{i}" for i in range(count)]


HEAT_LEGEND = "colour: weight 0 dark purple → 1 yellow (viridis); bold: each row's largest"
HEATMAP_STEPS = ("weights", "hard", "dropout", "avg_weights")  # steps shown as heatmaps (values are weights)

# Heatmap of weights in [0, 1]: viridis, the colour map of every view (attncli.render.colours).


def heat_style(w: float, strongest: bool) -> Style:
    """Background colour for a weight in [0, 1] (viridis), readable text on it; bold for the row's strongest."""
    if not math.isfinite(w) or w <= 0:
        return Style(dim=True)
    r, g, b = colours.rgb(w)
    return Style(bgcolor=Color.from_rgb(r, g, b), color=Color.from_rgb(*colours.text_on(r, g, b)), bold=strongest)


def truncation_note(rows: int, cols: int, axes: Sequence[str], opts: RenderOptions,
                    computed: int | None = None) -> str | None:
    """'showing 12 of 100 queries × 10 of 50 keys; ...' when a table shows only its corners;
    ``computed``: only that many rows were computed at all (the view of a big problem)."""
    cut_r, cut_c = not opts.full and rows > opts.max_rows, not opts.full and cols > opts.max_cols
    if computed is not None:
        c = f"{opts.max_cols} of {cols} {axes[1]}" if cut_c else f"all {cols} {axes[1]}"
        return (f"showing {computed} of {rows} {axes[0]} × {c}: only these rows were computed, each against every "
                f"key (so they are exact); --steps weights,output or --save FILE.npz computes them all")
    if not (cut_r or cut_c):
        return None
    r = f"{opts.max_rows} of {rows} {axes[0]}" if cut_r else f"all {rows} {axes[0]}"
    c = f"{opts.max_cols} of {cols} {axes[1]}" if cut_c else f"all {cols} {axes[1]}"
    return f"showing {r} × {c}: --full shows everything, --save FILE.npz keeps every number"


def with_gaps(rows: Sequence[int]) -> list[int | None]:
    """Positions 0..len(rows)-1 with None where the row indices jump (an ellipsis row)."""
    out: list[int | None] = []
    for p, i in enumerate(rows):
        if p and i != rows[p - 1] + 1:
            out.append(None)
        out.append(p)
    return out


def query_count(trace: Trace) -> int:
    """The number of queries of the run: the rows of its output, which every query has."""
    return int(trace.step("output").values.shape[-2])


MASK_STEPS = ("weights", "hard", "dropout")  # steps whose masked cells read MASKED (a weight of exactly 0)


@dataclass
class Layout:
    """How one step's tables are written: which rows and columns, and each column's notation."""

    rows: list[int | None]
    cols: list[int | None]
    formats: dict[int, Callable[[float], str]]
    marked: np.ndarray | None  # (..., rows, cols) True where the key is masked for the query
    mark: str | None  # what a masked cell reads (MASKED), or None: its value, dim
    widths: dict[int, int] = field(default_factory=dict)  # each column's width over every table of the step


def cell_text(x: float, j: int, hidden: bool, lay: Layout, p: int) -> str:
    if hidden:
        return lay.mark or num(x, p)
    return lay.formats[j](x)


def step_mask(trace: Trace, a: np.ndarray, axes: Sequence[str], name: str | None) -> tuple[np.ndarray | None, str | None]:
    """Where the cells of ``a`` are masked keys (for query × key steps from the mask on), and their mark."""
    if name is None or tuple(axes) != (QUERIES, KEYS) or name not in (*MASK_STEPS, "masked", "avg_weights"):
        return None, None
    m = masked_cells(trace)
    if m is None or m.shape != a.shape:
        return None, None
    if name == "masked":
        return m, None
    return m & (a == 0), MASKED  # a fill such as --mask-value -5 leaves masked keys a weight: shown as it is


def layout(a: np.ndarray, axes: Sequence[str], trace: Trace, opts: RenderOptions, width: int | None,
           name: str | None = None, rows_of: Sequence[int] | None = None) -> Layout:
    """Rows, columns and notations of the tables of ``a`` (..., rows, cols): every column when the
    table fits ``width`` (or --full), else the most corner columns that fit, left out from the middle;
    a key named by --explain is always kept."""
    rows, cols = a.shape[-2:]
    flat = a.reshape(-1, rows, cols)[:opts.max_batches if not opts.full else None]
    marked, mark = step_mask(trace, a, axes, name)
    mflat = marked.reshape(-1, rows, cols)[:len(flat)] if marked is not None else np.zeros(flat.shape, dtype=bool)
    ri = (shown(rows, opts.max_rows, opts.full) if rows_of is None else with_gaps(rows_of))
    rr = [i for i in ri if i is not None]
    keep = explained_keys(trace, opts) if tuple(axes) == (QUERIES, KEYS) else []
    cand = shown(cols, opts.max_cols, opts.full, keep)
    cc = [j for j in cand if j is not None]
    sub, hid = flat[:, rr][:, :, cc].astype(np.float64), mflat[:, rr][:, :, cc]
    integers = all_whole(sub[~hid].ravel())
    formats = {j: column_format(sub[:, :, c][~hid[:, :, c]].ravel(), opts.precision, integers)
               for c, j in enumerate(cc)}
    lay = Layout(ri, cand, formats, marked, mark)
    clab = axis_labels(trace, axes[1], cols)
    cw = {j: max([cell_len(clab[j]),
                  *(cell_len(cell_text(float(x), j, bool(h), lay, opts.precision))
                    for x, h in zip(sub[:, :, c].ravel(), hid[:, :, c].ravel()))]) for c, j in enumerate(cc)}
    lay.widths = cw
    if opts.full or width is None or not cc:
        return lay
    total = rows if rows_of is None else query_count(trace)
    rlab = axis_labels(trace, axes[0], total)
    label = max(cell_len(f"{axes[0]} ↓ {axes[1]} →"), *(cell_len(rlab[i if rows_of is None else rows_of[i]]) for i in rr))

    def table_width(chosen: list[int | None]) -> int:  # rich's default box: a border, then 1 + cell + 1 and a border
        return 1 + (label + 3) + sum((1 if j is None else cw[j]) + 3 for j in chosen)

    k = len(cc)
    chosen = cand
    while table_width(chosen) > width and k > 2:
        k -= 1
        chosen = shown(cols, k, False, keep)  # a subset of the candidates, all measured
    lay.cols = chosen
    return lay


def explained_keys(trace: Trace, opts: RenderOptions) -> list[int]:
    """The key columns --explain talks about (kept in view when a table is too wide)."""
    out = []
    for e in trace.extra.get("explanations", []):
        if e.get("what") == "cell" and isinstance(e.get("key"), int):
            out.append(int(e["key"]))
    return out


def row_best(row: np.ndarray, hidden: np.ndarray | None) -> frozenset[int]:
    """The columns to bold in a row: its largest value, every one of them when several tie,
    none when every visible cell ties (a uniform row has no strongest key)."""
    seen = ~np.asarray(hidden, dtype=bool) if hidden is not None else np.ones(row.shape, dtype=bool)
    if not seen.any() or not np.isfinite(row[seen]).any():
        return frozenset()
    top = np.max(np.where(seen, row, -np.inf))
    best = frozenset(int(j) for j in np.flatnonzero(seen & (row == top)))
    return frozenset() if len(best) > 1 and len(best) == int(seen.sum()) else best


def matrix_table(a: np.ndarray, title: str, axes: Sequence[str], trace: Trace, opts: RenderOptions,
                 caption: str | None = None, highlight_max: bool = False, heatmap: bool = False,
                 rows_of: Sequence[int] | None = None, lay: Layout | None = None,
                 marked: np.ndarray | None = None) -> Table:
    """A rich Table of the 2-D array ``a``: rows labelled by ``axes[0]``, columns by ``axes[1]``;
    ``rows_of``: the query index of each row of ``a``, when it holds some queries only; ``marked``:
    this table's masked cells (written as ``lay.mark``)."""
    rows, cols = a.shape
    lay = lay or layout(a, axes, trace, opts, None, rows_of=rows_of)
    total = rows if rows_of is None else query_count(trace)
    rlab, clab = axis_labels(trace, axes[0], total), axis_labels(trace, axes[1], cols)
    if rows_of is not None:
        rlab = [rlab[i] for i in rows_of]
    hidden_cols = len([j for j in lay.cols if j is not None]) < cols
    note = truncation_note(total, cols, axes, replace(opts, max_cols=cols + 1) if not hidden_cols else
                           replace(opts, max_cols=len([j for j in lay.cols if j is not None]), full=False),
                           computed=None if rows_of is None else rows)
    if marked is not None and marked.any() and lay.mark:
        note = "\n".join(c for c in (note, f"{lay.mark} masked key (weight exactly 0)") if c)
    caption = "\n".join(c for c in (caption, note) if c) or None
    table = Table(caption=caption, caption_justify="left", show_lines=False, pad_edge=True)  # title: show_array
    table.add_column(f"{axes[0]} ↓ {axes[1]} →", style="bold", no_wrap=True)
    ci = lay.cols
    for j in ci:
        table.add_column(ELLIPSIS if j is None else clab[j], justify="right", no_wrap=True,
                         min_width=None if j is None else lay.widths.get(j))
    for i in lay.rows:
        if i is None:
            table.add_row(ELLIPSIS, *[ELLIPSIS for _ in ci])
            continue
        best = row_best(a[i], marked[i] if marked is not None else None) if highlight_max else frozenset()
        cells: list[Text | str] = []
        for j in ci:
            if j is None:
                cells.append(ELLIPSIS)
                continue
            x = float(a[i, j])
            hid = bool(marked[i, j]) if marked is not None else False
            if hid:
                style: Style | str = "dim"
            elif heatmap:
                style = heat_style(x, j in best)
            else:
                style = "bold" if j in best else ("dim" if math.isinf(x) else "")
            cells.append(Text(cell_text(x, j, hid, lay, opts.precision), style=style))
        table.add_row(rlab[i], *cells)
    return table


def print_table(console: Console, table: Table) -> None:
    """The table, then its caption (notes, the colour legend) wrapped to the terminal's width, not the table's."""
    caption, table.caption = table.caption, None
    console.print(table)
    for line in str(caption or "").split("\n") if caption else []:
        say(console, line, style="table.caption")


def show_array(console: Console, a: np.ndarray, title: str, axes: Sequence[str], trace: Trace,
               opts: RenderOptions, highlight_max: bool = False, heatmap: bool = False,
               after: Callable[[tuple[int, ...]], None] | None = None, rows_of: Sequence[int] | None = None,
               name: str | None = None) -> None:
    """Print ``a`` (..., rows, cols): one table per batch entry, the first few unless --full.

    ``after(batch_index)`` prints more under each table (the diagnostics under the weights);
    ``rows_of``: the query index of each row, when ``a`` holds some queries only."""
    title = escape.terminal(title)  # a step's formula may name a tensor of a checkpoint
    lay = layout(a, axes, trace, opts, console.width, name, rows_of)
    batch = a.shape[:-2]
    legend = HEAT_LEGEND if heatmap and console.color_system is not None else None  # in colour only
    table = functools.partial(matrix_table, highlight_max=highlight_max, heatmap=heatmap, rows_of=rows_of, lay=lay,
                              caption=legend)
    if not batch:
        say(console, title, style="table.title")  # a line of its own, not wrapped to the table's width
        print_table(console, table(a, title, axes, trace, opts, marked=lay.marked))
        if after is not None:
            after(())
        console.print()
        return
    entries = list(np.ndindex(*batch))
    limit = len(entries) if opts.full else opts.max_batches
    for idx in entries[:limit]:
        names = trace.meta.batch_axes or []  # e.g. ["batch", "head"] for multi-head steps
        if len(idx) == len(names):  # which head / batch entry, in the title: "head 1 of 2"
            where = ", ".join(f"{n} {i} of {size}" for n, i, size in zip(names, idx, batch))
        else:
            where = f"batch [{', '.join(map(str, idx))}] of {tuple(batch)}"
        say(console, f"{title} · {where}", style="table.title")
        print_table(console, table(a[idx], title, axes, trace, opts,
                                   marked=lay.marked[idx] if lay.marked is not None else None))
        if after is not None:
            after(idx)
    if len(entries) > limit:
        say(console, Text(f"{ELLIPSIS} {len(entries) - limit} more {entry_noun(trace, len(batch))} not shown "
                           "(use --full to show all, or --save FILE.npz)", style="italic"))
    console.print()


def entry_noun(trace: Trace, axes: int) -> str:
    """What the leading axes of a step count: 'heads', 'batch entries', 'batch × head entries'."""
    names = trace.meta.batch_axes or []
    if len(names) != axes or names == ["batch"]:
        return "batch entries"
    if names == ["head"]:
        return "heads"
    return f"{' × '.join(names)} entries"


def _at(values: Any, idx: tuple[int, ...]) -> Any:
    """``values[idx]`` for nested lists (a batch entry of a per-row diagnostic)."""
    for i in idx:
        values = values[i]
    return values


def top_key(klab: Sequence[str], arg: int, ties: int, visible: int) -> str:
    """The key a row attends to most, or the tie: 'all 4 keys tie', 'cat +1 tied'."""
    if ties > 1 and ties >= visible:
        return f"all {ties} keys tie"
    return klab[arg] if ties <= 1 else f"{klab[arg]} +{ties - 1} tied"


def diagnostics_table(trace: Trace, diag: dict[str, Any], idx: tuple[int, ...],
                      opts: RenderOptions) -> tuple[Table, str]:
    """Per query row: the key it attends to most, that weight, the entropy and the effective number of
    keys, out of the keys it sees (a mask hides some); and the note to print under the table."""
    ent, eff = _at(diag["entropy"], idx), _at(diag["effective_keys"], idx)
    top, arg = _at(diag["max_weight"], idx), _at(diag["argmax"], idx)
    m, n = len(ent), diag["keys"]
    vis = _at(diag["visible_keys"], idx) if "visible_keys" in diag else [n] * m
    some_hidden = any(v != n for v in vis)
    rows_of = trace.step("weights").rows
    qlab = axis_labels(trace, QUERIES, m) if rows_of is None else query_labels(trace) or []
    klab = axis_labels(trace, KEYS, n)
    caption = ("entropy in nats; eff. keys = exp(entropy), out of the keys the row sees" if some_hidden
               else f"entropy in nats; eff. keys = exp(entropy), out of {n}")
    table = Table(title="diagnostics of the weights", title_justify="left", pad_edge=True)
    note = caption + ("; for the rows computed only" if rows_of is not None else "")
    table.add_column("query", style="bold", no_wrap=True)
    heads = ["top key", "weight", "entropy", "eff. keys"] + (["sees"] if some_hidden else [])
    for name in heads:
        table.add_column(name, justify="right")
    p = opts.precision
    ties = diag.get("top_ties")
    rows = [i for i in (shown(m, opts.max_rows, opts.full) if rows_of is None else with_gaps(rows_of)) if i is not None]
    fe = column_format([x for i in rows if (x := ent[i]) is not None], p)
    fw = column_format([x for i in rows if (x := top[i]) is not None], p)
    for i in shown(m, opts.max_rows, opts.full) if rows_of is None else with_gaps(rows_of):
        if i is None:
            table.add_row(*[ELLIPSIS] * len(heads) + [ELLIPSIS])
            continue
        seen = [str(vis[i])] if some_hidden else []
        if arg[i] < 0:
            table.add_row(qlab[i], "(all masked)", fmt(top[i], p), "-", "0", *seen)
        else:
            sat = top[i] is not None and top[i] > SATURATION and vis[i] > 1
            table.add_row(qlab[i], top_key(klab, arg[i], _at(ties, idx)[i] if ties else 1, vis[i]),
                          Text(fw(top[i]), style="bold red" if sat else ""),
                          fe(ent[i]), num(eff[i], min(p, 2)), *seen)
    return table, note


def print_diagnostics(console: Console, trace: Trace, idx: tuple[int, ...], opts: RenderOptions) -> None:
    diag = trace.extra.get("diagnostics")
    if not diag or "entropy" not in diag:
        return
    table, note = diagnostics_table(trace, diag, idx, opts)
    console.print(table)
    say(console, note)  # under the table, wrapped to the terminal's width, not the table's
    last = len(trace.weights.shape[:-2])
    if idx == () or all(i == 0 for i in idx) or last == 0:  # the sentences once, under the first table
        for w in diag.get("warnings", []):
            say(console, f"  ⚠ {w}", style="yellow")


def similarity_view(console: Console, trace: Trace, opts: RenderOptions) -> None:
    """The output rows compared with each other (--similarity), with the nearest row of each."""
    sim = trace.extra.get("diagnostics", {}).get("similarity")
    if not sim:
        return
    after = np.asarray(sim["after"], dtype=np.float64)
    kind = sim["kind"]
    show_array(console, after, f"similarity ({kind}) of the output rows after attention", (QUERIES, QUERIES),
               trace, opts)
    if after.ndim != 2:
        return
    m = after.shape[0]
    lab = axis_labels(trace, QUERIES, m)
    before = np.asarray(sim["before"], dtype=np.float64) if "before" in sim else None
    def closest(s: np.ndarray, i: int) -> str:
        others = np.delete(np.arange(m), i)
        best = float(np.max(s[i, others]))
        tied = [lab[j] for j in others if s[i, j] == best]
        return f"{', '.join(tied)} ({fmt(best, opts.precision)}{', tied' if len(tied) > 1 else ''})"

    say(console, Text(f"closest other row by {kind} similarity" + (", after and before attention:" if before is not None
                                                                   else " after attention:")))

    for i in shown(m, opts.max_rows, opts.full):
        if i is None or m < 2:
            continue
        line = f"  {lab[i]}: {closest(after, i)}"
        if before is not None:
            line += f"; before: {closest(before, i)}"
        say(console, line)
    console.print()


def header(trace: Trace) -> Text:
    m = trace.meta
    shapes = "  ".join(f"{k.upper()} {tuple(s)}" for k, s in (m.shapes or {}).items())
    t = Text()
    t.append("attncli", style="bold")
    t.append(f" · score {m.score} · {m.backend} on {m.device} · {m.dtype}\n")
    t.append(f"inputs: {shapes}")
    if m.score_formula:
        t.append(f"\nscore: {escape.terminal(m.score_formula)}")
    note = seed_note(m)
    if note:
        t.append(f"\n{escape.terminal(note)}", style="italic")
    return t


def seed_note(meta: Meta) -> str | None:
    """Which weights were drawn at random, from which seed (none given in a file)."""
    init = meta.params_initialised
    if init is not None and init.names:
        return (f"note: {', '.join(init.names)} were not given: drawn from seed {init.seed} "
                f"({init.rule}); --weights FILE gives them")
    if str(meta.weights_source or "").startswith("--seed"):
        seed = meta.seed
        where = "--seed (0 unless given)" if seed is None else f"seed {seed}"
        return (f"note: the projections were not given: drawn from {where} "
                f"as PyTorch initialises them ({meta.weights_format or 'init'}); --weights FILE gives them")
    return None


@output_format("rich")
def print_rich(trace: Trace, opts: RenderOptions, console: Console) -> None:
    say(console, header(trace))
    console.print()
    wanted = opts.steps
    same = bool(trace.meta.self_attention)
    for name, a in trace.inputs_numpy().items():
        if (wanted is not None and name not in wanted) or (same and name in ("k", "v")):
            continue
        title, axes = INPUT_TITLES.get(name, (name, (FEATURES, FEATURES)))  # others: score weights W_q, w_v, ...
        if same and name == "q":
            title = "X: Q = K = V"
        show_array(console, np.atleast_2d(a), f"{title} {tuple(a.shape)}", axes, trace, opts)
    for i, step in enumerate((s for s in trace.steps if wanted is None or s.name in wanted), 1):
        weights = step.name == "weights"
        heat = step.axes == (QUERIES, KEYS) and step.name in HEATMAP_STEPS
        show_array(console, step.numpy(), f"{i}. {step.formula}", step.axes, trace, opts,
                   highlight_max=heat, heatmap=heat, rows_of=step.rows, name=step.name,
                   after=(lambda idx: print_diagnostics(console, trace, idx, opts)) if weights else None)
        for note in step.notes:
            say(console, f"  {escape.terminal(note)}", style="italic")
    similarity_view(console, trace, opts)
    for explain in EXPLAINERS:
        explain(trace, opts, console)


# Extra sections after the steps (explanations of cells and rows); filled by attncli.render.explain.
EXPLAINERS: list[Callable[[Trace, RenderOptions, Console], None]] = []
