"""Diagnostics of a computed attention: how spread out each row's weights are, which key
wins, whether the softmax saturated, and how similar the output rows are to each other.

Math only (numpy on the host copies of the trace's arrays); the terminal renderer shows
the result and ``--format json`` carries it under ``diagnostics``.

    entropy H_i        = -Σ_j w_ij ln w_ij           (nats; 0 for a one-hot row)
    effective keys     = exp(H_i)                    (n for uniform weights over n keys, 1 for one-hot)
    visible keys       : the keys row i sees (not masked); effective keys are out of these
    saturated row      : max_j w_ij > 0.99 in a row that sees more than one key
    score spread       : max_j s_ij - min_j s_ij of the raw scores, compared with √d for unscaled dot
                         products (their standard deviation grows like √d: the notes' reason to scale)
    similarity         : output rows compared by dot product or cosine (and the inputs, for self-attention)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attncli.core.trace import Trace
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none


SATURATION = 0.99  # a row whose largest weight exceeds this is (nearly) one-hot
SPREAD_FACTOR = 2.0  # unscaled dot scores spreading over more than this many √d are flagged
MAX_LISTED = 10  # rows named one by one in warnings
MAX_JSON_ROWS = 1000  # rows listed one by one in saturated_rows / fully_masked_rows (the counts are exact)

Similarity = Callable[["np.ndarray", "np.ndarray"], "np.ndarray"]  # strings: numpy loads on first use
SIMILARITIES: dict[str, Similarity] = {}


def similarity(name: str) -> Callable[[Similarity], Similarity]:
    def deco(fn: Similarity) -> Similarity:
        SIMILARITIES[name] = fn
        return fn

    return deco


@similarity("dot")
def dot_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot product of rows: sim_ij = a_i · b_j. (..., m, d) x (..., n, d) -> (..., m, n)"""
    return a @ np.swapaxes(b, -1, -2)  # (..., m, d) x (..., d, n) -> (..., m, n)


@similarity("cosine")
def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of rows: sim_ij = a_i · b_j / (‖a_i‖ ‖b_j‖) (0 for a zero row). (..., m, d) x (..., n, d) -> (..., m, n)"""
    na = np.linalg.norm(a, axis=-1, keepdims=True)  # (..., m, 1)
    nb = np.linalg.norm(b, axis=-1, keepdims=True)  # (..., n, 1)
    a = a / np.where(na > 0, na, 1.0)
    b = b / np.where(nb > 0, nb, 1.0)
    return a @ np.swapaxes(b, -1, -2)  # (..., m, d) x (..., d, n) -> (..., m, n)


BLOCK = 1 << 20  # weights handled this many at a time, so big matrices need no full-size float64 copies


def row_entropy(w: np.ndarray) -> np.ndarray:
    """H = -Σ_j w_j ln w_j over the last axis (0·ln 0 = 0), summed in float64. (..., m, n) -> (..., m)"""
    return row_stats(w)[0]


def row_stats(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(entropy, max, argmax, sum) of each row of ``w`` (..., m, n), computed a block of rows at a time."""
    w = np.asarray(w)
    n = int(w.shape[-1])
    flat = w.reshape(-1, n)  # (rows, n): a view for contiguous weights
    rows = flat.shape[0]
    ent, top, arg, tot = (np.empty(rows), np.empty(rows), np.empty(rows, dtype=np.int64), np.empty(rows))
    step = max(1, BLOCK // max(n, 1))
    dtype = flat.dtype if flat.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    tiny = np.finfo(dtype).tiny  # w ln max(w, tiny) is w ln w for w > 0, and 0 for w = 0
    for a in range(0, rows, step):
        b = np.asarray(flat[a:a + step], dtype=dtype)  # (block, n); float32's log is vectorised, float64's is not
        ent[a:a + step] = -np.sum(b * np.log(np.maximum(b, tiny)), axis=-1, dtype=np.float64)
        top[a:a + step] = np.max(b, axis=-1)
        arg[a:a + step] = np.argmax(b, axis=-1)
        tot[a:a + step] = np.sum(b, axis=-1, dtype=np.float64)
    shape = w.shape[:-1]
    return ent.reshape(shape), top.reshape(shape), arg.reshape(shape), tot.reshape(shape)


def row_ties(w: np.ndarray, top: np.ndarray) -> np.ndarray:
    """How many keys of each row share its largest weight ``top`` (..., m) exactly: 1 for a clear top key,
    n for a uniform row. (..., m, n) -> (..., m)"""
    w = np.asarray(w)
    n = int(w.shape[-1])
    flat, best = w.reshape(-1, n), np.asarray(top).reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.int64)
    step = max(1, BLOCK // max(n, 1))
    for a in range(0, flat.shape[0], step):
        out[a:a + step] = np.sum(flat[a:a + step] == best[a:a + step, None], axis=-1)
    return out.reshape(w.shape[:-1])


def fully_masked(trace: Trace) -> np.ndarray:
    """Rows (..., m) of the weights where every key is masked, as the engine found them
    (``Trace.dead``: every score -inf or no key kept; never a row a float mask made uniform)."""
    shape = trace.weights.shape[:-1]
    dead = trace.dead
    if dead is None:
        return np.zeros(shape, dtype=bool)
    rows = trace.step("weights").rows  # the corner rows of a big view: theirs only
    return np.broadcast_to(dead if rows is None else np.asarray(dead)[..., rows], shape)


def label(labels: list[str] | None, i: int, prefix: str) -> str:
    return labels[i] if labels and i < len(labels) else f"{prefix}{i}"


def query_labels(trace: Trace) -> list[str] | None:
    """Labels of the weights' rows: the trace's, or, when the weights were computed for some
    queries only (the corners of a big view), those queries' labels ('q4095' without labels)."""
    rows = trace.step("weights").rows if "weights" in trace else None
    if rows is None:
        return trace.query_labels
    return [label(trace.query_labels, i, "q") for i in rows]


def where(labels: list[str] | None, idx: tuple[int, ...], prefix: str = "q") -> str:
    """'it' or 'q2', with its batch index when there are leading axes: 'it (batch 0)'."""
    *b, i = idx
    name = label(labels, i, prefix)
    return f"{name} (batch {', '.join(map(str, b))})" if b else name


def plain(a: np.ndarray) -> Any:
    """Nested lists of Python numbers for JSON; non-finite floats become None."""
    arr = np.asarray(a)
    if arr.dtype.kind in "biu":
        return arr.tolist()
    flat = [x if math.isfinite(x) else None for x in arr.astype(np.float64).ravel().tolist()]
    if arr.ndim == 0:
        return flat[0]
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def diagnose(trace: Trace, similarity: str | None = None) -> dict[str, Any]:
    """The diagnostics of ``trace`` as plain data (lists, numbers, strings), ready for JSON.

    Per row (shape batch... + (m,)): ``entropy``, ``effective_keys``, ``max_weight``,
    ``argmax`` (key index) and ``argmax_key`` (its label; the first when several tie),
    ``top_ties`` (how many keys share the largest weight); then ``saturated_rows``,
    ``fully_masked_rows``, ``score_spread`` (unscaled dot products), ``similarity`` (when asked)
    and ``warnings`` (sentences).
    """
    if "weights" not in trace:
        return {}
    w = trace.weights  # (..., m, n)
    n = int(w.shape[-1])
    h, top, arg, total = row_stats(w)
    dead = fully_masked(trace)
    h = np.where(dead, np.nan, h)
    qlab, klab = query_labels(trace), trace.key_labels
    hidden = masked_cells(trace)
    visible = (np.full(w.shape[:-1], n) if hidden is None else n - np.sum(hidden, axis=-1)).astype(np.int64)
    visible = np.where(dead, 0, visible)
    out: dict[str, Any] = {
        "entropy": plain(h),
        "effective_keys": plain(np.exp(h)),
        "max_weight": plain(top),
        "argmax": plain(np.where(dead, -1, arg)),
        "top_ties": plain(np.where(dead, 0, row_ties(w, top))),  # keys sharing the top weight (all n: a uniform row)
        "keys": n,
        "visible_keys": plain(visible),  # keys each row sees (not masked): its entropy's ceiling is ln of it
    }
    if klab:
        names = np.asarray([*klab, ""], dtype=object)  # index -1: a fully masked row
        out["argmax_key"] = names[np.where(dead, -1, arg)].tolist()
    warnings: list[str] = []

    sat = np.argwhere((top > SATURATION) & ~dead & (visible > 1))  # a row that sees one key has no choice
    out["saturated_count"] = len(sat)
    out["saturated_rows"] = [
        {"index": [int(x) for x in idx], "query": where(qlab, tuple(int(x) for x in idx)),
         "key": label(klab, int(arg[tuple(idx)]), "k"), "max_weight": float(top[tuple(idx)])} for idx in sat[:MAX_JSON_ROWS]]
    for r in out["saturated_rows"][:MAX_LISTED]:
        warnings.append(f"row {r['query']} is saturated: {r['max_weight']:.4f} of its weight is on key "
                        f"{r['key']} (> {SATURATION}); the softmax is nearly one-hot there")
    if len(sat) > MAX_LISTED:
        warnings.append(f"... and {len(sat) - MAX_LISTED} more saturated rows")

    gone = np.argwhere(dead)
    out["fully_masked_count"] = len(gone)
    out["fully_masked_rows"] = [where(qlab, tuple(int(x) for x in idx)) for idx in gone[:MAX_JSON_ROWS]]

    spread = score_spread(trace)
    if spread is not None:
        out["score_spread"] = spread
        if spread["warning"]:
            warnings.append(spread["warning"])

    if similarity is not None:
        out["similarity"] = output_similarity(trace, similarity)
    if "head_patterns" in trace.extra:  # the heads a layer computed from a model names (attncli.core.headstats)
        out["head_patterns"] = trace.extra["head_patterns"]
    out["warnings"] = warnings
    return out


def score_spread(trace: Trace) -> dict[str, Any] | None:
    """For unscaled dot products: the largest per-row score range against √d (None otherwise)."""
    if trace.meta.score != "dot" or "scaled" in trace or "scores" not in trace:
        return None
    s = np.asarray(trace["scores"], dtype=np.float64)
    d = int((trace.meta.shapes or {}).get("q", [0, s.shape[-1]])[-1])
    if "q" in trace.inputs:
        d = int(np.shape(trace.inputs["q"])[-1])
    finite = np.isfinite(s)
    hi = np.max(np.where(finite, s, -np.inf), axis=-1)
    lo = np.min(np.where(finite, s, np.inf), axis=-1)
    rng = np.where(np.isfinite(hi) & np.isfinite(lo), hi - lo, 0.0)  # (..., m)
    worst = tuple(int(x) for x in np.unravel_index(int(np.argmax(rng)), rng.shape))
    biggest = float(rng[worst])
    root = math.sqrt(d)
    info: dict[str, Any] = {"max_row_spread": biggest, "row": where(query_labels(trace), worst), "d": d,
                            "sqrt_d": root, "spread_over_sqrt_d": biggest / root, "warning": None}
    if biggest > SPREAD_FACTOR * root:
        info["warning"] = (f"unscaled dot products: row {info['row']} spreads its scores over {biggest:.4g} "
                           f"(more than {SPREAD_FACTOR:g}·√d = {SPREAD_FACTOR * root:.4g}, d = {d}); dot products "
                           f"grow like √d, which pushes the softmax towards one-hot. --score scaled-dot divides "
                           f"by √d = {root:.4g} (spread {biggest / root:.4g})")
    return info


def output_similarity(trace: Trace, kind: str) -> dict[str, Any]:
    """Output rows compared with each other (and, for self-attention, the input rows before attention)."""
    fn = SIMILARITIES[kind]
    o = np.asarray(trace.step("output").numpy(), dtype=np.float64)  # (..., m, d_v), queries as rows
    after = fn(o, o)  # (..., m, m)
    res: dict[str, Any] = {"kind": kind, "after": plain(after), "nearest": plain(nearest(after))}
    if trace.meta.self_attention and "q" in trace.inputs:
        x = np.asarray(trace.inputs_numpy()["q"], dtype=np.float64)
        before = fn(x, x)
        res["before"] = plain(before)
        res["nearest_before"] = plain(nearest(before))
    return res


def nearest(sim: np.ndarray) -> np.ndarray:
    """For each row the most similar other row (ties: the first); -1 when there is only one row."""
    m = sim.shape[-1]
    if m < 2:
        return np.full(sim.shape[:-1], -1)
    s = np.where(np.eye(m, dtype=bool), -np.inf, sim)
    return np.argmax(s, axis=-1)


def attach(trace: Trace, similarity: str | None = None) -> dict[str, Any]:
    """Compute the diagnostics and store them in ``trace.extra['diagnostics']`` (what JSON shows)."""
    diag = diagnose(trace, similarity)
    if diag:
        trace.extra["diagnostics"] = diag
    return diag


def masked_cells(trace: Trace) -> np.ndarray | None:
    """Where a key is masked for a query (..., m, n) in the weights' shape: the cells the ``masked`` step
    changed (to -inf or to a fill such as d2l's -1e6); None when the run has no mask step."""
    if "masked" not in trace or "weights" not in trace:
        return None
    shape = trace.step("weights").values.shape
    after = np.asarray(trace["masked"])
    before = np.asarray(trace["scaled"] if "scaled" in trace else trace["scores"])
    changed = (after != before) & ~(np.isnan(after) & np.isnan(before))
    try:
        return np.broadcast_to(changed, shape)
    except ValueError:  # weights of some rows only (the corners of a big view)
        return None
