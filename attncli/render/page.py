"""``--html FILE.html``: one self-contained interactive page (styles and script inline, no network).

Every step is a labelled heatmap table; a selector picks the head / batch entry; hovering or
clicking a cell of a query × key step shows its arithmetic, clicking a query's label shows its
softmax and output. The arithmetic is the text of ``--explain`` / ``--explain-row``, made by the
same functions (attncli.render.explain) for every cell in Python and embedded as JSON, so the page
computes nothing: its script only shows tables and looks explanations up.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

import numpy as np

from attncli import __version__
from attncli.core.diagnostics import masked_cells
from attncli.core.trace import FEATURES, KEYS, QUERIES, Trace
from attncli.render import colours, escape
from attncli.render.explain import Cell, explain_cell, explain_row, heading
from attncli.render.formulas import step_html
from attncli.render.numbers import MASKED, all_whole, column_format, num
from attncli.render.plot import panel_title
from attncli.render.terminal import INPUT_TITLES, axis_labels, seed_note

MAX_CELLS = 10_000  # cells explained one by one (beyond: rows only, and the page says so)
MAX_ENTRIES = 16  # heads / batch entries in the selector (the first ones)
MAX_SIDE = 64  # rows / columns of a table written into the page (the first ones; the page says so)


def _entries(lead: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The first MAX_ENTRIES heads / batch entries (row-major)."""
    out: list[tuple[int, ...]] = []
    for e in np.ndindex(*lead) if lead else [()]:
        if len(out) == MAX_ENTRIES:
            break
        out.append(e)
    return out


def _per_entry(a: np.ndarray, lead: tuple[int, ...]) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """``a`` (..., r, c) with the weights' leading axes ``lead`` (e.g. batch, head): broadcast from
    the right as numpy does (a per-head step), else from the left (a per-batch input such as X
    of shape (B, T, D) beside weights (B, H, T, S)); otherwise its first matrix for every entry."""
    r, c = a.shape[-2:]
    extra = len(lead) - (a.ndim - 2)
    for shape in (a.shape, a.shape[:-2] + (1,) * max(extra, 0) + (r, c)):
        try:
            return np.broadcast_to(a.reshape(shape), lead + (r, c)), _entries(lead)
        except ValueError:
            continue
    return a.reshape(-1, r, c)[0], [()]


def _table(trace: Trace, name: str, title: str, a: np.ndarray, axes: tuple[str, str], lead: tuple[int, ...],
           precision: int, marked: np.ndarray | None) -> dict[str, Any]:
    """One step as data for the page: its title, labels, and per entry the written cells and their colour (0..1)."""
    r, c = a.shape[-2:]
    per, entries = _per_entry(a, lead)
    r2, c2 = min(r, MAX_SIDE), min(c, MAX_SIDE)
    hid = np.zeros(per.shape, dtype=bool) if marked is None else np.broadcast_to(marked, per.shape)
    vals = per[..., :r2, :c2].astype(np.float64)
    h = hid[..., :r2, :c2]
    good = vals[~h & np.isfinite(vals)]
    lo, hi = (float(good.min()), float(good.max())) if good.size else (0.0, 1.0)
    integers = all_whole(good.ravel())
    fmts = [column_format(vals[..., j][~h[..., j]].ravel(), precision, integers) for j in range(c2)]
    cells, heat = [], []
    for e in entries if per.ndim > 2 else [()]:
        m, mh = per[e][:r2, :c2].astype(np.float64), hid[e][:r2, :c2]
        cells.append([[(MASKED if name != "masked" else num(m[i, j], precision)) if mh[i, j] else fmts[j](m[i, j])
                       for j in range(c2)] for i in range(r2)])
        heat.append([[None if mh[i, j] or not math.isfinite(m[i, j]) else
                      round((m[i, j] - lo) / (hi - lo), 4) if hi > lo else 0.0 for j in range(c2)] for i in range(r2)])
    return {"name": name, "title": title, "axes": list(axes), "rows": axis_labels(trace, axes[0], r)[:r2],
            "cols": axis_labels(trace, axes[1], c)[:c2], "per_entry": per.ndim > 2 and len(entries) > 1,
            "cells": cells, "heat": heat, "qk": tuple(axes) == (QUERIES, KEYS),
            "cut": [r, c] if (r2, c2) != (r, c) else None, "range": [num(lo, precision), num(hi, precision)]}


def page_data(trace: Trace, precision: int = 4) -> dict[str, Any]:
    """Everything the page shows, as plain data: tables, entries, and the explanation of every cell and row."""
    w = trace.weights
    lead = tuple(w.shape[:-2])
    m, n = w.shape[-2:]
    entries = _entries(lead)
    marked = masked_cells(trace)
    tables = []
    same = bool(trace.meta.self_attention)
    for name, a in trace.inputs_numpy().items():
        if same and name in ("k", "v"):
            continue
        a = np.atleast_2d(np.asarray(a))
        if a.ndim < 2 or not np.issubdtype(a.dtype, np.number):
            continue
        title, axes = INPUT_TITLES.get(name, (name, (FEATURES, FEATURES)))
        tables.append(_table(trace, name, f"{'X: Q = K = V' if same and name == 'q' else title} {tuple(a.shape)}",
                             a, axes, lead, precision, None))
    for k, st in enumerate(trace.steps, 1):
        a = np.atleast_2d(st.numpy())
        hid = marked if (st.axes == (QUERIES, KEYS) and marked is not None and a.shape[-2:] == (m, n)
                         and st.name in ("masked", "weights", "hard", "dropout")) else None
        if hid is not None and st.name != "masked":
            hid = hid & (np.broadcast_to(a, hid.shape) == 0)  # a finite fill leaves masked keys a weight
        table = _table(trace, st.name, f"{k}. {st.formula}", a, st.axes, lead, precision, hid)
        table["title_html"] = f"{k}. {step_html(st)}"  # the same formula, from its terms: sub- and superscripts
        tables.append(table)
    m, n = min(m, MAX_SIDE), min(n, MAX_SIDE)  # the cells the tables show
    explain_cells = len(entries) * m * n <= MAX_CELLS
    cells: list[Any] = []
    rows: list[Any] = []
    for e in entries:
        if explain_cells:
            cells.append([[_lines(Cell(trace, e, i, j, precision), "weight({q}, {k})", explain_cell)
                           for j in range(n)] for i in range(m)])
        rows.append([_lines(Cell(trace, e, i, 0, precision), "row {q}", explain_row) for i in range(m)])
    return {"title": f"attncli · {trace.meta.score or 'attention'}", "version": __version__,
            "header": header_lines(trace) + ([f"the first {len(entries)} of {math.prod(lead)} heads / batch entries"]
                                             if math.prod(lead) > len(entries) else []),
            "entries": [panel_title(trace, e) or "the only entry" for e in entries],
            "tables": tables, "cells": cells, "rows": rows, "explained_cells": explain_cells}


def _lines(c: Cell, what: str, fn: Any) -> list[str]:
    return [heading(c, what.format(q=c.query, k=c.key)), *fn(c)]


def header_lines(trace: Trace) -> list[str]:
    m = trace.meta
    shapes = "  ".join(f"{k.upper()} {tuple(s)}" for k, s in (m.shapes or {}).items())
    out = [f"score {m.score} · {m.backend} on {m.device} · {m.dtype} · inputs {shapes}"]
    if m.score_formula:
        out.append(f"score: {m.score_formula}")
    note = seed_note(m)
    if note:
        out.append(note)
    out.extend(f"warning: {w}" for w in trace.warnings)
    return out


def page(trace: Trace, precision: int = 4) -> str:
    """The whole page as one string of HTML."""
    data = json.dumps(escape.terminal_tree(page_data(trace, precision)), ensure_ascii=False, allow_nan=False)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # no tag inside the script
    title = html.escape(f"attncli · {trace.meta.score or 'attention'}")
    js = JS.replace("__PALETTE__", colours.palette_js())
    return TEMPLATE.replace("{title}", title).replace("{data}", data).replace("{css}", CSS).replace("{js}", js)


TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style></head>
<body>
<header><h1 id="title"></h1><div id="meta"></div>
<label id="entry-label">Show <select id="entry" aria-label="head or batch entry"></select></label></header>
<main><section id="steps"></section>
<aside id="panel" aria-live="polite"><h2>Arithmetic</h2>
<p id="hint">Hover over or click a cell of a query × key table to see how it was computed; click a query's
label for its whole softmax and its output.</p><div id="explain"></div></aside></main>
<script type="application/json" id="data">{data}</script>
<script>{js}</script>
</body></html>
"""

CSS = """
:root { --ink: #1a1a1a; --muted: #555; --line: #ccc; --mask: #b0b0b0; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       background: #fff; }
header { padding: 8px 16px; border-bottom: 1px solid var(--line); position: sticky; top: 0; background: #fff;
         z-index: 2; }
h1 { font-size: 20px; margin: 0 0 4px; }
#meta { color: var(--muted); font-size: 13px; white-space: pre-wrap; }
#entry-label { display: inline-block; margin-top: 6px; font-weight: 600; }
select { font-size: 15px; padding: 2px 4px; }
main { display: grid; grid-template-columns: minmax(0, 1fr) 500px; gap: 16px; padding: 8px 16px; }
section h3 { font-size: 15px; margin: 16px 0 4px; }
.wrap { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font: 14px/1.2 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
th, td { border: 1px solid var(--line); padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: #f4f4f4; font-weight: 600; }
th.corner { color: var(--muted); font-weight: normal; }
th.row { text-align: left; }
table.qk th.row { cursor: pointer; text-decoration: underline dotted; }
table.qk td { cursor: pointer; }
td.masked { color: #333; background: repeating-linear-gradient(45deg, var(--mask) 0 4px, #d8d8d8 4px 8px); }
td.sel, th.sel { outline: 3px solid #1f5fbf; outline-offset: -3px; }
.note { color: var(--muted); font-size: 13px; margin: 2px 0; }
aside { position: sticky; top: 110px; align-self: start; max-height: calc(100vh - 120px); overflow: auto;
        border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; background: #fafafa; }
aside h2 { font-size: 16px; margin: 0 0 6px; }
#explain { font: 12px/1.45 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
#explain div { white-space: pre-wrap; word-break: break-word; padding-left: 3ch; text-indent: -3ch; }
#explain div:first-child { font-weight: 700; }
#hint { color: var(--muted); font-size: 13px; }
@media (max-width: 900px) { main { grid-template-columns: 1fr; } aside { position: static; max-height: none; } }
"""

JS = r"""
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const $ = (id) => document.getElementById(id);
  $("title").textContent = D.title;
  $("meta").textContent = D.header.join("\n");
  const sel = $("entry");
  D.entries.forEach((name, k) => { const o = document.createElement("option"); o.value = k; o.textContent = name;
                                   sel.appendChild(o); });
  if (D.entries.length < 2) $("entry-label").style.display = "none";
  let pinned = null;
  // [background, text] of 256 levels: the text colour chosen by WCAG contrast (attncli/render/colours.py)
  const PALETTE = __PALETTE__;
  function colour(t) { return PALETTE[Math.round(Math.min(Math.max(Number(t) || 0, 0), 1) * 255)]; }
  function show(lines, el) {
    const box = $("explain");
    box.textContent = "";
    for (const line of lines || []) {
      const div = document.createElement("div"); div.textContent = line; box.appendChild(div);
    }
    document.querySelectorAll(".sel").forEach((x) => x.classList.remove("sel"));
    if (el) el.classList.add("sel");
  }
  function render() {
    const e = Number(sel.value || 0), root = $("steps");
    root.textContent = "";
    for (const t of D.tables) {
      const h = document.createElement("h3");  // a step's formula: HTML written from its terms, every text escaped
      if (t.title_html) h.innerHTML = t.title_html; else h.textContent = t.title;
      root.appendChild(h);
      const k = t.per_entry ? e : 0, wrap = document.createElement("div"), tab = document.createElement("table");
      wrap.className = "wrap"; tab.dataset.step = t.name; if (t.qk) tab.className = "qk";
      const head = tab.insertRow(), corner = document.createElement("th");
      corner.className = "corner"; corner.textContent = `${t.axes[0]} ↓ ${t.axes[1]} →`; head.appendChild(corner);
      t.cols.forEach((c) => { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); });
      t.rows.forEach((r, i) => {
        const tr = tab.insertRow(), th = document.createElement("th");
        th.className = "row"; th.textContent = r; th.dataset.q = i; tr.appendChild(th);
        t.cells[k][i].forEach((v, j) => {
          const td = tr.insertCell(); td.textContent = v; td.dataset.q = i; td.dataset.k = j;
          const heat = t.heat[k][i][j];
          if (heat === null && v === "·") td.classList.add("masked");
          else if (heat === null && t.qk && t.name === "masked") td.classList.add("masked");
          else if (heat !== null) { const [bg, fg] = colour(heat); td.style.background = bg; td.style.color = fg; }
        });
      });
      if (t.qk) {
        tab.addEventListener("mouseover", (ev) => {
          const td = ev.target.closest("td"); if (!td || pinned || !D.explained_cells) return;
          show(D.cells[e][td.dataset.q][td.dataset.k], td);
        });
        tab.addEventListener("click", (ev) => {
          const cell = ev.target.closest("td, th.row"); if (!cell) return;
          if (cell.tagName === "TH") { pinned = cell; show(D.rows[e][cell.dataset.q], cell); return; }
          if (!D.explained_cells) return;
          pinned = cell; show(D.cells[e][cell.dataset.q][cell.dataset.k], cell);
        });
      }
      wrap.appendChild(tab); root.appendChild(wrap);
      const notes = [`colour from ${t.range[0]} (dark purple) to ${t.range[1]} (yellow), viridis`];  // joined by "; "
      if (t.cells[k].some((r) => r.includes("·"))) notes.push("· masked key (weight exactly 0)");
      if (t.cut) notes.push(`first ${t.rows.length} × ${t.cols.length} of ${t.cut[0]} × ${t.cut[1]} shown`);
      const p = document.createElement("p"); p.className = "note"; p.textContent = notes.join("; ");
      root.appendChild(p);
    }
    if (!D.explained_cells) {
      $("hint").textContent = "This run is too big to explain every cell here; click a query's label for its row, " +
                              "or use --explain.";
    }
  }
  sel.addEventListener("change", () => { pinned = null; show(null); render(); });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { pinned = null; show(null); } });
  render();
})();
"""
