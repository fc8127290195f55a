"""Output-only attention for large inputs: blocks of queries, and PyTorch's fused kernel.

When nobody asked for the weights (``--steps output``, ``--save out.npy``,
``attend(..., keep_weights=False)``) the full ``(..., m, n)`` weight matrix is never held:

    for each block of queries  qb (..., b, d):
        s  = score(qb, K)                    (..., b, n)   the registered score function
        s  = scaled and masked as in the engine (masks sliced to the block's rows)
        e  = exp(s - max_j s)                stable; a fully masked row gives zeros
        [o | z] = e @ [V | 1]                (..., b, n) x (..., n, d_v + 1): outputs and row sums
        ob = o / z                           (..., b, d_v)

so memory stays O(b·n + inputs + outputs) on numpy and torch. When a Cauchy–Schwarz bound on
the inputs shows that every exp(s) is a normal number and nothing can overflow, the row max is
not subtracted at all (the same result to rounding, two passes over each block less). Any score that scores each
query on its own (every registered one that does not look across queries) works, since the
blocked path calls the registered function on a block of queries. When even a few queries
against every key are too many scores, keys come in chunks too, with an online softmax (the
running row max, sum and output are rescaled by exp(max_old - max_new) per chunk). On numpy
the blocks run on one thread per core, each with a single-threaded BLAS.

On the torch backend a dot-product score with a constant scale uses
``torch.nn.functional.scaled_dot_product_attention`` (fused kernels on CPU and GPU).

Half-precision inputs (float16, bfloat16) are computed in float32: the scores of a
float16 ``QKᵀ`` overflow past 65504, which is the well-known pitfall; a warning names
any score beyond the input type's range, and the output is cast back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from attncli.core import chain, ops
from attncli.core.backend import Backend, blas_threads, set_blas_threads, threads, to_numpy
from attncli.core.problem import Problem
from attncli.core.scoring import get_score
from attncli.core.trace import Trace

Progress = Callable[[int, int], None]  # (queries done, queries in all)

BLOCK_ELEMENTS = 1 << 21  # scores held at once (8 MiB in float32): fits the caches, and memory stays small
MIN_BLOCK, MAX_BLOCK = 16, 512  # query rows per block: small blocks starve the matrix multiply
MIN_KEYS = 16  # keys per chunk, when there are too many keys (times batch entries) for whole rows

HALF_MAX = {"float16": float(np.finfo(np.float16).max), "bfloat16": 3.3895313892515355e38}


def supported(problem: Problem) -> bool:
    """Whether the output-only paths compute exactly what the explicit path would: every stage the
    problem needs says the blocked path computes it (attncli.core.chain.STAGES: the score treats each
    query on its own, the scale is a constant or a whole-matrix rule, no hard attention or dropout)."""
    return chain.supports(problem, "blocked")


def output_only(problem: Problem, be: Backend, q: Any, k: Any, v: Any, params: dict[str, Any], trace: Trace,
                progress: Progress | None = None, sdpa: bool = False) -> Any:
    """The output ``(..., m, d_v)`` without holding the weights (``supported(problem)`` must hold):
    in blocks of queries, or by torch's fused kernel (``sdpa``, where ``sdpa_applies``).

    Adds the run's warnings (fully masked rows, scores beyond a half type's range) to ``trace``
    and records which path ran in ``trace.meta.path``.
    """
    trace.meta.path = "sdpa" if sdpa else "blocked"
    if problem.n_rep > 1:  # grouped-query heads: query head h reads K/V head h // r, as the explicit path (a copy of
        # K and V per query head: H·S·d numbers, small beside the scores of a block)
        k, v = ops.expand_kv(be.xp, k, problem.n_rep), ops.expand_kv(be.xp, v, problem.n_rep)  # (..., G, S, d) -> (..., H, S, d)
    if sdpa:
        return _sdpa(problem, be, q, k, v, trace, progress)
    return _blocked(problem, be, q, k, v, params, trace, progress)


# ---- the blocked path ------------------------------------------------------------------


def block_rows(problem: Problem) -> int:
    """Query rows per block: about BLOCK_ELEMENTS scores across all batch entries."""
    batch = math.prod(problem.batch_shape) or 1
    rows = BLOCK_ELEMENTS // max(1, problem.n * batch)
    return max(1, min(problem.m, MAX_BLOCK, max(rows, MIN_BLOCK)))


def key_chunk(problem: Problem, rows: int) -> int:
    """Keys per chunk: all of them, unless even ``rows`` queries against every key (and batch
    entry) exceed BLOCK_ELEMENTS; then chunks of keys with an online softmax."""
    batch = math.prod(problem.batch_shape) or 1
    if rows * problem.n * batch <= BLOCK_ELEMENTS:
        return problem.n
    return max(MIN_KEYS, BLOCK_ELEMENTS // (rows * batch))


def _blocked(problem: Problem, be: Backend, q: Any, k: Any, v: Any, params: dict[str, Any], trace: Trace,
             progress: Progress | None) -> Any:
    """Blocks of queries (and, for very many keys, chunks of keys with an online softmax:
    ops.OnlineSoftmax), each through the same stages as the explicit path."""
    xp = be.xp
    m, n, dv = problem.m, problem.n, int(v.shape[-1])
    c: Any = chain.constant_factor(problem) if chain.constant_scale(problem) else \
        _whole_matrix_factor(problem, be, q, k, params)  # a number, or one per batch entry (..., 1, 1)
    half_limit = HALF_MAX.get(problem.result_dtype or "")
    out = xp.empty(problem.batch_shape + (m, dv), dtype=q.dtype, device=be.device)  # (..., m, d_v)
    dead = np.zeros(problem.batch_shape + (m,), dtype=bool)
    overflow: list[tuple[tuple[int, ...], float, int]] = []
    step = block_rows(problem)
    kstep = key_chunk(problem, step)
    check, shift = _softmax_rules(problem, c)
    trace.meta.softmax = "running max" if shift else "shift-free"
    # V with a column of ones: e @ [V | 1] gives the output and the row sums in one product
    v1 = xp.concat([v, xp.ones(v.shape[:-1] + (1,), dtype=v.dtype, device=be.device)], axis=-1)  # (..., n, d_v + 1)
    # a half input's overflow warning counts every raw score, as the explicit path's: the keys a block skips (masked
    # by the causal rule or a window) are scored for it too, unless no raw score can reach the half type's limit
    hidden_overflow = half_limit is not None and not _raw_below(problem, xp, q, k, half_limit)

    @np.errstate(over="ignore", invalid="ignore")  # overflow is reported by check_scores, as one line
    def block(i0: int) -> int:
        i1 = min(m, i0 + step)
        qb = q[..., i0:i1, :]  # (..., b, d)
        rows = chain.block(problem, be, (i0, i1), c)  # this block's masks and biases, (..., b, n)
        acc = ops.OnlineSoftmax(xp, shift)
        kept = None  # any key kept (..., b)
        lo, hi = visible_keys(problem, i0, i1)
        if hidden_overflow and half_limit is not None:
            for j0, j1 in ((0, lo), (hi, n)):  # the skipped keys: their raw scores, for the warning only
                for a in range(j0, j1, kstep):
                    cols = slice(a, min(j1, a + kstep))
                    lg = chain.logits(problem, qb, k[..., cols, :], params, rows.cols(cols))
                    _check_overflow(lg.raw, to_numpy(c) if lg.folded else 1.0, half_limit, (i0, a), overflow)
        for j0 in range(lo, hi, kstep):
            j1 = min(hi, j0 + kstep)
            cols = slice(j0, j1) if (kstep < n or lo > 0 or hi < n) else slice(None)
            lg = chain.logits(problem, qb, k[..., cols, :], params, rows.cols(cols))  # 1) - 5): (..., b, n_c)
            if half_limit is not None:
                _check_overflow(lg.raw, to_numpy(c) if lg.folded else 1.0, half_limit, (i0, j0), overflow)
            if lg.keep is not None:
                kept = xp.any(lg.keep, axis=-1) if kept is None else kept | xp.any(lg.keep, axis=-1)
            if check:  # the scores may overflow (or a fill value may not be below them): the explicit path's error
                ops.check_scores(problem, xp, lg.unmasked, lg.s, lg.keep, offset=(i0, j0))
            # 6) softmax, folded into the product with V, normalised at the end
            acc.add(lg.s, v1[..., cols, :], reuse=lg.s is lg.raw and lg.folded)
        top = acc.top()  # the keys' row max, before the sinks: a row whose every key is masked is dead, whatever its sink
        if problem.sinks is not None:  # 6) with sinks: exp(sink_h) joins each row's sum
            acc.add_sinks(ops.sink_column(problem, xp, problem.batch_shape + (i1 - i0, 1), q.dtype, be.device))
        out[..., i0:i1, :] = acc.finish()
        if rows.keep is not None or rows.bias is not None:  # without a running max (boolean masks only): no key kept
            dead[..., i0:i1] |= to_numpy(ops.row_dead(xp, top, kept))
        return i1

    starts = range(0, m, step)
    workers = min(len(starts), threads()) if be.name == "numpy" else 1
    for i1 in _run_blocks(block, starts, workers):
        if progress is not None:
            progress(i1, m)
    _report(problem, trace, dead, overflow)
    return out


def _raw_below(problem: Problem, xp: Any, q: Any, k: Any, limit: float) -> bool:
    """Whether no raw dot-product score q_i·k_j (of the q and k the scores see: rotated, normed) can exceed ``limit``:
    max‖q_i‖·max‖k_j‖ < limit (Cauchy–Schwarz). False for the other scores."""
    if get_score(problem.options.score).name not in chain.DOT_SCORES:
        return False

    def top(a: Any) -> float:
        return math.sqrt(float(to_numpy(xp.max(xp.sum(a * a, axis=-1))))) if a.shape[-2] else 0.0
    return top(q) * top(k) < limit


def _softmax_rules(problem: Problem, c: Any) -> tuple[bool, bool]:
    """(check, shift): whether a block's scores may overflow (then checked as the explicit path checks them), and
    whether the online softmax needs its running max. Without it, exp(s) itself cannot overflow, underflow to zero or
    make the products with V overflow (two passes over each block less). A fill value (d2l's -1e6), a float mask or
    a stage beyond the bound (a bias, sinks) could leave a row with only tiny scores, which the max would rescale:
    those keep it."""
    o = problem.options
    bound = score_bound(problem, c) if get_score(o.score).name in chain.DOT_SCORES else math.inf
    check = not bound < float(np.finfo(problem.dtype).max) / 4
    finite_fill = o.mask_value is not None and math.isfinite(o.mask_value)
    shift = not (o.mask_value is None and (problem.mask is None or problem.mask.dtype == bool)
                 and (problem.padding is None or problem.padding.dtype == bool) and chain.bounded(problem)
                 and shift_free(problem, bound))
    return check or finite_fill, shift


def visible_keys(problem: Problem, i0: int, i1: int) -> tuple[int, int]:
    """The keys [lo, hi) that the queries i0..i1-1 can see under the causal rule, the window or the local window
    (query i at position P + i sees keys j <= P + i, and j > P + i - W; |j - (P + i)| <= R): the others are
    masked, their weights exactly 0, so a block need not score them. Every key where a fill value (--mask-value)
    gives masked keys a weight."""
    o, n = problem.options, problem.n
    causal = o.causal or o.window is not None or o.chunk is not None
    if o.mask_value is not None or not (causal or o.local_window is not None):
        return 0, n
    P = problem.query_offset
    hi = min(n, max(0, P + i1)) if causal else n
    lo = 0 if o.window is None else min(max(0, P + i0 - o.window + 1), n)
    if o.chunk is not None:  # chunked: the first query's chunk starts at (P + i0) // C · C
        lo = max(lo, min((P + i0) // o.chunk * o.chunk, n))
    if o.local_window is not None:  # both sides: the last query sees up to P + i1 - 1 + R, the first from P + i0 - R
        R = o.local_window
        hi = min(hi, max(0, P + i1 + R))
        lo = max(lo, min(max(0, P + i0 - R), n))
    return (lo, hi) if hi > lo else (0, n)  # no key visible: every row of the block is fully masked


def cannot_overflow(problem: Problem, c: Any) -> bool:
    """Whether no dot-product score can overflow the computing dtype (see score_bound)."""
    return score_bound(problem, c) < float(np.finfo(problem.dtype).max) / 4


def score_bound(problem: Problem, c: Any) -> float:
    """A bound on |score| of a dot-product score scaled by ``c``, float mask included:
    |c · q_i·k_j| <= |c|·max‖q_i‖·max‖k_j‖ (Cauchy–Schwarz). Computed on the inputs, O(inputs);
    inf where it overflows."""
    def norm(a: np.ndarray) -> float:  # in at least float32: an overflow here only means "no bound"
        with np.errstate(over="ignore"):
            sq = np.einsum("...i,...i->...", a, a, dtype=np.result_type(a.dtype, np.float32))
        return math.sqrt(float(np.max(sq)))

    nq = norm(problem.q)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = float(np.max(np.abs(to_numpy(c)))) * nq * (nq if problem.k is problem.q else norm(problem.k))
        mk = problem.mask
        if mk is not None and mk.dtype != bool:  # a float mask is added to the scores
            bound += float(np.max(np.abs(mk), initial=0.0, where=~np.isneginf(mk)))
    return bound if math.isfinite(bound) else math.inf


def shift_free(problem: Problem, bound: float) -> bool:
    """Whether the softmax may take exp(s) without subtracting each row's max: with |s| <= bound,
    every exp(s) is a normal number of the computing dtype (no overflow, no underflow to zero or
    to a subnormal, so no precision is lost) and sum_j exp(s_ij)·|v_j| <= n·e^bound·max|v| cannot
    overflow either. Typical inputs qualify (unit-scale entries, d = 64: bound about 15)."""
    info = np.finfo(problem.dtype)
    if not bound <= 0.9 * -math.log(float(info.tiny)):
        return False
    vmax = max(float(np.max(problem.v, initial=0.0)), -float(np.min(problem.v, initial=0.0)))
    return math.isfinite(vmax) and bound + math.log(problem.n) + math.log(vmax + 1.0) < math.log(float(info.max)) - 4


_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _run_blocks(block: Callable[[int], int], starts: range, workers: int) -> Iterator[int]:
    """``block(i0)`` for each start, in order: on ``workers`` threads (kept between runs: starting
    threads costs ~1 ms a run) with the BLAS single-threaded meanwhile, since numpy releases the
    GIL in matmul, exp and sums and two levels of threads on the same cores only wait on each
    other. One thread where there is one worker or the BLAS thread count cannot be set at run time."""
    global _pool, _pool_size
    before = blas_threads()
    if workers < 2 or before is None or not set_blas_threads(1):
        yield from map(block, starts)
        return
    try:
        if _pool is None or _pool_size != workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(workers, thread_name_prefix="attncli-block"), workers
        futures = [_pool.submit(block, i0) for i0 in starts]
        try:
            for f in futures:
                yield f.result()
        finally:  # on an error or Ctrl-C, the blocks not yet started are dropped, the running ones end
            for f in futures:
                f.cancel()
            wait(futures)
    finally:
        set_blas_threads(before)


def _check_overflow(s: Any, c: Any, limit: float, at0: tuple[int, int],
                    found: list[tuple[tuple[int, ...], float, int]]) -> None:
    """Note the largest raw score of the block beyond ``limit`` (``s`` may already be scaled by c);
    ``at0``: the (query, key) index of the block's first score."""
    raw = to_numpy(s) / to_numpy(c)  # c: a number, or one per batch entry (..., 1, 1)
    a = np.abs(raw)
    count = int((a > limit).sum())
    if count:
        idx = np.unravel_index(int(np.argmax(a)), a.shape)
        at = (*idx[:-2], idx[-2] + at0[0], idx[-1] + at0[1])
        found.append((tuple(int(x) for x in at), float(raw[idx]), count))


def _report(problem: Problem, trace: Trace, dead: np.ndarray, overflow: list[tuple[tuple[int, ...], float, int]]) -> None:
    if dead.any():
        trace.dead = dead
        trace.warnings.extend(ops.dead_row_messages(problem, dead))
    if overflow:
        trace.warnings.append(overflow_message(problem, overflow))


def overflow_message(problem: Problem, found: list[tuple[tuple[int, ...], float, int]]) -> str:
    """The warning for raw scores beyond the half input type's range (computed in float32 instead)."""
    half = problem.result_dtype or ""
    at, value, _ = min(found, key=lambda f: (-abs(f[1]), f[0]))  # the largest; of equals, the first (as argmax)
    count = sum(f[2] for f in found)
    *b, i, j = at
    ql, kl = problem.query_labels, problem.key_labels
    where = f"query {ql[i]!r} · key {kl[j]!r}" if ql and kl else f"query {i} · key {j}"
    if b:
        where += f" (batch {', '.join(map(str, b))})"
    more = f" ({count} scores in all)" if count > 1 else ""
    return (f"score {where} = {value:.6g} overflows {half} (largest {HALF_MAX[half]:.6g}){more}: "
            f"the scores were computed in float32, so the result is finite")


def score_overflow(problem: Problem, scores: Any) -> str | None:
    """The overflow warning for a whole raw score matrix (the explicit path), or None."""
    limit = HALF_MAX.get(problem.result_dtype or "")
    if limit is None:
        return None
    found: list[tuple[tuple[int, ...], float, int]] = []
    _check_overflow(scores, 1.0, limit, (0, 0), found)
    return overflow_message(problem, found) if found else None


constant_scale = chain.constant_scale


def _whole_matrix_factor(problem: Problem, be: Backend, q: Any, k: Any, params: dict[str, Any]) -> Any:
    """The factor of a scaling that looks at the whole score matrix, over the temperature."""
    o = problem.options
    f = chain.WHOLE_MATRIX_SCALINGS[chain.scaling_name(problem)](problem, be, q, k, params)
    return f / o.temperature if o.temperature is not None else f


def _frobenius(problem: Problem, be: Backend, q: Any, k: Any, params: dict[str, Any]) -> Any:
    """1 / ‖S‖_F of each raw score matrix (finite entries), as the 'norm' scaling: a first pass
    over blocks of queries sums the squares. (..., 1, 1)"""
    xp = be.xp
    total: Any = 0.0
    step = block_rows(problem)
    for i0 in range(0, problem.m, step):
        with np.errstate(over="ignore", invalid="ignore"):
            s = ops.score(problem, xp, q[..., i0:i0 + step, :], k, params)  # (..., b, n)
            finite = xp.where(xp.isfinite(s), s, xp.zeros_like(s))
            total = total + xp.sum(finite * finite, axis=(-2, -1), keepdims=True)  # (..., 1, 1)
    f = xp.sqrt(total)
    return 1.0 / xp.where(f > 0, f, xp.ones_like(f))


# Scalings whose factor depends on the whole score matrix: computed by a first pass over blocks.
chain.WHOLE_MATRIX_SCALINGS["norm"] = _frobenius


# ---- PyTorch's fused kernel ------------------------------------------------------------


def sdpa_applies(problem: Problem) -> bool:
    """Whether torch's fused kernel computes the same thing: every stage the problem needs says SDPA has
    a place for it (attncli.core.chain.STAGES: a dot-product score with a constant scale, masks at -inf;
    not soft-capping, a bias or sinks; RoPE and QK-norm are applied before, windows are masks, grouped
    heads go head group by group), and no score can overflow (else the blocked path says where)."""
    return chain.supports(problem, "sdpa") and cannot_overflow(problem, chain.constant_factor(problem))


def _sdpa(problem: Problem, be: Backend, q: Any, k: Any, v: Any, trace: Trace, progress: Progress | None) -> Any:
    """torch.nn.functional.scaled_dot_product_attention: one call without masks (is_causal for
    top-left causal), else one call per block of queries with that block's keep mask."""
    import torch

    o = problem.options
    sdpa = torch.nn.functional.scaled_dot_product_attention
    c = chain.constant_factor(problem)
    m, n = problem.m, problem.n
    half_limit = HALF_MAX.get(problem.result_dtype or "")
    if half_limit is not None:  # the raw scores are only looked at to warn; blockwise, never all at once
        overflow: list[tuple[tuple[int, ...], float, int]] = []
        step = block_rows(problem)
        for i0 in range(0, m, step):
            s = q[..., i0:i0 + step, :] @ k.transpose(-2, -1)  # (..., b, d) x (..., d, n) -> (..., b, n)
            _check_overflow(s, 1.0, half_limit, (i0, 0), overflow)
        if overflow:
            trace.warnings.append(overflow_message(problem, overflow))
    batch = problem.batch_shape
    q, k, v = (_as_4d(torch, t, batch + tuple(t.shape[-2:])) for t in (q, k, v))  # (B, 1, rows, width): 4-D for the fused kernels
    top_left = (o.window is None and o.chunk is None and o.local_window is None
                and (not o.causal or problem.query_offset == 0))  # is_causal: j <= i, or no positional mask
    if problem.query_limit is None and problem.mask is None and problem.padding is None and top_left:
        out = sdpa(q, k, v, is_causal=o.causal, scale=c)  # (B, 1, m, d) (B, 1, n, d) (B, 1, n, d_v) -> (B, 1, m, d_v)
        if progress is not None:
            progress(m, m)
        return out.reshape(batch + tuple(out.shape[-2:]))
    out = torch.empty(batch + (m, int(v.shape[-1])), dtype=q.dtype, device=be.device)
    dead = np.zeros(problem.batch_shape + (m,), dtype=bool)
    step = block_rows(problem)
    for i0 in range(0, m, step):
        i1 = min(m, i0 + step)
        keep, bias = ops.masks(problem, be, rows=(i0, i1))
        if bias is not None:  # a float mask: masked keys at -inf, the others shifted by the mask
            attn = ops.apply_mask(be.xp, bias, keep, None, -math.inf)  # masked keys at -inf, the others shifted
            rows_dead = ops.row_dead(be.xp, be.xp.max(attn, axis=-1, keepdims=True), None)
        else:
            attn, rows_dead = keep, ops.row_dead(be.xp, None, be.xp.any(keep, axis=-1))
        attn = _as_4d(torch, attn, batch + (i1 - i0, n))  # (B, 1, b, n)
        ob = sdpa(q[..., i0:i1, :], k, v, attn_mask=attn, scale=c)  # (B, 1, b, d) (B, 1, n, d) (B, 1, n, d_v) -> (B, 1, b, d_v)
        ob = ob.reshape(batch + tuple(ob.shape[-2:]))
        rd = torch.broadcast_to(rows_dead, batch + (i1 - i0,))
        if bool(rd.any()):  # SDPA gives NaN there; the tool's rule is zero weights and a zero output
            ob = torch.where(rd[..., None], torch.zeros((), dtype=ob.dtype, device=be.device), ob)
            dead[..., i0:i1] |= rd.cpu().numpy()
        out[..., i0:i1, :] = ob
        if progress is not None:
            progress(i1, m)
    _report(problem, trace, dead, [])
    return out


def _as_4d(torch: Any, t: Any, shape: tuple[int, ...]) -> Any:
    """``t`` broadcast to ``shape`` (batch..., rows, cols) and seen as (B, 1, rows, cols): the fused
    SDPA kernels (flash attention on the CPU too) take 4-D inputs; others fall back to the math
    kernel, which holds every score."""
    return torch.broadcast_to(t, shape).reshape(-1, 1, *shape[-2:])
