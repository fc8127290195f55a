"""``--html`` beyond what a page of tables holds (more than page.MAX_SIDE queries or keys, or more
than page.MAX_ENTRIES heads and batch entries): one self-contained file that shows every head as a
downsampled heatmap (a PNG data URI: each pixel the largest weight of its block of cells, grey
where all are masked, one viridis scale for all), and exact tables and arithmetic for the rows the
user names with ``--explain-row`` (and the cells named with ``--explain``), else each head's first
and last query. The page says so. No script: it opens at once, whatever the size.
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any

import numpy as np

from attncli.core.diagnostics import masked_cells
from attncli.core.trace import KEYS, QUERIES, Trace
from attncli.render import colours
from attncli.render.explain import Cell, explain_row, heading
from attncli.render.numbers import num
from attncli.render.plot import panel_title
from attncli.render.terminal import axis_labels
from attncli.render.viewer import colour, png, pool

PIXELS = 256  # pixels per axis of each head's heatmap (at most)
TOP_KEYS = 16  # keys in each named row's table: its strongest


def too_big(trace: Trace) -> bool:
    """Whether the page of tables (attncli.render.page) would cut this run's weights."""
    w = trace.step("weights").values
    return exceeds(tuple(np.shape(w)[:-2]), *np.shape(w)[-2:])


def exceeds(lead: tuple[int, ...], m: int, n: int) -> bool:
    from attncli.render.page import MAX_ENTRIES, MAX_SIDE

    return m > MAX_SIDE or n > MAX_SIDE or math.prod(lead) > MAX_ENTRIES


def page_for_problem(problem: Any, cells: list[str], rows: list[str], precision: int) -> str | None:
    """--html of a problem too big for a page of tables, made from blocks of queries (never every weight
    at once); None when a page of tables holds it."""
    from attncli.render.viewer import Layer

    layer = Layer(problem, "attention", overview=PIXELS)
    if not exceeds(layer.lead, layer.m, layer.n):
        return None
    return layer_page(layer, cells, rows, precision)


def heatmaps(trace: Trace, pixels: int = PIXELS) -> tuple[list[tuple[str, str]], float, float, tuple[int, int]]:
    """Every entry's weights as (title, PNG data URI), the colour range, and the block size (fr, fc)."""
    w = np.asarray(trace.weights)
    lead = tuple(w.shape[:-2])
    m, n = w.shape[-2:]
    hidden = masked_cells(trace)
    fr, fc = max(1, math.ceil(m / pixels)), max(1, math.ceil(n / pixels))
    entries = list(np.ndindex(*lead)) if lead else [()]
    pooled, lo, hi = [], math.inf, -math.inf
    for e in entries:
        a = np.asarray(w[e], dtype=np.float32)
        if hidden is not None:
            a = np.where(np.broadcast_to(hidden, w.shape)[e] & (a == 0), np.nan, a)  # a finite fill keeps its weight
        a = np.where(np.isfinite(a), a, np.nan)
        p = pool(a, fr, fc)
        if np.isfinite(p).any():
            lo, hi = min(lo, float(np.nanmin(p))), max(hi, float(np.nanmax(p)))
        pooled.append(p)
    if not math.isfinite(lo):
        lo, hi = 0.0, 1.0
    hi = hi if hi > lo else lo + 1.0
    out = [(panel_title(trace, e, lead) or "weights",
            "data:image/png;base64," + base64.b64encode(png(colour(p, lo, hi))).decode()) for e, p in zip(entries, pooled)]
    return out, lo, hi, (fr, fc)


def named_rows(trace: Trace, precision: int) -> tuple[list[dict[str, Any]], bool]:
    """The explanations to show: those --explain / --explain-row asked for (trace.extra), else every
    entry's first and last row; and whether they were named."""
    asked = trace.extra.get("explanations") or []
    if asked:
        return list(asked), True
    w = trace.weights
    lead = tuple(w.shape[:-2])
    m = w.shape[-2]
    out = []
    for e in list(np.ndindex(*lead)) if lead else [()]:
        for i in sorted({0, m - 1}):
            c = Cell(trace, e, i, 0, precision)
            out.append({"what": "row", "batch": list(e), "query": i, "heading": heading(c, f"row {c.query}"),
                        "lines": explain_row(c)})
    return out, False


def row_table(trace: Trace, entry: tuple[int, ...], i: int, precision: int) -> str:
    """A row's strongest keys from a computed trace (see _table)."""
    w = np.asarray(trace.weights)
    pre_name = "masked" if "masked" in trace else ("scaled" if "scaled" in trace else "scores")
    pre = np.broadcast_to(trace[pre_name], w.shape)[entry][i]
    return _table(w[entry][i], pre, pre_name, axis_labels(trace, KEYS, w.shape[-1]), precision)


def big_page(trace: Trace, precision: int = 4) -> str:
    """The page of a computed trace (a notebook's, or --html's when a trace is at hand)."""
    from attncli.render.page import header_lines

    maps, lo, hi, block = heatmaps(trace)
    w = trace.weights
    lead = tuple(w.shape[:-2])
    shown, named = named_rows(trace, precision)
    tables = {i: row_table(trace, tuple(ex["batch"]), int(ex["query"]), precision)
              for i, ex in enumerate(shown) if ex.get("what") == "row"}
    return render(trace, header_lines(trace), lead, w.shape[-2], w.shape[-1], maps, lo, hi, block, shown, tables,
                  named, precision)


def layer_page(layer: Any, cells: list[str], rows: list[str], precision: int = 4) -> str:
    """The page of a problem computed a block of queries at a time (attncli.render.viewer.Layer): what
    --html writes beyond a page of tables, without ever holding every head's weights."""
    from attncli.render.explain import parse_cell, parse_row
    from attncli.render.page import header_lines

    step = layer.weights_step
    shape = layer.row_trace(0)  # the problem's shape, for parsing QUERY,KEY by labels or indices
    asked = [(parse_cell(shape, spec, precision), True) for spec in cells] + \
        [(parse_row(shape, spec, precision), False) for spec in rows]  # a bad name refused before the sweep
    layer.sweep(step)
    if layer.failed:
        raise RuntimeError(layer.failed)
    ov = layer.overviews[step]
    lo, hi = (ov.lo, ov.hi if ov.hi > ov.lo else ov.lo + 1.0) if math.isfinite(ov.lo) else (0.0, 1.0)  # as --plot
    entries = list(np.ndindex(*layer.lead)) if layer.lead else [()]
    t = layer.p.trace
    maps = [(panel_title(t, e, layer.lead) or "weights",
             "data:image/png;base64," + base64.b64encode(png(colour(ov.values[e], lo, hi))).decode()) for e in entries]
    shown: list[dict[str, Any]] = []
    for c, is_cell in asked:
        shown.append({"what": "cell" if is_cell else "row", "batch": list(c.batch), "query": c.i,
                      **layer.explain(c.batch, c.i, c.j if is_cell else None, precision)})
    named = bool(shown)
    if not named:
        for e in entries:
            for i in sorted({0, layer.m - 1}):
                shown.append({"what": "row", "batch": list(e), "query": i, **layer.explain(e, i, None, precision)})
    tables = {}
    by_query: dict[int, dict[str, np.ndarray]] = {}  # a query's steps, every head: computed once for all its entries
    for k, ex in enumerate(shown):
        if ex["what"] == "row":
            if ex["query"] not in by_query:
                by_query[ex["query"]] = layer._compute(np.array([ex["query"]]))[0]
            arrays = by_query[ex["query"]]
            e = tuple(ex["batch"])
            pre = next((n for n in ("masked", "scaled", "scores") if n in arrays), step)
            tables[k] = _table(arrays[step][e][0], arrays[pre][e][0], pre, axis_labels(t, KEYS, layer.n), precision)
    return render(t, header_lines(t), layer.lead, layer.m, layer.n, maps, lo, hi, (ov.fr, ov.fc), shown, tables, named,
                  precision)


def _table(row: np.ndarray, pre: np.ndarray, pre_name: str, keys: list[str], precision: int) -> str:
    """A row's strongest keys: key, score before the softmax, weight (exact, at ``precision``)."""
    row = np.asarray(row, dtype=np.float64)
    top = sorted(int(j) for j in np.argsort(-np.nan_to_num(row, nan=-1.0), kind="stable")[:TOP_KEYS])
    cells = "".join(f"<tr><th>{html.escape(keys[j])}</th><td>{html.escape(num(float(pre[j]), precision))}</td>"
                    f"<td>{html.escape(num(float(row[j]), precision))}</td></tr>" for j in top)
    return (f"<table><tr><th>key</th><th>{pre_name}</th><th>weight</th></tr>{cells}</table>"
            f"<p class=note>the {len(top)} strongest of {len(row)} keys, in key order; their weights sum to "
            f"{html.escape(num(float(np.nansum(row[top])), precision))} of "
            f"{html.escape(num(float(np.nansum(row)), precision))}</p>")


def render(trace: Trace, header: list[str], lead: tuple[int, ...], m: int, n: int, maps: list[tuple[str, str]],
           lo: float, hi: float, block: tuple[int, int], shown: list[dict[str, Any]], tables: dict[int, str],
           named: bool, precision: int) -> str:
    """The HTML of the page."""
    fr, fc = block
    count = math.prod(lead) if lead else 1
    what = (f"{count} head{'s' if count > 1 else ''} / batch entries" if lead else "one map") + f" of {m} queries × {n} keys"
    shrunk = f"each pixel shows the largest weight of its {fr}×{fc} block of cells" if (fr, fc) != (1, 1) else \
        "one pixel per cell"
    rows_note = ("the cells and rows named with --explain / --explain-row" if named else
                 "each head's first and last query (name others with --explain-row QUERY or BATCH:QUERY)")
    notice = (f"This run has {what}: more than a page of tables holds. Every head is drawn below as a heatmap "
              f"({shrunk}; one colour scale for all, grey: masked), and the exact numbers and arithmetic are given "
              f"for {rows_note}. attncli view shows every cell.")
    stops = ", ".join(f"rgb({r},{g},{b})" for r, g, b in colours.STOPS)
    figures = "".join(f'<figure><img alt="{html.escape(t)}" src="{src}"><figcaption>{html.escape(t)}</figcaption></figure>'
                      for t, src in maps)
    qlab = axis_labels(trace, QUERIES, m)
    sections = []
    for k, ex in enumerate(shown):
        body = html.escape("\n".join(ex["lines"]))
        sections.append(f"<section class=ex><h3>{html.escape(ex['heading'])}</h3>{tables.get(k, '')}<pre>{body}</pre>"
                        "</section>")
    title = html.escape(f"attncli · {trace.meta.score or 'attention'}")
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width, "
            f"initial-scale=1\"><title>{title}</title><style>{CSS}</style></head><body>"
            f"<header><h1>{title}</h1><div class=meta>{html.escape(chr(10).join(header))}</div>"
            f"<p class=notice>{html.escape(notice)}</p>"
            f"<div class=legend>{html.escape(num(lo, precision))} <span class=bar style=\"background: linear-gradient("
            f"to right, {stops})\"></span> {html.escape(num(hi, precision))} (attention weight); "
            f"<span class=grey></span> masked</div></header>"
            f"<main><h2>Every head</h2><div class=grid>{figures}</div>"
            f"<h2>Exact rows and cells</h2><p class=note>queries {html.escape(qlab[0])} … {html.escape(qlab[-1])}</p>"
            f"{''.join(sections)}</main></body></html>\n")


CSS = """
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1a1a1a; }
header { padding: 8px 16px; border-bottom: 1px solid #ccc; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 16px 0 6px; } h3 { font-size: 14px; margin: 8px 0 4px; }
.meta { color: #555; font-size: 13px; white-space: pre-wrap; }
.notice { background: #fff8e0; border: 1px solid #e8d9a8; padding: 6px 10px; border-radius: 4px; font-size: 14px; }
.legend { font-size: 13px; color: #555; display: flex; align-items: center; gap: 6px; }
.legend .bar { display: inline-block; width: 160px; height: 10px; border: 1px solid #ccc; }
.legend .grey { display: inline-block; width: 12px; height: 10px; background: #b0b0b0; }
main { padding: 8px 16px; }
.grid { display: grid; gap: 10px; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr)); }
figure { margin: 0; text-align: center; }
figure img { width: 192px; height: 192px; image-rendering: pixelated; border: 1px solid #ccc; }
figcaption { font-size: 12px; color: #555; }
table { border-collapse: collapse; font: 13px ui-monospace, "DejaVu Sans Mono", Menlo, monospace; margin: 4px 0; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f4f4f4; }
pre { font: 12px/1.45 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; white-space: pre-wrap; background: #fafafa;
      border: 1px solid #ddd; padding: 6px 8px; }
.note { color: #555; font-size: 12px; }
.ex { border-top: 1px solid #eee; }
"""
