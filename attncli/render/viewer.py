"""``attncli view``: a local viewer of every head of a layer (or every layer of a model), served on
127.0.0.1 by the standard library's ThreadingHTTPServer.

What it computes, and when (memory stays bounded whatever the size):

- every stage before the scores once per layer (attncli.core.engine.prepare: projections, split,
  QK-norm, RoPE);
- the steps up to the weights (scores, scaled, capped, masked, weights, ...) a block of queries at a
  time, every head of the block together (attncli.core.engine.attention_weights, the engine's own
  code): first one sweep over all rows that keeps an *overview* of each step and head (at most
  OVERVIEW × OVERVIEW values: each the largest of its block of cells, NaN where all are masked), then,
  when the page zooms in below the overview's blocks, the exact rows asked for, kept in a cache of at
  most CACHE_BYTES (least recently used first out);
- a cell's or a row's arithmetic: the steps of that one query against every key, put in a trace of
  the problem's shape (the row repeated by a zero-stride view, never copied), explained by
  attncli.render.explain's functions: the same text as ``--explain`` and ``--explain-row``.

Tiles are PNGs made here (zlib + struct, no matplotlib), coloured with attncli.render.colours
(viridis; masked cells grey). The page (attncli.render.viewer_page) has every script and style
inline and loads nothing from the network.

Security: the server listens on 127.0.0.1 only; every request needs the random token of the URL
(403 without it) and a Host header naming 127.0.0.1 or localhost at the server's port (403
otherwise: DNS rebinding); it serves its page and its data only (any other path: 404; no file path
ever comes from the browser); it is read-only (405 for anything but GET).
"""

from __future__ import annotations

import hmac
import json
import math
import os
import struct
import threading
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from attncli.core.backend import to_numpy
from attncli.core.engine import Prepared, attention_weights, hidden_after, prepare
from attncli.core.ops import expand_kv, weighted_sum
from attncli.core.params import WeightedSum
from attncli.core.problem import Problem
from attncli.core.projections import LATENT
from attncli.core.trace import FEATURES, KEYS, QUERIES, Step, Trace
from attncli.render import colours

OVERVIEW = 512  # values per axis of a step's overview (per head)
BLOCK_BYTES = 48 << 20  # the steps of one block of queries, every head together, while it is computed
BLOCK_ROWS = 16  # ... at least this many queries a block, within BLOCK_MAX: BLAS multiplies a few rows by a whole Kᵀ
BLOCK_MAX = 192 << 20  # at a fraction of its speed (float64, 64 heads × 2048 keys: 4 rows 3.4x slower than 20)
CACHE_BYTES = 256 << 20  # exact rows kept for zoomed-in tiles
EXACT_ROWS = 256  # a tile of at most this many rows (and finer than the overview) is drawn from exact rows
HEAD_VIEW_MAX = 512  # the head view draws lines for at most this many queries and keys
HEAD_VIEW_TOP = 8  # lines per query and head: its strongest keys ...
HEAD_VIEW_MIN = 0.02  # ... of at least this weight
ROW_TRACES = 4  # row traces kept (each every head's steps of one query: (..., 1, n) per step)
MAX_TILE = 2048  # pixels per axis of one tile
CLIP = 99.5  # percentile of a step's overview that takes the brightest colour
PARAMETERS = {"W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", *LATENT, "W_g"}  # steps an unbatched run keeps whole
WORKERS = max(1, min(4, os.cpu_count() or 1))  # blocks computed side by side in a sweep


def png(rgb: np.ndarray) -> bytes:
    """An (h, w, 3) uint8 image as a PNG file (8-bit RGB, no filter): zlib and struct only."""
    h, w, _ = rgb.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = np.concatenate([np.zeros((h, 1), np.uint8), np.ascontiguousarray(rgb, np.uint8).reshape(h, w * 3)], axis=1)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))


TABLE = colours.table()


def colour(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Values (h, w) as viridis colours on the scale lo..hi; NaN (masked) grey."""
    span = hi - lo if hi > lo else 1.0
    t = np.clip((np.nan_to_num(a, nan=lo) - lo) / span, 0.0, 1.0)
    rgb = TABLE[np.rint(t * 255).astype(np.intp)]
    rgb[np.isnan(a)] = colours.MASKED_RGB
    return rgb


def pool(a: np.ndarray, fr: int, fc: int) -> np.ndarray:
    """``a`` (..., m, n) in blocks of fr × fc: each the largest non-NaN value, NaN when all are NaN (or -inf)."""
    if fr == 1 and fc == 1:
        return a
    m, n = a.shape[-2:]
    M, N = math.ceil(m / fr), math.ceil(n / fc)
    if (m, n) != (M * fr, N * fc):  # a last partial block: NaN-padded (fmax ignores NaN)
        pad = np.full(a.shape[:-2] + (M * fr, N * fc), np.nan, dtype=np.float32)
        pad[..., :m, :n] = a
        a = pad
    rows = np.fmax.reduce(a.reshape(a.shape[:-2] + (M, fr, N * fc)), axis=-2) if fr > 1 else a  # (..., M, N·fc)
    big = rows[..., 0::fc]  # (..., M, N): the columns of each block side by side, one strided slice at a time
    for j in range(1, fc):  # ~10x faster than a reduction over a short last axis
        big = np.fmax(big, rows[..., j::fc])  # (the rows first: these passes read fr times fewer values)
    big = np.asarray(big, dtype=np.float32)
    big[np.isneginf(big)] = np.nan
    return big


def finite_range(a: np.ndarray) -> tuple[float, float]:
    """The smallest and largest finite value of ``a`` ((inf, -inf) when none is): two reductions that skip NaN,
    the finite values picked out only when an infinity is there."""
    if a.size == 0:
        return math.inf, -math.inf
    lo, hi = float(np.fmin.reduce(a, axis=None)), float(np.fmax.reduce(a, axis=None))
    if math.isinf(lo) or math.isinf(hi):
        kept = a[np.isfinite(a)]
        return (float(kept.min()), float(kept.max())) if kept.size else (math.inf, -math.inf)
    if math.isnan(lo):  # every value NaN
        return math.inf, -math.inf
    return lo, hi


def png_of(a: np.ndarray, lo: float, hi: float) -> bytes:
    return png(colour(a, lo, hi))


@dataclass
class Overview:
    """One step's overview: (..., M, N) values, each the largest of fr × fc cells; its colour range."""

    values: np.ndarray
    fr: int
    fc: int
    lo: float = math.inf
    hi: float = -math.inf
    top: float = -math.inf  # the CLIP percentile of the overview's values: the colour scale's bright end
    masked: bool = False  # whether the mask hid any cell


class Layer:
    """One attention layer: its prepared stages, overviews of its steps, exact rows on demand."""

    def __init__(self, problem: Problem, name: str, overview: int = OVERVIEW) -> None:
        self.problem, self.name = problem, name
        self.p: Prepared = prepare(problem)
        core, be = self.p.core, self.p.backend
        self.k = expand_kv(be.xp, self.p.k, core.n_rep) if core.n_rep > 1 else self.p.k
        if be.name == "numpy":  # K as the transpose of a C-contiguous Kᵀ: numpy's batched q @ Kᵀ then runs in BLAS
            self.k = np.swapaxes(np.ascontiguousarray(np.swapaxes(self.k, -1, -2)), -1, -2)  # (~25x faster)
        self._v: Any = None  # V with a value head per query head: made when a row's output is first explained
        self.m, self.n = core.m, core.n
        self.unbatch = self.p.projected and not problem.batched  # as the engine: no batch axis in any step
        probe, _ = self._compute(np.arange(1))
        self.steps = list(probe)
        self.lead: tuple[int, ...] = tuple(probe[self.steps[0]].shape[:-2])
        self.weights_step = self._weights_step
        self.resize(overview)
        self.overviews: dict[str, Overview] = {}
        self.ready = {s: threading.Event() for s in self.steps}
        self.lock = threading.Lock()
        self.failed: str | None = None
        self._steps64: list[Step] | None = None
        self._row_traces: OrderedDict[int, Trace] = OrderedDict()  # the last row traces made (row_trace)
        self._row_lock = threading.Lock()
        self._inputs64: dict[str, Any] = {}
        self._patterns: list[dict[str, Any]] | None = None
        self.named: list[dict[str, Any]] = []  # the diagnostics' head_patterns of this layer (set by the CLI)
        # a capture's positions (set by the CLI): per entry, the queries' and, for cross-attention, the keys'
        # headstats.Sequence (token ids, special tokens, punctuation), as `self` and `heads` read them
        self.sequences: tuple[list[Any], list[Any] | None] | None = None

    def patterns(self) -> list[dict[str, Any]]:
        """Per query head: the patterns it passes and its statistics (attncli.core.headstats, over every valid query
        of the batch, default thresholds), for the model view's badges (cross-attention: those needing no shared
        positions); with a capture's ``sequences``, those needing token ids too (induction, duplicate, special);
        [] for a path without the blocked pass."""
        if self._patterns is None:
            from attncli.core import headstats as hs
            from attncli.errors import AttnError

            out: list[dict[str, Any]] = []
            if len(self.p.core.batch_shape) == 2:
                queries, keys = self.sequences if self.sequences is not None else self._positions()
                try:
                    sums, counts = hs.layer_sums(self.p, queries, keys=keys)
                except AttnError:
                    sums = None
                if sums is not None:
                    with np.errstate(invalid="ignore", divide="ignore"):
                        mean = np.where(counts.sum(0) > 0, sums.sum(0) / np.maximum(counts.sum(0), 1), np.nan)
                    limits = hs.thresholds()
                    for h in range(mean.shape[0]):
                        stats = {n: None if np.isnan(mean[h, k]) else round(float(mean[h, k]), 4)
                                 for k, n in enumerate(hs.STATS)}
                        out.append({"patterns": hs.patterns(stats, limits), "stats": stats})
            self._patterns = out
        return self._patterns

    def _positions(self) -> tuple[list[Any], list[Any] | None]:
        """Without a capture: the positions the problem itself knows (valid keys from its padding, punctuation from
        its labels; no token ids): the queries' and, for cross-attention, the keys' headstats.Sequence."""
        from attncli.core import headstats as hs

        core = self.p.core
        pad = core.padding
        B = int(core.batch_shape[0])
        valid = np.ones((B, core.n), bool) if pad is None or pad.dtype != bool else \
            ~np.broadcast_to(pad, (B, 1, 1, core.n))[:, 0, 0, :]
        labels = core.key_labels
        punct = None if labels is None else np.array([hs.is_punctuation(t) for t in labels])
        keyed = [hs.Sequence(valid[b], punctuation=punct) for b in range(B)]
        cross = core.m != core.n or (getattr(self.problem, "memory", None) is not None
                                     and not self.problem.self_attention)  # a layer with a memory
        return ([hs.Sequence.plain(core.m)] * B, keyed) if cross else (keyed, None)

    def v(self) -> Any:
        """V, grouped-query heads expanded (query head h reads value head h // n_rep)."""
        if self._v is None:
            core = self.p.core
            self._v = expand_kv(self.p.backend.xp, self.p.v, core.n_rep) if core.n_rep > 1 else self.p.v
        return self._v

    def resize(self, overview: int) -> None:
        """Overviews of at most ``overview`` values per axis (before any is made), and the block of queries
        computed at a time: whole blocks of the overview within BLOCK_BYTES."""
        heads = int(np.prod(self.lead)) if self.lead else 1
        item = int(getattr(self.p.q.dtype, "itemsize", 4))  # float64 blocks hold twice float32's bytes
        size = self.m and max(1, heads * self.n * item * (len(self.steps) + 1))  # a row's steps and its mask
        rows = max(BLOCK_BYTES // WORKERS // size, min(BLOCK_ROWS, BLOCK_MAX // WORKERS // size))
        self.block = max(1, min(self.m, rows))
        self.fr, self.fc = max(1, math.ceil(self.m / overview)), max(1, math.ceil(self.n / overview))
        self.block = max(self.fr, self.block // self.fr * self.fr)  # whole blocks of the overview
        # blocks side by side within BLOCK_MAX (one at a time when a block of the overview is larger)
        self.workers = max(1, min(WORKERS, BLOCK_MAX // max(1, self.block * size)))

    # ---- computing ----

    def _compute(self, rows: np.ndarray, keys: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The query × key steps of ``rows``, every head (name -> values), and where the mask hid a key
        (None: no mask step); against the first ``keys`` keys only when given (see engine.hidden_after)."""
        part = self._part(rows, keys)
        self._weights_step = part.meta.weights_step or "weights"
        qk = [s for s in part.steps if s.axes == (QUERIES, KEYS) and s.numpy().ndim == len(self.p.q.shape)]
        hidden: np.ndarray | None = None
        for before, s in zip(qk, qk[1:]):  # masked cells: those the mask step changed
            if s.name == "masked":
                a, b = s.numpy(), before.numpy()
                hidden = (a != b) & ~(np.isnan(a) & np.isnan(b))
        if self.unbatch:
            return {s.name: s.numpy()[0] for s in qk}, None if hidden is None else hidden[0]
        return {s.name: s.numpy() for s in qk}, hidden

    def exact(self, rows: np.ndarray, step: str) -> np.ndarray:
        """Step ``step`` of ``rows`` (..., r, n) as float32, NaN where masked or not finite."""
        arrays, hidden = self._compute(rows)
        a = arrays[step]
        bad = ~np.isfinite(a) if hidden is None else hidden | ~np.isfinite(a)
        return np.where(bad, np.nan, a).astype(np.float32)

    def _part(self, rows: np.ndarray, keys: int | None = None) -> Trace:
        be = self.p.backend
        qr = be.xp.take(self.p.q, be.asarray(rows, "int64") if be.name == "torch" else rows, axis=-2)  # (..., r, d)
        part = Trace(query_labels=self.problem.query_labels, key_labels=self.problem.key_labels)
        attention_weights(self.p.core, be, qr, self.k, self.p.score_weights, part, rows=rows, keys=keys)
        return part

    def sweep(self, step: str) -> None:
        """Every row once, a block at a time: the overview of ``step`` (once; other threads wait)."""
        self.sweep_all([step])

    def sweep_all(self, steps: list[str]) -> None:
        """The overviews of ``steps`` not made yet, from one pass over the rows (a block at a time)."""
        with self.lock:
            todo = list(dict.fromkeys(s for s in steps if not self.ready[s].is_set()))
            if not todo:
                return
            try:
                M, N = math.ceil(self.m / self.fr), math.ceil(self.n / self.fc)
                ovs = {s: Overview(np.full(self.lead + (M, N), np.nan, np.float32), self.fr, self.fc) for s in todo}

                def one(r0: int) -> dict[str, tuple[float, float, bool]]:  # numpy lets go of the GIL: side by side
                    r1 = min(self.m, r0 + self.block)
                    rows = np.arange(r0, r1)
                    keys = hidden_after(self.p.core, rows)  # a causal block: the keys after its last query not computed
                    arrays, hidden = self._compute(rows, keys)  # (their cells: masked, NaN in the overview)
                    out = {}
                    for s, ov in ovs.items():
                        a = arrays[s]
                        shown = a if hidden is None else np.where(hidden, np.nan, a)
                        ov.values[..., r0 // self.fr:math.ceil(r1 / self.fr), :math.ceil(a.shape[-1] / self.fc)] = \
                            pool(shown, self.fr, self.fc)
                        out[s] = finite_range(shown) + (keys is not None or (hidden is not None and bool(hidden.any())),)
                    return out

                from threadpoolctl import threadpool_limits

                # the blocks run side by side, each with one BLAS thread: BLAS's own threads on top of them
                # (or on a busy machine) wait on each other, up to 40x slower
                with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(self.workers) as pool_:
                    for res in pool_.map(one, range(0, self.m, self.block)):
                        for s, (lo, hi, masked) in res.items():
                            ov = ovs[s]
                            ov.lo, ov.hi, ov.masked = min(ov.lo, lo), max(ov.hi, hi), ov.masked or masked
                for s, ov in ovs.items():
                    finite = ov.values[np.isfinite(ov.values)]
                    ov.top = float(np.percentile(finite, CLIP, overwrite_input=True)) if finite.size else ov.hi
                    self.overviews[s] = ov
            except Exception as e:  # said on the page, never a half-drawn map
                self.failed = f"{type(e).__name__}: {e}"
            finally:
                for s in todo:
                    self.ready[s].set()

    def range(self, step: str) -> tuple[float, float]:
        """The colour scale of ``step``: its smallest value to the CLIP percentile of its overview (a few
        strong cells, such as the first query's weight 1 under a causal mask, would leave every other
        cell dark); brighter values take the brightest colour."""
        ov = self.overviews[step]
        if not math.isfinite(ov.lo):
            return 0.0, 1.0
        hi = ov.top if ov.top > ov.lo else ov.hi
        return ov.lo, hi if hi > ov.lo else ov.lo + 1.0

    # ---- explanations ----

    def row_trace(self, i: int) -> Trace:
        """A trace of the problem's shape whose query × key steps (and per-head output) hold query i's
        row, repeated over every row by a zero-stride view: what attncli.render.explain reads of cell
        (i, j) or row i is exactly the engine's numbers for query i. Every head and batch entry is computed
        at once, so the last ROW_TRACES are kept (read only): each entry's explanation of the same query
        (a page's first and last rows of every head) reads one computation."""
        with self._row_lock:
            t = self._row_traces.get(i)
            if t is not None:
                self._row_traces.move_to_end(i)
                return t
        t = self._row_trace(i)
        with self._row_lock:
            self._row_traces[i] = t
            while len(self._row_traces) > ROW_TRACES:
                self._row_traces.popitem(last=False)
        return t

    def _row_trace(self, i: int) -> Trace:
        base = self.p.trace
        part = self._part(np.array([i]))
        steps, inputs = self._base64()
        t = Trace(steps=list(steps), query_labels=base.query_labels, key_labels=base.key_labels,
                  warnings=[], meta=replace(base.meta), inputs=inputs, extra={**base.extra})
        for k in ("weights_step", "scaling", "sinks"):
            if getattr(part.meta, k) is not None:
                setattr(t.meta, k, getattr(part.meta, k))
        for s in part.steps:
            a = to_numpy(s.values)
            if s.axes[0] == QUERIES and a.ndim >= 2 and a.shape[-2] == 1:
                a = np.broadcast_to(a, a.shape[:-2] + (self.m,) + a.shape[-1:])
            t.steps.append(replace(s, values=a, notes=list(s.notes)))
        w = part.step(part.meta.weights_step or "weights").values
        out = to_numpy(weighted_sum(w, self.v()))  # (..., 1, n) x (..., n, d_v) -> (..., 1, d_v)
        name = "head_output" if self.p.projected else "output"
        t.steps.append(Step(name, np.broadcast_to(out, out.shape[:-2] + (self.m,) + out.shape[-1:]), (QUERIES, FEATURES),
                            params=WeightedSum(name, t.meta.weights_step or "weights")))
        if self.unbatch:  # as the engine's merge: an unbatched input's batch axis dropped (not the weights')
            t.steps = [s if s.name in PARAMETERS else replace(s, values=to_numpy(s.values)[0]) for s in t.steps]
        return t

    def _base64(self) -> tuple[list[Step], dict[str, Any]]:
        """The steps before the scores and the inputs as float64 numpy arrays, made once: the explanations
        read them as float64 (a row's output reads every value row), and then read them without a copy."""
        if self._steps64 is None:
            base = self.p.trace
            self._steps64 = [replace(s, values=np.asarray(to_numpy(s.values), dtype=np.float64), notes=list(s.notes))
                             for s in base.steps]
            self._inputs64 = {k: np.asarray(to_numpy(v), dtype=np.float64) for k, v in base.inputs.items()}
        return self._steps64, self._inputs64

    def explain(self, entry: tuple[int, ...], i: int, j: int | None, precision: int = 4) -> dict[str, Any]:
        from attncli.render.explain import Cell, explain_cell, explain_row, heading

        t = self.row_trace(i)
        c = Cell(t, entry, i, 0 if j is None else j, precision)
        if j is None:
            return {"heading": heading(c, f"row {c.query}"), "lines": explain_row(c)}
        return {"heading": heading(c, f"weight({c.query}, {c.key})"), "lines": explain_cell(c)}


class Exact:
    """Exact rows of one step, every head, in blocks; least recently used out beyond ``budget`` bytes."""

    def __init__(self, budget: int = CACHE_BYTES) -> None:
        self.budget, self.used = budget, 0
        self.blocks: OrderedDict[tuple[int, str, int], np.ndarray] = OrderedDict()
        self.lock = threading.Lock()

    def rows(self, layer: Layer, li: int, step: str, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 of ``step`` (..., r1 - r0, n), NaN where masked."""
        parts = []
        b = layer.block
        for start in range(r0 // b * b, r1, b):
            key = (li, step, start)
            with self.lock:
                a = self.blocks.get(key)
                if a is not None:
                    self.blocks.move_to_end(key)
            if a is None:
                a = layer.exact(np.arange(start, min(layer.m, start + b)), step)
                with self.lock:
                    self.blocks[key] = a
                    self.used += a.nbytes
                    while self.used > self.budget and len(self.blocks) > 1:
                        _, old = self.blocks.popitem(last=False)
                        self.used -= old.nbytes
            lo, hi = max(r0, start) - start, min(r1, start + b) - start
            parts.append(a[..., lo:hi, :])
        return np.concatenate(parts, axis=-2)


@dataclass
class Viewer:
    """What the server shows: one layer, or every layer of a model."""

    layers: list[Layer]
    token: str
    model: bool = False
    title: str = "attncli view"
    exact: Exact = field(default_factory=Exact)

    def start(self) -> None:
        """Compute the overviews in the background, the first layer first."""
        def work() -> None:
            for layer in self.layers:
                layer.sweep(layer.weights_step)

        threading.Thread(target=work, daemon=True, name="attncli-sweep").start()

    # ---- the data the page asks for ----

    def meta(self) -> dict[str, Any]:
        from attncli.render.plot import panel_title

        out = []
        for layer in self.layers:
            t = layer.p.trace
            entries = list(np.ndindex(*layer.lead)) if layer.lead else [()]
            axes = t.meta.batch_axes
            head_axis = t.meta.head_axis
            if not isinstance(head_axis, int) and len(layer.lead) >= 1 and t.meta.heads:
                head_axis = len(layer.lead) - 1
            out.append({
                "name": layer.name, "m": layer.m, "n": layer.n, "lead": list(layer.lead), "steps": layer.steps,
                "weights_step": layer.weights_step, "block": [layer.fr, layer.fc],
                "entries": [{"index": list(e), "title": panel_title(t, e, layer.lead) or "weights"} for e in entries],
                "axes": axes if isinstance(axes, list) else None,
                "head_axis": head_axis if isinstance(head_axis, int) else None,
                "query_labels": _labels(t.query_labels, layer.m, "q"), "key_labels": _labels(t.key_labels, layer.n, "k"),
                "score": t.meta.score,
                "patterns": layer.patterns() if self.model else [],  # per query head: the model view's badges
                "head_patterns": [{"head": int(h["head"]), "patterns": list(h["patterns"]), "sentence": str(h["sentence"])}
                                  for h in layer.named],  # the named heads' sentences, as self's diagnostics
            })
        return {"title": self.title, "model": self.model, "layers": out, "head_view_max": HEAD_VIEW_MAX,
                "exact_rows": EXACT_ROWS}

    def layer(self, q: dict[str, str], step: str | None = None) -> tuple[int, Layer, str]:
        """The layer a request names, with the overview of its step computed (waiting for it)."""
        li = _int(q, "layer", 0, len(self.layers) - 1)
        layer = self.layers[li]
        step = q.get("step", layer.weights_step) if step is None else step
        if step not in layer.ready:
            raise BadRequest("step")
        if not layer.ready[step].is_set():
            layer.sweep(step)
        if layer.failed:
            raise Failed(f"{layer.name}: {layer.failed}")
        return li, layer, step

    def entry(self, q: dict[str, str], layer: Layer) -> tuple[int, ...]:
        text = q.get("entry", "")
        try:
            idx = tuple(int(x) for x in text.split(",")) if text else ()
        except ValueError:
            raise BadRequest("entry") from None
        if len(idx) != len(layer.lead) or any(not 0 <= a < b for a, b in zip(idx, layer.lead)):
            raise BadRequest("entry")
        return idx

    def tile(self, q: dict[str, str]) -> bytes:
        """The region rows r0..r1 × keys c0..c1 of one step and entry at most w × h pixels."""
        li, layer, step = self.layer(q)
        e = self.entry(q, layer)
        r0, r1 = _int(q, "r0", 0, layer.m - 1), _int(q, "r1", 1, layer.m)
        c0, c1 = _int(q, "c0", 0, layer.n - 1), _int(q, "c1", 1, layer.n)
        w, h = _int(q, "w", 1, MAX_TILE), _int(q, "h", 1, MAX_TILE)
        if r1 <= r0 or c1 <= c0:
            raise BadRequest("r1")
        fr, fc = max(1, math.ceil((r1 - r0) / h)), max(1, math.ceil((c1 - c0) / w))
        ov = layer.overviews[step]
        lo, hi = layer.range(step)
        if (fr >= ov.fr and fc >= ov.fc) or r1 - r0 > EXACT_ROWS:  # the overview is fine enough
            a = ov.values[e][r0 // ov.fr:math.ceil(r1 / ov.fr), c0 // ov.fc:math.ceil(c1 / ov.fc)]
            return png_of(pool(a, max(1, fr // ov.fr), max(1, fc // ov.fc)), lo, hi)
        a = self.exact.rows(layer, li, step, r0, r1)[e][:, c0:c1]
        return png_of(pool(a, fr, fc), lo, hi)

    def scale(self, q: dict[str, str]) -> dict[str, Any]:
        """The colour scale of a step (after its overview is made)."""
        _, layer, step = self.layer(q)
        lo, hi = layer.range(step)
        return {"lo": lo, "hi": hi, "max": layer.overviews[step].hi, "clip": CLIP}

    def cells(self, q: dict[str, str]) -> dict[str, Any]:
        """Exact values of a small region (what the page writes in the cells when they are big enough)."""
        li, layer, step = self.layer(q)
        e = self.entry(q, layer)
        r0, r1 = _int(q, "r0", 0, layer.m - 1), _int(q, "r1", 1, layer.m)
        c0, c1 = _int(q, "c0", 0, layer.n - 1), _int(q, "c1", 1, layer.n)
        if not (r0 < r1 <= r0 + 64 and c0 < c1 <= c0 + 64):
            raise BadRequest("r1")
        arrays, hidden = layer._compute(np.arange(r0, r1))  # in the run's dtype, not the tiles' float32
        a = arrays[step][e][:, c0:c1]
        bad = ~np.isfinite(a) if hidden is None else hidden[e][:, c0:c1] | ~np.isfinite(a)
        return {"values": [[None if b else float(x) for x, b in zip(row, brow)] for row, brow in
                           zip(a.tolist(), bad.tolist())]}

    def explain(self, q: dict[str, str]) -> dict[str, Any]:
        _, layer, _ = self.layer(q)
        e = self.entry(q, layer)
        i = _int(q, "i", 0, layer.m - 1)
        j = None if q.get("j") in (None, "") else _int(q, "j", 0, layer.n - 1)
        return layer.explain(e, i, j)

    def heads(self, q: dict[str, str]) -> dict[str, Any]:
        """The head view's lines of one batch entry: per head, each query's strongest keys."""
        li, layer, step = self.layer(q, self.layers[_int(q, "layer", 0, len(self.layers) - 1)].weights_step)
        if layer.m > HEAD_VIEW_MAX or layer.n > HEAD_VIEW_MAX:
            raise BadRequest("layer")
        e = self.entry(q, layer)  # an entry of the head axis: its batch part picks the batch
        w = self.exact.rows(layer, li, step, 0, layer.m)  # (..., m, n)
        axis = self.meta()["layers"][li]["head_axis"]
        if axis is None:
            sel, names = w[e][None], ["weights"]
        else:
            idx: list[Any] = list(e)
            idx[axis] = slice(None)
            sel = w[tuple(idx)]  # (H, m, n)
            names = [f"head {h}" for h in range(sel.shape[0])]
        lines = []
        for h in range(sel.shape[0]):
            a = np.nan_to_num(sel[h], nan=0.0)
            top = np.argsort(-a, axis=1, kind="stable")[:, :HEAD_VIEW_TOP]
            for i in range(a.shape[0]):
                for j in top[i]:
                    if a[i, j] >= HEAD_VIEW_MIN:
                        lines.append([h, i, int(j), round(float(a[i, j]), 4)])
        return {"heads": names, "lines": lines}


class BadRequest(Exception):
    """A parameter of a request that does not fit (400)."""


class Failed(Exception):
    """A layer whose computation failed (500, said in one line)."""


def _int(q: dict[str, str], name: str, lo: int, hi: int) -> int:
    try:
        v = int(q.get(name, ""))
    except ValueError:
        raise BadRequest(name) from None
    if not lo <= v <= hi:
        raise BadRequest(name)
    return v


def _labels(labels: list[str] | None, count: int, prefix: str) -> list[str]:
    return list(labels) if labels and len(labels) == count else [f"{prefix}{i}" for i in range(count)]


# ---- the server ----

LOOPBACK = "127.0.0.1"


class Handler(BaseHTTPRequestHandler):
    """GET only; the token and a loopback Host on every request; the page and its data only."""

    server: Server
    server_version = "attncli"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the terminal shows the URL only
        pass

    def _send(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Content-Security-Policy", "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
                         "script-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _refuse(self, code: int, text: str) -> None:
        self._send(code, (text + "\n").encode())

    def _allowed(self) -> bool:
        port = self.server.server_address[1]
        host = self.headers.get("Host", "")
        if host not in (f"{LOOPBACK}:{port}", f"localhost:{port}"):
            self._refuse(403, "forbidden: this viewer answers requests to 127.0.0.1 only")
            return False
        q = parse_qs(urlsplit(self.path).query)
        token = q.get("token", [""])[0]
        if not hmac.compare_digest(token.encode(), self.server.viewer.token.encode()):
            self._refuse(403, "forbidden: open the URL the command printed (it holds the token)")
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        if not self._allowed():
            return
        parts = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(parts.query).items()}
        viewer = self.server.viewer
        routes = {"/api/meta": lambda: viewer.meta(), "/api/cells": lambda: viewer.cells(q),
                  "/api/explain": lambda: viewer.explain(q), "/api/heads": lambda: viewer.heads(q),
                  "/api/scale": lambda: viewer.scale(q)}
        try:
            if parts.path == "/":
                from attncli.render.viewer_page import page

                self._send(200, page().encode(), "text/html; charset=utf-8")
            elif parts.path == "/api/tile":
                self._send(200, viewer.tile(q), "image/png")
            elif parts.path in routes:
                self._send(200, json.dumps(routes[parts.path](), allow_nan=False).encode(), "application/json")
            else:
                self._refuse(404, "not found")
        except BadRequest as e:
            self._refuse(400, f"bad request: parameter {e}")
        except Failed as e:
            self._refuse(500, f"the computation failed: {e}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _read_only(self) -> None:
        if self._allowed():
            self._refuse(405, "read-only: GET only")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_TRACE = do_CONNECT = _read_only


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, viewer: Viewer, port: int = 0) -> None:
        self.viewer = viewer
        super().__init__((LOOPBACK, port), Handler)

    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/?token={self.viewer.token}"
