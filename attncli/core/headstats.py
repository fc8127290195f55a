"""What every head does, measured: per layer × query head, sums over every valid query of every input.

For query i of an input (at position P + i) with a_ij the weights that multiply V (after sinks):

    entropy       -Σ_j a_ij log a_ij                               (nats)
    entropy_norm  entropy / log(keys i may attend)                  (queries that may attend >= 2 keys)
    first         a_i,f     f = the first valid position            (0 where a window or chunk hides it)
    self          a_i,P+i
    previous      a_i,prev(i)                                       (queries with a previous position)
    next          a_i,next(i)                                       (queries that may attend their next position)
    max           max_j a_ij
    distance      Σ_j a_ij |r(P + i) - r(j)|                        (r: the position among valid tokens)
    sink_share    1 - Σ_j a_ij                                      (the sink logit's share; models with sinks)
    special       Σ_{j special} a_ij                                (a capture's special_tokens_mask)
    punctuation   Σ_{j punctuation} a_ij                            (labels that are only Unicode punctuation)
    duplicate     a_i,p     p = the most recent earlier position of i's token (queries whose token occurred)
    induction     a_i,p+1   the token after it (Olsson et al. 2022)

Each is kept as a sum and a count (and, across inputs, the sum and sum of squares of each input's mean), so
shards of a corpus merge exactly. The weights come block by block of query rows (the chain before the softmax,
:func:`block_scores`, then the one softmax of attncli.core.stages): no T × T map is ever held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attncli.core.engine import Prepared
    from attncli.core.problem import Problem
else:
    from attncli.lazy import numpy as np

from attncli.errors import InputError

DEFINITIONS_VERSION = "attncli-heads/1"

# name -> (formula, the count it is averaged over)
DEFINITIONS: dict[str, tuple[str, str]] = {
    "entropy": ("mean over queries of -Σ_j a_ij·ln a_ij (nats)", "n_queries"),
    "entropy_norm": ("mean over queries with >= 2 keys of entropy_i / ln(keys query i may attend)", "n_entropy_norm"),
    "first": ("mean of a_i,f, f the first valid position (0 where a window or chunk hides it)", "n_queries"),
    "self": ("mean of a_i,P+i (the query's own position)", "n_queries"),
    "previous": ("mean of a_i,i-1 over queries with a previous position", "n_previous"),
    "next": ("mean of a_i,i+1 over queries that may attend their next position", "n_next"),
    "max": ("mean of max_j a_ij", "n_queries"),
    "distance": ("mean of Σ_j a_ij·|i - j| (positions among valid tokens)", "n_queries"),
    "sink_share": ("mean of 1 - Σ_j a_ij, the sink logit's share (models with sinks)", "n_queries"),
    "special": ("mean of Σ_j a_ij over special tokens (special_tokens_mask)", "n_queries"),
    "punctuation": ("mean of Σ_j a_ij over tokens whose label, without its leading space, is only Unicode "
                    "punctuation (P*)", "n_queries"),
    "induction": ("mean of a_i,p+1, p the most recent earlier position of query i's token (Olsson et al. 2022)",
                  "n_occurrences"),
    "duplicate": ("mean of a_i,p, p the most recent earlier position of query i's token", "n_occurrences"),
}
STATS: tuple[str, ...] = tuple(DEFINITIONS)
POSITIONAL = ("self", "previous", "next", "distance", "induction", "duplicate")  # need shared query/key positions
S = len(STATS)
_I = {n: i for i, n in enumerate(STATS)}

# pattern -> (statistic, threshold, origin)
PATTERNS: dict[str, tuple[str, float, str]] = {
    "sink": ("first", 0.3, "Gu et al., ICLR 2025: mean weight on the first token >= ε = 0.3"),
    "previous-token": ("previous", 0.5, "weight on the previous position"),
    "self": ("self", 0.5, "weight on the query's own position"),
    "induction": ("induction", 0.4, "weight on the token after the previous occurrence (Olsson et al. 2022)"),
    "broad": ("entropy_norm", 0.9, "entropy near that of uniform weights (Clark et al. 2019)"),
    "focused": ("max", 0.9, "most of the weight on one key (Clark et al. 2019)"),
}


def thresholds(overrides: dict[str, float] | None = None) -> dict[str, float]:
    """Each pattern's threshold: the stated defaults, with ``overrides`` (pattern -> value in [0, 1])."""
    out = {p: t for p, (_, t, _) in PATTERNS.items()}
    for name, value in (overrides or {}).items():
        if name not in out:
            raise InputError(f"no pattern {name!r}; the patterns are {', '.join(PATTERNS)}", "--threshold")
        if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1):
            raise InputError(f"the threshold of {name} must be a number from 0 to 1, got {value!r}", "--threshold")
        out[name] = float(value)
    return out


def beside(value: float, threshold: float) -> str:
    """``value`` with two decimals, or with as many more as it takes to read on the same side of ``threshold`` as it
    is: a sink share of 0.3004 is "0.3004" beside 0.3 (not "0.30", which reads as equal); exactly 0.3 is "0.30"."""
    side = (value > threshold) - (value < threshold)
    for k in range(2, 18):
        shown = f"{value:.{k}f}"
        if (float(shown) > threshold) - (float(shown) < threshold) == side:
            return shown
    return repr(value)


def patterns(means: dict[str, float | None], limits: dict[str, float]) -> list[str]:
    """The patterns a head passes (its mean statistic at or above the threshold); [] when none: unnamed."""
    return [p for p, (stat, _, _) in PATTERNS.items() if (v := means.get(stat)) is not None and v >= limits[p]]


# ---- one input's positions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sequence:
    """What one input says about its positions: which are valid (not padding), which queries are scored, and,
    where known, the token ids, special tokens and punctuation. (T,) each."""

    valid: np.ndarray
    token_ids: np.ndarray | None = None
    special: np.ndarray | None = None
    punctuation: np.ndarray | None = None
    scored: np.ndarray | None = None  # the queries measured (default: every valid one; the probe: its second half)

    @staticmethod
    def plain(t: int) -> Sequence:
        return Sequence(np.ones(t, dtype=bool))


@dataclass(frozen=True)
class Positions:
    """Key indices per query (-1: none) and ranks among valid tokens, for a batch: (B, T) each; first (B,)."""

    rank: np.ndarray
    first: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    occ: np.ndarray  # the most recent earlier position of the query's token
    after: np.ndarray  # the valid position after occ
    scored: np.ndarray  # (B, T) bool
    special: np.ndarray | None  # (B, T) float
    punct: np.ndarray | None


def positions(seqs: list[Sequence], t: int) -> Positions:
    """The positions of a batch of inputs of length ``t`` (each input's arrays of length t)."""
    B = len(seqs)
    valid = np.zeros((B, t), dtype=bool)
    for b, s in enumerate(seqs):
        if np.shape(s.valid) != (t,):
            raise InputError(f"input {b} has {np.shape(s.valid)} valid flags for {t} positions", "inputs")
        valid[b] = s.valid
    idx = np.broadcast_to(np.arange(t), (B, t))
    rank = np.cumsum(valid, axis=1) - 1
    first = np.where(valid.any(axis=1), np.argmax(valid, axis=1), -1)
    last_valid = np.maximum.accumulate(np.where(valid, idx, -1), axis=1)  # the last valid index <= i
    prev = np.concatenate([np.full((B, 1), -1), last_valid[:, :-1]], axis=1)
    rev = np.where(valid, idx, t)[:, ::-1]
    next_valid = np.minimum.accumulate(rev, axis=1)[:, ::-1]  # the first valid index >= i
    nxt = np.concatenate([next_valid[:, 1:], np.full((B, 1), t)], axis=1)
    nxt = np.where(nxt >= t, -1, nxt)
    occ = np.full((B, t), -1)
    scored = valid.copy()
    special = punct = None
    for b, s in enumerate(seqs):
        if s.scored is not None:
            scored[b] &= np.asarray(s.scored, dtype=bool)
        if s.token_ids is not None:
            seen: dict[int, int] = {}
            for i in np.flatnonzero(valid[b]):
                tok = int(s.token_ids[i])
                occ[b, i] = seen.get(tok, -1)
                seen[tok] = int(i)
    after = np.where(occ >= 0, np.take_along_axis(nxt, np.maximum(occ, 0), axis=1), -1)
    if any(s.special is not None for s in seqs):
        special = np.zeros((B, t))
        for b, s in enumerate(seqs):
            if s.special is not None:
                special[b] = np.asarray(s.special, dtype=bool)
    if any(s.punctuation is not None for s in seqs):
        punct = np.zeros((B, t))
        for b, s in enumerate(seqs):
            if s.punctuation is not None:
                punct[b] = np.asarray(s.punctuation, dtype=bool)
    has_ids = np.array([s.token_ids is not None for s in seqs])
    occ[~has_ids] = -1
    return Positions(rank, first, prev, nxt, occ, after, scored, special, punct)


def is_punctuation(label: str) -> bool:
    """A label that, without its leading space, is only Unicode punctuation (categories P*)."""
    import unicodedata

    text = label.lstrip(" Ġ▁")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


# ---- the sums -------------------------------------------------------------------------------------------------


@dataclass
class Sums:
    """Per layer × head × statistic (L, H, S): the sum over queries, their count, and over inputs the sum and sum
    of squares of each input's mean and the number of inputs that had such queries. Merging adds them."""

    total: np.ndarray
    count: np.ndarray
    input_sum: np.ndarray
    input_sq: np.ndarray
    inputs: np.ndarray

    @staticmethod
    def zeros(layers: int, heads: int) -> Sums:
        f = np.zeros((layers, heads, S))
        return Sums(f, np.zeros_like(f, dtype=np.int64), f.copy(), f.copy(), np.zeros_like(f, dtype=np.int64))

    def add_layer(self, layer: int, sums: np.ndarray, counts: np.ndarray) -> None:
        """Add one layer's per-input sums and counts (B, H, S)."""
        self.total[layer] += sums.sum(axis=0)
        self.count[layer] += counts.sum(axis=0)
        has = counts > 0
        mean = np.where(has, sums / np.maximum(counts, 1), 0.0)
        self.input_sum[layer] += mean.sum(axis=0)
        self.input_sq[layer] += (mean * mean).sum(axis=0)
        self.inputs[layer] += has.sum(axis=0)

    def merged(self, other: Sums) -> Sums:
        if self.total.shape != other.total.shape:
            raise InputError(f"statistics of shape {other.total.shape} cannot merge with {self.total.shape}", "merge")
        return Sums(self.total + other.total, self.count + other.count, self.input_sum + other.input_sum,
                    self.input_sq + other.input_sq, self.inputs + other.inputs)

    def mean(self) -> np.ndarray:
        """(L, H, S), NaN where no query counted."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.total / np.maximum(self.count, 1), np.nan)

    def spread(self) -> np.ndarray:
        """The standard deviation across inputs of each input's mean (population, ddof 0); NaN with no input."""
        n = np.maximum(self.inputs, 1)
        mu = self.input_sum / n
        var = np.maximum(self.input_sq / n - mu * mu, 0.0)
        return np.where(self.inputs > 0, np.sqrt(var), np.nan)


# ---- one layer -------------------------------------------------------------------------------------------------


def block_scores(p: Problem, be: Any, q: Any, k: Any, params: dict[str, Any], i0: int, i1: int,
                 c: Any) -> tuple[Any, int]:
    """THE HOOK into the chain: the scores the softmax takes for the queries i0..i1-1 of ``p`` (mask, bias, cap
    applied; masked keys at -inf), against the keys that any of them can see, [lo, hi): ((..., b, hi - lo), lo).
    The one place this module calls the chain (attncli.core.chain) and the blocked path's key range."""
    from attncli.core import blocked, chain

    rows = chain.block(p, be, (i0, i1), c)
    lo, hi = blocked.visible_keys(p, i0, i1)
    cols = slice(lo, hi)
    lg = chain.logits(p, q, k[..., cols, :], params, rows.cols(cols) if (lo, hi) != (0, p.n) else rows)
    return lg.s, lo


def layer_sums(prep: Prepared, seqs: list[Sequence], *, exclude_first: bool = False, exclude_self: bool = False,
               progress: Callable[[int, int], None] | None = None,
               keys: list[Sequence] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per input × query head × statistic (B, H, S): the sums over the scored queries of one layer and their counts,
    from the prepared layer ``prep`` (attncli.core.engine.prepare: q, k after norms and rotary), block by block.

    Cross-attention (``keys``: the memory's positions, special tokens and punctuation; or queries and keys of
    different lengths): queries and keys share no positions, so self, previous, next, distance, induction and
    duplicate stay uncounted (null); ``seqs`` then describe the queries."""
    from attncli.core import blocked, chain, ops
    from attncli.core.backend import threads, to_numpy

    p = prep.core
    if p.options.mask_value is not None:
        raise InputError("heads measures weights with masked keys at exactly 0; drop --mask-value", "--mask-value")
    if not chain.supports(p, "blocked") or not chain.constant_scale(p):
        raise InputError("this attention (its score, scale, hard attention or dropout) has no blocked pass; heads "
                         "measures the blocked pass only", "options")
    B, H = (int(x) for x in p.batch_shape[:2]) if len(p.batch_shape) == 2 else (1, p.head_count)
    if len(seqs) != B:
        raise InputError(f"{len(seqs)} inputs described for a batch of {B}", "inputs")
    m, n = p.m, p.n
    cross = keys is not None or m != n
    if cross and exclude_self:
        raise InputError("cross-attention has no query's own key to drop", "--exclude-self")
    pos = _layer_positions(seqs, keys, m, n, B, cross)
    sums = np.zeros((B, H, S))
    counts = np.zeros((B, H, S), dtype=np.int64)
    be = prep.backend  # the scores on the backend's device (numpy, or torch on the CPU or a GPU); their sums on the host
    q = prep.q
    # grouped-query heads: query head h reads K/V head h // r, K expanded as the blocked path does (ops.expand_kv)
    k = ops.expand_kv(be.xp, prep.k, p.n_rep)
    P = p.query_offset
    c = chain.constant_factor(p)
    step = blocked.block_rows(p)
    found: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def one(i0: int) -> int:
        i1 = min(m, i0 + step)
        s, lo = block_scores(p, be, q[..., i0:i1, :], k, prep.score_weights, i0, i1, c)
        found[i0] = _block_sums(p, to_numpy(s), lo, i0, i1, P, pos, exclude_first, exclude_self, cross)
        return i1

    starts = range(0, m, step)
    for i1 in blocked._run_blocks(one, starts, min(len(starts), threads())):  # the blocked pass's own threads
        i0 = (i1 - 1) // step * step
        bs, bc = found.pop(i0)
        sums += bs
        counts += bc
        if progress is not None:
            progress(i1, m)
    return sums, counts


def _layer_positions(seqs: list[Sequence], keys: list[Sequence] | None, m: int, n: int, B: int,
                     cross: bool) -> Positions:
    """The keys' positions, with the queries scored (cross-attention: the queries' own, from ``seqs``)."""
    if not cross:
        return positions(seqs, n)
    pos = positions(keys if keys is not None else [Sequence.plain(n)] * B, n)
    qs0 = positions(seqs, m).scored
    return Positions(pos.rank, pos.first, pos.prev, pos.next, pos.occ, pos.after, qs0, pos.special, pos.punct)


def _gather(a: np.ndarray, idx: np.ndarray, lo: int) -> tuple[np.ndarray, np.ndarray]:
    """a[..., b, idx[b, i] - lo] (B, G, b) and whether idx names a key of the block (B, 1, b)."""
    nc = a.shape[-1]
    rel = idx - lo  # (B, b)
    ok = (idx >= 0) & (rel >= 0) & (rel < nc)
    g = np.take_along_axis(a, np.clip(rel, 0, nc - 1)[:, None, :, None], axis=-1)[..., 0]  # (B, G, b)
    return np.where(ok[:, None], g, 0.0), ok[:, None]


def _block_sums(p: Problem, s: np.ndarray, lo: int, i0: int, i1: int, P: int, pos: Positions, exclude_first: bool,
                exclude_self: bool, cross: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The sums and counts (B, G, S) of the query rows i0..i1-1 from their scores ``s`` (B, G, b, nc) of the keys
    lo..lo + nc - 1 (masked at -inf), by the one softmax's parts (ops.softmax_parts: m_i = max_j s_ij,
    e_ij = exp(s_ij - m_i)) and Z_i = Σ_j e_ij (over the keys' share, with a sink: ops.softmax over
    [logsumexp_j s_ij, sink_h]), a_ij = e_ij / Z_i, so

        entropy_i = (Σ_j e_ij · ln Z_i - Σ_j e_ij (s_ij - m_i)) / Z_i      max_i = 1 / Z_i
        Σ_j a_ij·[1, r_j, special_j, punct_j] = (e @ F) / Z                 (one product with a (nc, 4) matrix)
        distance_i = r_i (A_le - A_gt) - (R_le - R_gt)   (sums of a and a·r over keys at or before i, and after)

    and the weights on named positions are gathered. Only row sums are formed, in a few passes over the block."""
    from attncli.core import ops

    B = pos.rank.shape[0]
    b, nc = i1 - i0, s.shape[-1]
    s = np.array(np.broadcast_to(s, (B,) + s.shape[1:]))  # ours to overwrite (the chain's may be a broadcast view)
    rows = np.arange(b)
    qi = rows + i0 + P  # query positions (indices into the keys)
    if exclude_first:  # drop those keys, renormalise (TransformerLens's exclude_bos, exclude_current_token)
        for bb in range(B):
            f = int(pos.first[bb]) - lo
            if 0 <= f < nc:
                s[bb, ..., f] = -np.inf
    if exclude_self:
        c = qi - lo
        ok = (c >= 0) & (c < nc)
        s[:, :, rows[ok], c[ok]] = -np.inf
    if cross:  # no shared positions: the positional statistics are never counted
        P = 0
    nxt = np.full((B, b), -1) if cross else pos.next[:, i0 + P:i1 + P]
    vis_next = np.isfinite(np.take_along_axis(s, np.clip(nxt - lo, 0, nc - 1)[:, None, :, None], axis=-1)[..., 0])
    G = s.shape[1]
    dt = s.dtype
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        keys = np.count_nonzero(s > -np.inf, axis=-1)  # (B, G, b): keys each query may attend
        mx, e, _ = ops.softmax_parts(np, s)  # the one softmax's parts: m_i (0 for a row of -inf), e = exp(s - m), Σ e
        t = np.subtract(s, mx, out=s)  # s - m, in place (s is ours), for Σ_j e_ij (s_ij - m_i)
        np.maximum(t, -1e4, out=t)  # masked keys: e = 0 there, and 0 · -1e4 = 0 (exp(-1e4) is 0 in every float)
        et = np.einsum("bgij,bgij->bgi", e, t)  # Σ_j e_ij (s_ij - m_i)
        # ranks taken relative to the block's first query
        c0 = np.zeros(B, dtype=np.int64) if cross else pos.rank[:, min(i0 + P, pos.rank.shape[1] - 1)]
        rk = (pos.rank[:, lo:lo + nc] - c0[:, None]).astype(dt)  # (B, nc)
        cols = [np.ones((B, nc), dt), rk]
        for x in (pos.special, pos.punct):
            cols.append(np.zeros((B, nc), dt) if x is None else x[:, lo:lo + nc].astype(dt))
        F = np.stack(cols, axis=-1)  # (B, nc, 4)
        M = (e @ F[:, None]).astype(np.float64)  # (B, G, b, nc) x (B, 1, nc, 4) -> (B, G, b, 4)
        z = M[..., 0]
        Z = z
        sink = None
        if p.sinks is not None:  # the sink's share: the one softmax over [logsumexp_j s_ij, sink_h] (= over [s | sink])
            sk = np.broadcast_to(np.asarray(p.sinks, dtype=np.float64).reshape(1, G, 1), z.shape)
            with_sink = np.stack([mx[..., 0] + np.log(z), sk], axis=-1)  # (B, G, b, 2)
            share = ops.softmax(np, with_sink)  # (B, G, b, 2): the keys' share, the sink's share
            Z = np.where(share[..., 0] > 0, z / share[..., 0], 0.0)  # Σ_j e_ij over the keys' share
            sink = share[..., 1] * Z  # so that sink / Z is the sink's share
        Zs = np.where(Z > 0, Z, 1.0)
        # distance: keys before the block's first query are at or before every query, keys from its last on are after
        cut = min(max(i0 + P - lo, 0), nc)
        cut2 = min(max(i1 + P - lo, 0), nc)
        before = (e[..., :cut] @ F[:, None, :cut, :2]).astype(np.float64) if cut else np.zeros(M.shape[:-1] + (2,))
        band = e[..., cut:cut2].astype(np.float64)  # (B, G, b, w)
        jb = np.arange(lo + cut, lo + cut2)
        tri = (jb[None, :] <= qi[:, None]).astype(np.float64)  # (b, w)
        le_a = before[..., 0] + np.einsum("bgiw,iw->bgi", band, tri)
        le_r = before[..., 1] + np.einsum("bgiw,iw,bw->bgi", band, tri, rk[:, cut:cut2].astype(np.float64))
        rq = np.zeros((B, 1, b)) if cross else (pos.rank[:, i0 + P:i1 + P] - c0[:, None]).astype(np.float64)[:, None]
        dist = (rq * (2 * le_a - z) - (2 * le_r - M[..., 1])) / Zs
        ent = (z * np.log(Zs) - et) / Zs
    vals = np.zeros((B, G, b, S))
    inc = np.zeros((B, G, b, S), dtype=bool)
    base = pos.scored[:, i0 + P:i1 + P][:, None] & (keys > 0)  # (B, G, b); cross: P = 0, the queries' own

    def put(name: str, v: Any, ok: Any = True) -> None:
        vals[..., _I[name]] = v
        inc[..., _I[name]] = base & ok

    def at(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        g, ok = _gather(e, idx, lo)
        return g / Zs, ok

    put("entropy", ent)
    put("entropy_norm", ent / np.log(np.maximum(keys, 2)), keys >= 2)
    put("first", at(np.broadcast_to(pos.first[:, None], (B, b)))[0])
    none = np.full((B, b), -1)
    put("self", at(np.broadcast_to(qi, (B, b)))[0], not cross)
    prev = none if cross else pos.prev[:, i0 + P:i1 + P]
    put("previous", at(prev)[0], (prev >= 0)[:, None])
    va, ok = at(nxt)
    put("next", va, ok & vis_next)
    put("max", 1.0 / Zs)
    put("distance", dist, not cross)
    if sink is not None:
        put("sink_share", sink / Zs)
    if pos.special is not None:
        put("special", M[..., 2] / Zs)
    if pos.punct is not None:
        put("punctuation", M[..., 3] / Zs)
    occ, after = (none, none) if cross else (pos.occ[:, i0 + P:i1 + P], pos.after[:, i0 + P:i1 + P])
    put("duplicate", at(occ)[0], (occ >= 0)[:, None])
    put("induction", at(after)[0], (after >= 0)[:, None])
    out = np.where(inc, vals, 0.0).sum(axis=2)  # (B, G, S)
    return out, inc.sum(axis=2)


# ---- one computed layer's heads, named (the diagnostics of self/view) ---------------------------------------------


@dataclass(frozen=True)
class _Plain:
    """What _block_sums reads of a problem, for weights given whole: no sink (the rows sum to 1)."""

    sinks: None = None


def weights_sums(weights: np.ndarray, seqs: list[Sequence], keys: list[Sequence] | None = None,
                 masked: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sums and counts (B, H, S) of a layer's whole weights (B, H, m, n) (rows that sum to 1; masked keys at 0),
    by the same definitions as :func:`layer_sums`: the weights are the softmax of their logarithms, so they go
    through :func:`_block_sums` as one block of scores ln a_ij (masked keys at -inf). ``masked`` (broadcast to the
    weights): the keys the mask hid; a weight that is 0 without being masked (underflow) is then still a key the
    query may attend (entropy_norm's ln of the keys), at a finite score whose exponential is 0. Without it every 0
    counts as masked."""
    a = np.asarray(weights, dtype=np.float64)
    B, _, m, n = a.shape
    if len(seqs) != B:
        raise InputError(f"{len(seqs)} inputs described for a batch of {B}", "inputs")
    cross = keys is not None or m != n
    pos = _layer_positions(seqs, keys, m, n, B, cross)
    with np.errstate(divide="ignore"):
        s = np.log(a)
    if masked is not None:
        s = np.where((a == 0) & ~np.broadcast_to(np.asarray(masked, dtype=bool), a.shape), -1e300, s)
    return _block_sums(_Plain(), s, 0, 0, m, 0, pos, False, False, cross)  # type: ignore[arg-type]


def name_heads(weights: np.ndarray, seqs: list[Sequence], first_label: str | None = None,
               keys: list[Sequence] | None = None, limits: dict[str, float] | None = None,
               masked: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Each head of one layer's weights (B, H, m, n) that passes a pattern (the thresholds of ``heads``), over the
    valid queries of every entry: ``head``, ``patterns``, each pattern's statistic (``values``) and one sentence
    ("head 3: sink — 0.83 of its weight on `<s>`"). A head that passes nothing is left out (never guessed)."""
    sums, counts = weights_sums(weights, seqs, keys, masked)
    total = Sums.zeros(1, sums.shape[1])
    total.add_layer(0, sums, counts)
    mean = total.mean()[0]
    lim = thresholds(limits)
    first = "the first token" if first_label is None else f"`{first_label}`"
    say = {"sink": lambda v: f"{v} of its weight on {first}",
           "previous-token": lambda v: f"{v} of its weight on the previous token",
           "self": lambda v: f"{v} of its weight on its own position",
           "induction": lambda v: f"{v} of its weight on the token after its token's previous occurrence",
           "broad": lambda v: f"normalised entropy {v} (1: uniform weights)",
           "focused": lambda v: f"{v} of its weight on one key (mean largest weight)"}
    out = []
    for h in range(mean.shape[0]):
        means = {st: (None if math.isnan(float(mean[h, i])) else float(mean[h, i])) for i, st in enumerate(STATS)}
        found = patterns(means, lim)
        if not found:
            continue
        values = {p: means[PATTERNS[p][0]] for p in found}
        parts = [f"{p} — {say[p](beside(float(values[p] or 0.0), lim[p]))} (≥ {lim[p]:g})" for p in found]
        out.append({"head": h, "patterns": found, "values": values, "sentence": f"head {h}: " + "; ".join(parts)})
    return out


# ---- attention rollout (Abnar & Zuidema 2020) ---------------------------------------------------------------------

ROLLOUT_MAX = 2048
ROLLOUT_CAVEAT = ("attention rollout approximates how information flows through the layers by the heads' mean "
                  "weights and the residual connection; it is not an explanation of the model's output "
                  "(Abnar & Zuidema 2020; Jain & Wallace 2019)")


def rollout(means: list[np.ndarray]) -> np.ndarray:
    """Rollout to each layer: Â_l = 0.5·Ā_l + 0.5·I with rows renormalised, R_l = Â_l ⋯ Â_1. ``means``: Ā_l (T, T)
    per layer (the mean over heads of the weights). Returns (L, T, T)."""
    out = []
    R: np.ndarray | None = None
    for A in means:
        t = A.shape[-1]
        Ah = 0.5 * A + 0.5 * np.eye(t)
        z = Ah.sum(axis=-1, keepdims=True)
        Ah = Ah / np.where(z > 0, z, 1.0)
        R = Ah if R is None else Ah @ R  # (T, T) x (T, T)
        out.append(R)
    return np.stack(out)


def mean_weights(prep: Prepared) -> np.ndarray:
    """Ā (B, T, T): each input's mean over query heads of its weights (T <= ROLLOUT_MAX), row block by row block,
    by the one softmax (ops.softmax_of, sinks included)."""
    from attncli.core import blocked, chain, ops

    p = prep.core
    m, n = p.m, p.n
    if n > ROLLOUT_MAX:
        raise InputError(f"rollout holds a T × T product per layer; T = {n} > {ROLLOUT_MAX}", "--rollout")
    from attncli.core.backend import to_numpy

    q, k = prep.q, ops.expand_kv(prep.backend.xp, prep.k, p.n_rep)
    out = np.zeros((q.shape[0], m, n))
    c = chain.constant_factor(p)
    step = blocked.block_rows(p)
    for i0 in range(0, m, step):
        i1 = min(m, i0 + step)
        s, lo = block_scores(p, prep.backend, q[..., i0:i1, :], k, prep.score_weights, i0, i1, c)
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            a = ops.softmax_of(p, np, to_numpy(s), p.sinks)  # (B, H, b, nc)
        out[:, i0:i1, lo:lo + a.shape[-1]] += a.sum(axis=1)
    return out / p.head_count


@dataclass
class Measured:
    """Everything one run measured: the sums and the facts that say what they are of."""

    sums: Sums
    layers: list[int]
    heads: int
    facts: dict[str, Any] = field(default_factory=dict)


# ---- the inputs: what a capture, HIDDEN or X brings ---------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """A batch of inputs as every source gives them (a capture, HIDDEN, X, the induction probe): the residual stream
    entering each layer ``hidden`` (L + 1, B, T, E) — or X of one layer (1, B, T, E) — and, where known, the token
    ids, labels, attention mask (1 = a token, 0 = padding), special tokens mask and the queries scored. (B, T) each."""

    hidden: np.ndarray
    token_ids: np.ndarray | None = None
    labels: list[list[str]] | None = None
    attention_mask: np.ndarray | None = None
    special_tokens_mask: np.ndarray | None = None
    scored: np.ndarray | None = None
    residual: bool = True  # hidden is the residual stream (the layer's own pre-norm first); False: X itself

    @property
    def batch(self) -> int:
        return int(self.hidden.shape[1])

    @property
    def length(self) -> int:
        return int(self.hidden.shape[2])

    def valid(self) -> np.ndarray:
        """(B, T) True where a token is."""
        if self.attention_mask is None:
            return np.ones((self.batch, self.length), dtype=bool)
        return np.asarray(self.attention_mask) != 0

    def sequences(self) -> list[Sequence]:
        v = self.valid()
        out = []
        for b in range(self.batch):
            punct = None
            if self.labels is not None:
                punct = np.array([is_punctuation(t) for t in self.labels[b]], dtype=bool)
            out.append(Sequence(v[b], None if self.token_ids is None else np.asarray(self.token_ids[b]),
                                None if self.special_tokens_mask is None else np.asarray(self.special_tokens_mask[b]) != 0,
                                punct, None if self.scored is None else np.asarray(self.scored[b], dtype=bool)))
        return out

    def layer_input(self, layer: int) -> np.ndarray:
        """X entering ``layer`` (B, T, E): padding's states set to 0 (they are never attended, and may be NaN)."""
        x = np.asarray(self.hidden[layer])
        return np.where(self.valid()[..., None], x, np.zeros((), dtype=x.dtype))


def induction_probe(bos: int, vocab: int, n: int, batch: int, seed: int, avoid: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """TransformerLens's induction probe: a BOS token, then N random tokens repeated twice (seeded), (B, 1 + 2N);
    and the queries scored, the second copy (B, 1 + 2N)."""
    rng = np.random.default_rng(seed)
    pool = np.array([t for t in range(vocab) if t not in avoid])
    if len(pool) < 2:
        raise InputError(f"the vocabulary ({vocab} tokens) leaves no random tokens to draw", "--induction")
    r = pool[rng.integers(0, len(pool), size=(batch, n))]
    ids = np.concatenate([np.full((batch, 1), bos), r, r], axis=1)
    scored = np.zeros(ids.shape, dtype=bool)
    scored[:, 1 + n:] = True
    return ids, scored
