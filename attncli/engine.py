"""The math: one implementation over the array API, as a sequence of named steps.

    scores  = score(Q, K)                       (..., m, n)
    scaled  = scores · factor / temperature
    masked  = scaled with masked keys at -inf (or --mask-value), plus any float mask
    weights = softmax(masked)                   rows sum to 1 (0 where fully masked)
    output  = weights @ V                       (..., m, n) x (..., n, d_v) -> (..., m, d_v)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from attncli.backend import Backend, get_backend, to_numpy
from attncli.errors import InputError
from attncli.problem import Options, Problem
from attncli.scoring import SCALINGS, ScoreInput, get_score
from attncli.trace import FEATURES, QUERIES, Trace
from attncli.weights import DEFAULT_SEED


def attend(q: Any, k: Any = None, v: Any = None, *, valid_lens: Any = None, mask: Any = None,
           query_labels: list[str] | None = None, key_labels: list[str] | None = None,
           params: dict[str, Any] | None = None, **options: Any) -> Trace:
    """Attention of queries ``q`` over keys ``k`` and values ``v``, returned as a :class:`Trace`.

    ``k`` and ``v`` default to ``q`` (self-attention). Keyword options are the fields of
    :class:`attncli.problem.Options` (``score``, ``scale``, ``temperature``, ``causal``,
    ``mask_convention``, ``mask_value``, ``dtype``, ``backend``, ``device``, ...).
    ``keep_weights=False`` returns the output alone, computed in blocks of queries (or by torch's
    fused SDPA) without ever holding the ``(..., m, n)`` weights: for long sequences.

    >>> import numpy as np
    >>> attend(np.eye(2), score="dot").weights.sum(axis=-1).tolist()
    [1.0, 1.0]
    """
    problem = Problem.build(q, k, v, valid_lens=valid_lens, mask=mask, query_labels=query_labels,
                            key_labels=key_labels, params=dict(params or {}),
                            options=Options().merged(options, "attend()"))
    return run(problem)


def run(problem: Problem, backend: Backend | None = None, progress: Callable[[int, int], None] | None = None) -> Trace:
    """Compute every step of ``problem`` on its backend and return the Trace (``progress(done, total)``
    hears about blocks of queries on the output-only path)."""
    o = problem.options
    be = backend or get_backend(o.backend, o.device)
    dt = problem.dtype
    q, k, v = (be.asarray(a, dt) for a in (problem.q, problem.k, problem.v))
    trace = Trace(query_labels=problem.query_labels, key_labels=problem.key_labels)
    score = get_score(o.score)
    trace.meta.update(score=score.name, score_formula=score.formula, backend=be.name, device=be.device_name(), dtype=dt,
                      shapes={"q": list(problem.q.shape), "k": list(problem.k.shape), "v": list(problem.v.shape)})
    trace.inputs.update(q=q, k=k, v=v)
    trace.meta["self_attention"] = problem.self_attention
    params = {name: be.asarray(w, dt) for name, w in problem.params.items()}
    record_params(problem, params, trace)
    if not o.keep_weights or problem.result_dtype:
        from attncli import fast  # output only: blocks of queries, or SDPA; half inputs: cast back
        out = None if o.keep_weights else fast.output_only(problem, be, q, k, v, params, trace, progress)
        if out is not None:
            trace.add("output", "output = weights · V", out, (QUERIES, FEATURES))
            return trace
    weights = attention_weights(problem, be, q, k, params, trace)
    used = trace.steps[-1].name  # weights, or hard / dropout when asked for
    out = weights @ v  # (..., m, n) x (..., n, d_v) -> (..., m, d_v)
    if problem.result_dtype:
        out = fast.cast_result(be, out, problem)
        trace.warnings.extend(w for w in [fast.score_overflow(problem, trace.step("scores").values)] if w)
    trace.add("output", f"output = {used} · V", out, (QUERIES, FEATURES))
    return trace


def corner_rows(problem: Problem, trace: Trace, rows: list[int], limit: int) -> bool:
    """Add the steps up to the weights, computed for the queries ``rows`` only, before the output of an
    output-only ``trace``: what the view of a big problem shows (its first and last rows), each row
    against every key, so the numbers shown are exact, without the whole weight matrix. False
    (nothing added) where that is not the same computation (a scaling over the whole score matrix,
    hard attention, dropout) or more than ``limit`` scores would be held. Steps with a table per
    query (additive's features) are left out."""
    from attncli import fast

    if not (fast.supported(problem) and fast.constant_scale(problem)):
        return False
    if len(rows) * problem.n * math.prod(problem.batch_shape) > limit:
        return False
    o = problem.options
    be = get_backend(o.backend, o.device)
    index = np.asarray(rows)
    q = be.asarray(problem.q[..., index, :], problem.dtype)  # (..., rows, d)
    params = {name: trace.inputs[name] for name in problem.params}
    part = Trace(query_labels=problem.query_labels, key_labels=problem.key_labels)
    attention_weights(problem, be, q, trace.inputs["k"], params, part, rows=index)  # its warnings: the output's run has them
    output = trace.steps.pop()
    for step in part.steps:
        if step.numpy().ndim > q.ndim:  # one table per query (additive's features): left out of the summary
            continue
        if step.axes[0] == QUERIES:
            step.rows = list(rows)
        trace.steps.append(step)
    trace.steps.append(output)
    return True


@np.errstate(over="ignore", invalid="ignore")  # overflow is reported by check_scores, as one line
def attention_weights(problem: Problem, be: Backend, q: Any, k: Any, params: dict[str, Any],
                      trace: Trace, rows: np.ndarray | None = None) -> Any:
    """Scores, scaling, masking and softmax for ``q`` against ``k``: adds the steps, returns the weights.
    ``rows``: ``q`` holds only these queries of the problem (their masks are taken for them)."""
    o, xp = problem.options, be.xp
    score = get_score(o.score)

    # 1) score
    s = score.fn(ScoreInput(xp, q, k, params, trace, o))
    trace.add("scores", f"scores = {score.symbol}", s)

    # 2) scale
    factor, text = scale_factor(problem, xp, s)
    trace.meta["scaling"] = {"rule": text, "factor": factor if isinstance(factor, (int, float)) else None,
                             "temperature": o.temperature}  # for explanations
    if factor is not None:
        s = s * factor
    if o.temperature is not None:
        s = s / o.temperature
        text = f"({text}) / T = ({text}) / {o.temperature:g}" if factor is not None else f"S / T = S / {o.temperature:g}"
    if factor is not None or o.temperature is not None:
        trace.add("scaled", f"scaled = {text}", s)

    # 3) mask
    raw = s
    keep, bias = masks(problem, be, s.shape, rows=rows)
    if bias is not None and bool(np.all((problem.mask == 0) | (problem.mask == 1))):
        trace.warnings.append(f"the mask from {problem.where('mask')} holds only 0s and 1s as floats: it is added to the "
                              "scores, not used to keep or drop keys (save it as booleans or integers for that)")
    if keep is not None or bias is not None:
        fill = -math.inf if o.mask_value is None else o.mask_value
        if bias is not None:
            s = s + bias
        if keep is not None:
            s = xp.where(keep, s, xp.asarray(fill, dtype=s.dtype, device=be.device))
        plus = " (+ float mask)" if bias is not None else ""
        trace.add("masked", f"masked = scores with masked keys set to {fill:g}{plus}", s)

    # 4) softmax over keys (stable); a row with every key at -inf gets zero weights
    check_scores(problem, xp, raw, s, keep)
    w = softmax(xp, s)
    dead = _fully_masked_rows(xp, s, keep)
    if dead is not None and rows is None:  # for some rows only: the run of the output names them
        trace.warnings.extend(_dead_row_messages(problem, dead, o.mask_value))
    trace.add("weights", "weights = softmax(masked, over keys)" if "masked" in trace else
              f"weights = softmax({'scaled' if 'scaled' in trace else 'scores'}, over keys)", w)

    # 5) softmax variants, each its own step: the last one is what the output uses
    if o.hard:
        w = trace.add("hard", "hard = one-hot at each row's largest weight (ties: the first key)", hard(xp, w))
    if o.dropout > 0:
        w = trace.add("dropout", f"dropout = {trace.steps[-1].name} · keep / (1 - P), P(keep = 0) = P = {o.dropout:g}, "
                                 f"keep from default_rng({o.seed if o.seed is not None else DEFAULT_SEED})",
                      dropout(be, w, o.dropout, o.seed))
    return w


def hard(xp: Any, w: Any) -> Any:
    """Hard attention: 1 at each row's argmax (the first one on ties), 0 elsewhere; zero rows stay zero."""
    n = int(w.shape[-1])
    top = xp.argmax(w, axis=-1, keepdims=True)  # (..., m, 1), the first maximum
    one = xp.astype(xp.arange(n, device=_device(xp, w)) == top, w.dtype)  # (n,) vs (..., m, 1) -> (..., m, n)
    alive = xp.any(w > 0, axis=-1, keepdims=True)  # (..., m, 1): fully masked rows stay zero
    return xp.where(alive, one, xp.zeros_like(one))


def dropout(be: Backend, w: Any, p: float, seed: int | None) -> Any:
    """Inverted dropout as ``nn.Dropout(p)`` in training: keep with probability 1-p, scale kept by 1/(1-p).

    keep = numpy.random.default_rng(seed).random(w.shape) >= p, drawn on the host, so numpy
    and torch drop the same weights.
    """
    from attncli.weights import seeded_rng

    keep = be.asbool(seeded_rng(seed).random(tuple(int(x) for x in w.shape)) >= p)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return be.xp.where(keep, w * scale, be.xp.zeros_like(w))


def _device(xp: Any, a: Any) -> Any:
    from array_api_compat import device

    return device(a)


def record_params(problem: Problem, params: dict[str, Any], trace: Trace) -> None:
    """The score weights used: in ``trace.inputs`` (NPZ) and ``trace.extra["params"]`` (JSON)."""
    if not params:
        return
    trace.inputs.update(params)
    trace.extra["params"] = {name: to_numpy(w).tolist() for name, w in params.items()}
    if problem.initialised:
        o = problem.options
        init = trace.meta["params_initialised"] = {
            "names": list(problem.initialised), "seed": DEFAULT_SEED if o.seed is None else o.seed,
            "rule": "nn.Linear style: uniform on ±1/sqrt(fan_in), from numpy.random.default_rng(seed)"}
        if "hidden" in get_score(o.score).options:  # h: --hidden, else the query width
            init["hidden"] = int(problem.q.shape[-1]) if o.hidden is None else o.hidden


def scale_factor(problem: Problem, xp: Any, s: Any) -> tuple[Any, str]:
    """The factor the scores are multiplied by (None for none) and its description."""
    o = problem.options
    d, n = int(problem.q.shape[-1]), problem.n
    if o.scale is not None:
        return o.scale, f"S · {o.scale:g}"
    rule = SCALINGS[o.scaling or get_score(o.score).scaling]
    if rule.name == "none":
        return None, "S"
    return rule.factor(xp, s, d, n), rule.describe(d, n)


def masks(problem: Problem, be: Backend, shape: tuple[int, ...],
          rows: tuple[int, int] | np.ndarray | None = None) -> tuple[Any, Any]:
    """(keep, bias): a boolean keep-mask broadcastable to ``shape`` and an additive float mask;
    ``rows``: only for some queries, i0..i1-1 for ``(i0, i1)`` (the blocked path in attncli.fast)
    or those of an index array (the corners of a big view)."""
    o = problem.options
    m, n = (int(shape[-2]) if rows is None else problem.m), int(shape[-1])
    index = np.arange(*rows) if isinstance(rows, tuple) else np.arange(m) if rows is None else rows  # query indices
    keep = None
    j = np.arange(n)  # key index
    if problem.query_limit is not None:
        keep = _row_block(problem.query_limit[..., None], rows) > j  # (..., m, 1) vs (n,) -> (..., m, n)
    if o.causal:
        i = index[:, None]
        offset = n - m if o.causal_align == "bottom-right" else 0
        causal = j <= i + offset  # (m, n)
        keep = causal if keep is None else keep & causal
    bias = None
    if problem.mask is not None:
        mk = problem.mask
        mk = _row_block(mk, rows)
        if mk.dtype == bool:
            mk = mk if o.mask_convention == "keep" else ~mk
            keep = mk if keep is None else keep & mk
        else:
            bias = be.asarray(mk, str(problem.dtype))
    return (None if keep is None else be.asbool(keep)), bias


def _row_block(a: np.ndarray, rows: tuple[int, int] | np.ndarray | None) -> np.ndarray:
    """Some rows (i0..i1-1, or an index array) of an array broadcast over (..., m, n); one that has
    a single row (or none) as it is."""
    if rows is None or a.ndim < 2 or a.shape[-2] == 1:
        return a
    return a[..., rows[0]:rows[1], :] if isinstance(rows, tuple) else a[..., rows, :]


def check_scores(problem: Problem, xp: Any, raw: Any, s: Any, keep: Any, offset: tuple[int, int] = (0, 0)) -> None:
    """Raise a one-line InputError when a score that takes part is not finite: the inputs
    overflowed the dtype (e.g. float32 entries of 1e30, whose products reach 1e60), and no
    softmax of such a row means anything. ``raw``: the (scaled) scores, which must be finite
    where ``keep`` is True; ``s``: after masking, where only -inf (a masked key) may appear;
    ``offset``: the (query, key) index of their first score (a block of the blocked path)."""
    bad = xp.isnan(s) | (xp.isinf(s) & (s > 0))
    raw_bad = ~xp.isfinite(raw)
    bad = bad | (raw_bad if keep is None else raw_bad & keep)
    if not bool(xp.any(bad)):
        return
    bad_np = to_numpy(bad)
    idx = tuple(int(i) for i in np.argwhere(bad_np)[0])
    raw_np, s_np, raw_bad_np = (np.broadcast_to(to_numpy(a), bad_np.shape) for a in (raw, s, raw_bad))
    *b, i, j = idx
    where = f"query {i + offset[0]}, key {j + offset[1]}" + (f" (batch {', '.join(map(str, b))})" if b else "")
    dtype = problem.dtype
    hint = "use --dtype float64 or rescale the inputs" if dtype != "float64" else "rescale the inputs"
    raise InputError(f"scores overflow {dtype} at {where}: the score is "
                     f"{float(raw_np[idx]) if bool(raw_bad_np[idx]) else float(s_np[idx])} "
                     f"(largest |input| {max(float(np.abs(a).max()) for a in (problem.q, problem.k)):.3g}); {hint}",
                     problem.where("q"))


def softmax(xp: Any, s: Any) -> Any:
    """Stable softmax over the last axis: exp(s - max) / sum. Rows of -inf give zeros."""
    mx = xp.max(s, axis=-1, keepdims=True)
    mx = xp.where(xp.isfinite(mx), mx, xp.zeros_like(mx))
    e = xp.exp(s - mx)
    z = xp.sum(e, axis=-1, keepdims=True)
    return e / xp.where(z > 0, z, xp.ones_like(z))


def _fully_masked_rows(xp: Any, s: Any, keep: Any) -> np.ndarray | None:
    dead = xp.all(xp.isinf(s) & (s < 0), axis=-1)
    if keep is not None:
        dead = dead | ~xp.any(keep, axis=-1)
    dead_np = to_numpy(dead)
    return dead_np if dead_np.any() else None


def _dead_row_messages(problem: Problem, dead: np.ndarray, mask_value: float | None) -> list[str]:
    dead = np.broadcast_to(dead, problem.batch_shape + (problem.m,))
    labels = problem.query_labels
    out = []
    for idx in np.argwhere(dead)[:10]:
        *b, i = (int(x) for x in idx)
        row = f"query {labels[i]!r}" if labels else f"query {i}"
        where = f"{row} (batch {', '.join(map(str, b))})" if b else row
        if mask_value is None or math.isinf(mask_value):
            out.append(f"{where} has every key masked: its weights and output are zero")
        else:
            out.append(f"{where} has every key masked: with mask value {mask_value:g} its weights are uniform (as d2l)")
    extra = int(dead.sum()) - len(out)
    if extra > 0:
        out.append(f"... and {extra} more fully masked rows")
    return out
