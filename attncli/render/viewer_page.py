"""The page of ``attncli view``: one HTML file, its style and script inline (nothing from the network).

Views: the *grid* of every head (and batch entry) of a layer; the *focus* view of one map, zoomed
and panned with the wheel and the mouse from the whole map down to single cells (token labels when
they fit, the numbers in the cells when they are large enough); a click on a cell shows its
arithmetic, a click on a query's label its row (the server's explanations, the text of --explain);
the *head view* (lines from each query to the keys it attends, one colour per head); and, for a
model, the *model view*: layers × heads thumbnails. Every text from the data is set with
textContent (labels are data, never markup).
"""

from __future__ import annotations

from functools import cache

from attncli.render import colours

CSS = """
:root { --fg: #1d1d1f; --muted: #6b6b70; --line: #d8d8dc; --bg: #fafafa; --accent: #3b528b; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; padding: 8px 14px; border-bottom: 1px solid var(--line);
         background: #fff; position: sticky; top: 0; z-index: 2; }
header h1 { font-size: 16px; margin: 0 12px 0 0; }
header label { color: var(--muted); }
button.tab { border: 1px solid var(--line); background: #fff; padding: 4px 10px; border-radius: 4px; cursor: pointer; }
button.tab.on { background: var(--accent); color: #fff; border-color: var(--accent); }
main { padding: 12px 14px; }
#status { color: var(--muted); }
#grid { display: grid; gap: 10px; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); }
#grid figure, #model figure { margin: 0; cursor: pointer; text-align: center; }
#grid img { width: 160px; height: 160px; image-rendering: pixelated; border: 1px solid var(--line); background: #eee; }
figcaption { font-size: 12px; color: var(--muted); }
#model table { border-collapse: collapse; }
#model .badge { font-size: 10px; color: var(--muted); max-width: 66px; overflow-wrap: anywhere; }
#model th { font-weight: normal; color: var(--muted); font-size: 12px; padding: 2px 6px; }
#model img { width: 64px; height: 64px; image-rendering: pixelated; border: 1px solid var(--line); cursor: pointer;
             background: #eee; }
#focus-wrap { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
#focus { border: 1px solid var(--line); background: #fff; cursor: crosshair; touch-action: none; }
#side { flex: 1; min-width: 320px; }
#explain { white-space: pre-wrap; font: 12px/1.45 ui-monospace, Menlo, Consolas, monospace; background: #fff;
           border: 1px solid var(--line); padding: 8px; overflow: auto; max-height: 70vh; overflow-wrap: normal; }
#explain > div { min-height: 1.45em; }
#explain .t { white-space: pre; }
#explain-heading { font-weight: 600; margin: 6px 0; }
.hint { color: var(--muted); font-size: 12px; }
#heads svg text { font: 11px ui-monospace, Menlo, Consolas, monospace; cursor: default; }
#head-keys label { margin-right: 8px; font-size: 12px; white-space: nowrap; }
.legend { display: inline-flex; align-items: center; gap: 6px; font-size: 12px; color: var(--muted); }
.legend span.bar { width: 120px; height: 10px; display: inline-block; border: 1px solid var(--line); }
"""

JS = r"""
(function () {
  "use strict";
  const TOKEN = new URLSearchParams(location.search).get("token") || "";
  const STOPS = __STOPS__;
  const $ = (id) => document.getElementById(id);
  const el = (tag, props, kids) => { const e = document.createElement(tag); Object.assign(e, props || {});
                                     (kids || []).forEach((k) => e.appendChild(k)); return e; };
  function url(path, params) {
    const q = new URLSearchParams(Object.assign({ token: TOKEN }, params));
    return `${path}?${q.toString()}`;
  }
  async function api(path, params) {
    const r = await fetch(url(path, params));
    if (!r.ok) throw new Error((await r.text()).trim());
    return r.json();
  }
  // [background, text] of 256 levels: the text colour chosen by WCAG contrast (attncli/render/colours.py)
  const PALETTE = __PALETTE__;
  function colour(t) { return PALETTE[Math.round(Math.min(Math.max(Number(t) || 0, 0), 1) * 255)]; }
  $("legend-bar").style.background = `linear-gradient(to right, ${STOPS.map((c) => `rgb(${c.join(",")})`).join(",")})`;

  const S = { meta: null, layer: 0, step: null, entry: null, view: "grid" };
  window.attncliView = S;  // the state, for tests and the curious

  function L() { return S.meta.layers[S.layer]; }
  function entryKey(e) { return e.index.join(","); }

  function setView(v) {
    S.view = v;
    for (const name of ["model", "grid", "focus", "heads"]) {
      $(name + "-section").hidden = name !== v;
      const b = $("tab-" + name); if (b) b.classList.toggle("on", name === v);
    }
    if (v === "grid") drawGrid();
    if (v === "focus") drawFocus(true);
    if (v === "heads") drawHeads();
    if (v === "model") drawModel();
  }

  function fillSteps() {
    const sel = $("step"); sel.textContent = "";
    for (const s of L().steps) sel.appendChild(el("option", { value: s, textContent: s }));
    if (!L().steps.includes(S.step)) S.step = L().weights_step;
    sel.value = S.step;
  }

  // ---- model view: layers × heads ----
  function drawModel() {
    const root = $("model"); root.textContent = "";
    const tab = el("table"), head = tab.insertRow();
    head.appendChild(el("th"));
    S.meta.layers[0].entries.forEach((e) => head.appendChild(el("th", { textContent: e.title })));
    S.meta.layers.forEach((layer, li) => {
      const tr = tab.insertRow(); tr.appendChild(el("th", { textContent: layer.name }));
      layer.entries.forEach((e, k) => {
        const ph = (layer.patterns || [])[e.index.length ? e.index[e.index.length - 1] : 0];
        const stats = ph ? Object.entries(ph.stats).filter(([, v]) => v !== null).map(([n, v]) => `${n} ${v}`) : [];
        const img = el("img", { alt: `${layer.name} ${e.title}`,
                                title: [`${layer.name}, ${e.title}`, ph && ph.patterns.length ? "patterns: " +
                                         ph.patterns.join(", ") : "", ...stats].filter(Boolean).join("\n") });
        img.dataset.layer = li; img.dataset.entry = k;
        img.src = url("/api/tile", { layer: li, entry: entryKey(e), step: layer.weights_step, r0: 0, r1: layer.m,
                                     c0: 0, c1: layer.n, w: 64, h: 64 });
        img.addEventListener("click", () => { S.layer = li; $("layer").value = li; fillSteps(); S.entry = k;
                                              resetZoom(); setView("focus"); });
        const cell = tr.insertCell(); cell.appendChild(img);
        if (ph && ph.patterns.length) cell.appendChild(el("div", { className: "badge", textContent: ph.patterns.join(" ") }));
      });
    });
    root.appendChild(tab);
  }

  // ---- grid: every head and batch entry of the layer ----
  function drawGrid() {
    const root = $("grid"), layer = L(); root.textContent = "";
    layer.entries.forEach((e, k) => {
      const img = el("img", { alt: e.title });
      img.src = url("/api/tile", { layer: S.layer, entry: entryKey(e), step: S.step, r0: 0, r1: layer.m, c0: 0,
                                   c1: layer.n, w: 160, h: 160 });
      const fig = el("figure", {}, [img, el("figcaption", { textContent: e.title })]);
      fig.dataset.entry = k;
      fig.addEventListener("click", () => { S.entry = k; resetZoom(); setView("focus"); });
      root.appendChild(fig);
    });
    $("status").textContent = `${layer.name}: ${layer.entries.length} map(s) of ${layer.m} queries × ${layer.n} keys` +
      (layer.block[0] > 1 || layer.block[1] > 1 ? "; thumbnails show the largest value of each block of cells" : "");
    showScale();
  }
  async function showScale() {
    const want = [S.layer, S.step].join("/");
    try {
      const d = await api("/api/scale", { layer: S.layer, step: S.step });
      if ([S.layer, S.step].join("/") !== want) return;
      $("legend-lo").textContent = d.lo.toPrecision(3);
      const clipped = ` (the ${d.clip}th percentile; up to ${d.max.toPrecision(3)} drawn as bright)`;
      $("legend-hi").textContent = d.hi.toPrecision(3) + (d.hi < d.max ? clipped : "");
    } catch (err) { /* the tiles say it */ }
  }

  // ---- focus: one map, zoom and pan down to single cells ----
  const W = 640, H = 640, ML = 96, MT = 80;  // the map's pixels; margins for the labels
  const Z = { r0: 0, c0: 0, span: 1 };  // the view: first row and column shown, cells across
  let tileImg = null, tileKey = "", cellValues = null, cellKey = "", dragging = null;
  function resetZoom() { const l = L(); Z.r0 = 0; Z.c0 = 0; Z.span = Math.max(l.m, l.n); }
  function clampZoom() {
    const l = L();
    Z.span = Math.min(Math.max(Z.span, 2), Math.max(l.m, l.n));
    Z.r0 = Math.min(Math.max(Z.r0, 0), Math.max(0, l.m - Z.span));
    Z.c0 = Math.min(Math.max(Z.c0, 0), Math.max(0, l.n - Z.span));
  }
  function region() {
    const l = L(), r0 = Math.floor(Z.r0), c0 = Math.floor(Z.c0);
    return { r0, c0, r1: Math.min(l.m, Math.ceil(Z.r0 + Z.span)), c1: Math.min(l.n, Math.ceil(Z.c0 + Z.span)) };
  }
  function drawFocus(fetchNow) {
    const cv = $("focus"), ctx = cv.getContext("2d"), l = L(), e = l.entries[S.entry || 0];
    clampZoom();
    const px = W / Z.span, g = region();
    cv.dataset.r0 = Z.r0; cv.dataset.c0 = Z.c0; cv.dataset.span = Z.span; cv.dataset.cell = px;
    cv.dataset.ml = ML; cv.dataset.mt = MT;
    $("focus-title").textContent = `${l.name}, ${e.title}: ${S.step} (rows ${g.r0}..${g.r1 - 1}, keys ${g.c0}..${g.c1 - 1})`;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, cv.width, cv.height);
    const key = [S.layer, S.entry, S.step, g.r0, g.r1, g.c0, g.c1].join("/");
    if (tileImg && tileImg.complete && tileImg.dataset.key === key) {
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(tileImg, ML + (g.c0 - Z.c0) * px, MT + (g.r0 - Z.r0) * px, (g.c1 - g.c0) * px, (g.r1 - g.r0) * px);
    } else if (fetchNow !== false && tileKey !== key) {
      tileKey = key;
      const img = new Image(); img.dataset.key = key;
      const w = Math.min(2048, Math.ceil((g.c1 - g.c0) * px)), h = Math.min(2048, Math.ceil((g.r1 - g.r0) * px));
      img.onload = () => { if (img.dataset.key === tileKey) { tileImg = img; drawFocus(false); cv.dataset.ready = key; } };
      img.src = url("/api/tile", { layer: S.layer, entry: entryKey(e), step: S.step, r0: g.r0, r1: g.r1, c0: g.c0,
                                   c1: g.c1, w: Math.max(1, w), h: Math.max(1, h) });
    }
    ctx.save(); ctx.beginPath(); ctx.rect(0, 0, cv.width, cv.height); ctx.clip();
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, ML, cv.height); ctx.fillRect(0, 0, cv.width, MT);
    ctx.strokeStyle = "#999"; ctx.strokeRect(ML, MT, W, H);
    if (px >= 10) {  // token labels
      ctx.fillStyle = "#1d1d1f"; ctx.font = `${Math.min(12, px * 0.8)}px ui-monospace, Menlo, monospace`;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (let i = g.r0; i < g.r1; i++) ctx.fillText(l.query_labels[i].slice(0, 12), ML - 4, MT + (i - Z.r0 + 0.5) * px);
      for (let j = g.c0; j < g.c1; j++) {
        ctx.save(); ctx.translate(ML + (j - Z.c0 + 0.5) * px, MT - 4); ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left"; ctx.fillText(l.key_labels[j].slice(0, 12), 0, 0); ctx.restore();
      }
    } else {
      ctx.fillStyle = "#6b6b70"; ctx.font = "11px system-ui"; ctx.textAlign = "left";
      ctx.fillText("queries ↓  keys →  (wheel: zoom, drag: pan)", ML, MT - 8);
    }
    if (px >= 40 && g.r1 - g.r0 <= 64 && g.c1 - g.c0 <= 64) {  // the numbers, exact, from the server
      const ck = key;
      if (cellKey === ck && cellValues) {
        ctx.font = "11px ui-monospace, Menlo, monospace"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
        const [lo, hi] = [cellValues.lo, cellValues.hi];
        cellValues.values.forEach((row, a) => row.forEach((v, b) => {
          if (v === null) return;
          ctx.fillStyle = colour((v - lo) / ((hi - lo) || 1))[1];
          ctx.fillText(v.toPrecision(3), ML + (g.c0 + b - Z.c0 + 0.5) * px, MT + (g.r0 + a - Z.r0 + 0.5) * px);
        }));
      } else if (fetchNow !== false) {
        cellKey = ck; cellValues = null;
        api("/api/cells", { layer: S.layer, entry: entryKey(e), step: S.step, r0: g.r0, r1: g.r1, c0: g.c0, c1: g.c1 })
          .then((d) => { if (cellKey === ck) { const flat = d.values.flat().filter((v) => v !== null);
                         cellValues = Object.assign(d, { lo: Math.min(...flat), hi: Math.max(...flat) }); drawFocus(false); } })
          .catch(() => {});
      }
    }
    ctx.restore();
  }
  function cellAt(ev) {
    const cv = $("focus"), r = cv.getBoundingClientRect(), x = ev.clientX - r.left - ML, y = ev.clientY - r.top - MT;
    const px = W / Z.span;
    return { i: Math.floor(Z.r0 + y / px), j: Math.floor(Z.c0 + x / px), x, y };
  }
  function setupFocus() {
    const cv = $("focus");
    cv.width = ML + W + 4; cv.height = MT + H + 4;
    cv.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const c = cellAt(ev), px = W / Z.span, f = ev.deltaY < 0 ? 0.8 : 1.25;
      const fy = Z.r0 + c.y / px, fx = Z.c0 + c.x / px;
      Z.span *= f; clampZoom(); const npx = W / Z.span;
      Z.r0 = fy - c.y / npx; Z.c0 = fx - c.x / npx; drawFocus();
    }, { passive: false });
    cv.addEventListener("mousedown", (ev) => { dragging = { x: ev.clientX, y: ev.clientY, r0: Z.r0, c0: Z.c0, moved: false }; });
    window.addEventListener("mousemove", (ev) => {
      if (!dragging) return;
      const px = W / Z.span, dx = ev.clientX - dragging.x, dy = ev.clientY - dragging.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) dragging.moved = true;
      if (dragging.moved) { Z.c0 = dragging.c0 - dx / px; Z.r0 = dragging.r0 - dy / px; drawFocus(); }
    });
    window.addEventListener("mouseup", (ev) => {
      const d = dragging; dragging = null;
      if (!d || d.moved || S.view !== "focus") return;
      const c = cellAt(ev), l = L();
      if (c.i < 0 || c.i >= l.m) return;
      if (c.x < 0 && c.y >= 0) explain(c.i, null);  // a query's label: its row
      else if (c.x >= 0 && c.y >= 0 && c.j < l.n) explain(c.i, c.j);
    });
  }
  // A line of the arithmetic, wrapped to the panel at word boundaries as --explain wraps it in the terminal
  // (attncli/render/wrap.py): never inside a short bracketed group such as (0, 1.25) or exp(4 − 4), never
  // after an operator alone; continuation lines hang 4 columns past the line's own indent.
  const OPS = "=+-−×·/÷Σ∑→<>≤≥≈*^|";
  function wrapped(line) {
    const glued = new Array(line.length).fill(false), stack = [];
    for (let i = 0; i < line.length; i++) {
      if ("([{".includes(line[i])) stack.push(i);
      else if (")]}".includes(line[i]) && stack.length) {
        const s = stack.pop();
        if (i - s < 32) for (let k = s; k < i; k++) glued[k] = true;
      }
    }
    const div = document.createElement("div"), indent = line.length - line.trimStart().length;
    div.style.paddingLeft = `${indent + 4}ch`; div.style.textIndent = `-${indent + 4}ch`;
    if (indent) div.appendChild(document.createTextNode(line.slice(0, indent)));
    let token = "";
    const flush = () => {
      if (!token) return;
      const span = document.createElement("span"); span.className = "t"; span.textContent = token;
      div.appendChild(span); token = "";
    };
    for (let i = indent; i < line.length; i++) {
      const c = line[i];
      const opAlone = token !== "" && [...token].every((x) => OPS.includes(x));
      if (c === " " && !glued[i] && !opAlone) { flush(); div.appendChild(document.createTextNode(" ")); }
      else token += c;
    }
    flush();
    return div;
  }
  async function explain(i, j) {
    const l = L(), e = l.entries[S.entry || 0], box = $("explain");
    $("explain-heading").textContent = "computing…"; box.textContent = "";
    const params = { layer: S.layer, entry: entryKey(e), i };
    if (j !== null) params.j = j;
    try {
      const d = await api("/api/explain", params);
      $("explain-heading").textContent = d.heading;
      box.textContent = "";
      for (const line of d.lines) box.appendChild(wrapped(line));
      box.dataset.i = i; box.dataset.j = j === null ? "" : j;
    } catch (err) { $("explain-heading").textContent = String(err.message || err); }
  }

  // ---- head view: lines from each query to the keys it attends ----
  async function drawHeads() {
    const l = L(), root = $("heads"); root.textContent = "";
    if (l.m > S.meta.head_view_max || l.n > S.meta.head_view_max) {
      root.appendChild(el("p", { textContent: `The head view draws up to ${S.meta.head_view_max} tokens; ` +
                                              `this layer has ${l.m} × ${l.n}. Use the grid and zoom instead.` }));
      return;
    }
    const e = l.entries[S.entry || 0];
    root.appendChild(el("p", { className: "hint", textContent: "computing…" }));
    const d = await api("/api/heads", { layer: S.layer, entry: entryKey(e) });
    root.textContent = "";
    const H = d.heads.length, on = d.heads.map(() => true);
    const keys = el("div", { id: "head-keys" });
    d.heads.forEach((name, h) => {
      const box = el("input", { type: "checkbox", checked: true });
      box.addEventListener("change", () => { on[h] = box.checked; paint(null); });
      const lab = el("label", {}, [box, el("span", { textContent: " " + name })]);
      lab.style.color = `hsl(${Math.round(h * 360 / H)}, 70%, 40%)`;
      keys.appendChild(lab);
    });
    root.appendChild(keys);
    root.appendChild(el("p", { className: "hint", textContent: "each query's strongest keys (weight ≥ 0.02, at most 8 " +
                                                                "per head); hover a query to see its lines alone" }));
    const NS = "http://www.w3.org/2000/svg", rowH = 16, width = 520, top = 10;
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", width); svg.setAttribute("height", top + Math.max(l.m, l.n) * rowH + 10);
    const lines = document.createElementNS(NS, "g");
    svg.appendChild(lines);
    const text = (x, y, s, anchor) => { const t = document.createElementNS(NS, "text"); t.setAttribute("x", x);
      t.setAttribute("y", y); t.setAttribute("text-anchor", anchor); t.setAttribute("dominant-baseline", "middle");
      t.textContent = s; svg.appendChild(t); return t; };
    for (let i = 0; i < l.m; i++) {
      const t = text(150, top + (i + 0.5) * rowH, l.query_labels[i].slice(0, 18), "end");
      t.addEventListener("mouseenter", () => paint(i)); t.addEventListener("mouseleave", () => paint(null));
    }
    for (let j = 0; j < l.n; j++) text(width - 150, top + (j + 0.5) * rowH, l.key_labels[j].slice(0, 18), "start");
    function paint(only) {
      lines.textContent = "";
      for (const [h, i, j, w] of d.lines) {
        if (!on[h] || (only !== null && i !== only)) continue;
        const ln = document.createElementNS(NS, "line");
        ln.setAttribute("x1", 156); ln.setAttribute("y1", top + (i + 0.5) * rowH);
        ln.setAttribute("x2", width - 156); ln.setAttribute("y2", top + (j + 0.5) * rowH);
        ln.setAttribute("stroke", `hsl(${Math.round(h * 360 / H)}, 70%, 45%)`);
        ln.setAttribute("stroke-opacity", Math.min(1, w).toFixed(3)); ln.setAttribute("stroke-width", 2);
        ln.dataset.head = h; ln.dataset.q = i; ln.dataset.k = j; ln.dataset.w = w;
        lines.appendChild(ln);
      }
    }
    paint(null);
    root.appendChild(svg);
  }

  async function main() {
    try { S.meta = await api("/api/meta", {}); }
    catch (err) { $("status").textContent = String(err.message || err); return; }
    $("title").textContent = S.meta.title;
    const sel = $("layer");
    S.meta.layers.forEach((l, k) => sel.appendChild(el("option", { value: k, textContent: l.name })));
    $("layer-label").hidden = S.meta.layers.length < 2;
    $("tab-model").hidden = !S.meta.model;
    sel.addEventListener("change", () => {
      S.layer = Number(sel.value); fillSteps(); S.entry = 0; resetZoom(); setView(S.view === "model" ? "grid" : S.view);
    });
    $("step").addEventListener("change", () => { S.step = $("step").value; setView(S.view); });
    for (const name of ["model", "grid", "focus", "heads"]) $("tab-" + name).addEventListener("click", () => {
      if (name === "focus" && S.entry === null) S.entry = 0;
      if (name === "focus") resetZoom();
      setView(name);
    });
    fillSteps(); setupFocus(); S.entry = 0; resetZoom();
    setView(S.meta.model ? "model" : "grid");
  }
  main();
})();
"""

BODY = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer"><title>attncli view</title><style>__CSS__</style></head>
<body>
<header>
  <h1 id="title">attncli view</h1>
  <button class="tab" id="tab-model" hidden>model</button>
  <button class="tab" id="tab-grid">heads</button>
  <button class="tab" id="tab-focus">zoom</button>
  <button class="tab" id="tab-heads">head view</button>
  <label id="layer-label">layer <select id="layer"></select></label>
  <label>step <select id="step"></select></label>
  <span class="legend"><span id="legend-lo">low</span> <span class="bar" id="legend-bar"></span>
    <span id="legend-hi">high</span>; grey: masked</span>
</header>
<main>
  <p id="status"></p>
  <section id="model-section" hidden><div id="model"></div></section>
  <section id="grid-section" hidden><div id="grid"></div></section>
  <section id="focus-section" hidden>
    <div id="focus-title"></div>
    <div id="focus-wrap">
      <canvas id="focus"></canvas>
      <div id="side">
        <p class="hint">Wheel: zoom; drag: pan. Click a cell for its arithmetic, a query's label for its row
        (the softmax and the output). Labels appear when the cells are large enough, numbers when larger.</p>
        <div id="explain-heading"></div>
        <div id="explain"></div>
      </div>
    </div>
  </section>
  <section id="heads-section" hidden><div id="heads"></div></section>
</main>
<script>__JS__</script>
</body></html>
"""


@cache
def page() -> str:
    """The viewer's page (the same for every layer: it asks the server for the data)."""
    stops = "[" + ", ".join(f"[{r},{g},{b}]" for r, g, b in colours.STOPS) + "]"
    return BODY.replace("__CSS__", CSS).replace("__JS__", JS.replace("__STOPS__", stops).replace("__PALETTE__",
                                                                                       colours.palette_js()))
