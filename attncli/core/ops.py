"""The operations of attention, each written once over the array API (``xp``: numpy or torch); their order is
attncli.core.chain's.

    project    Q = X W_q + b_q, K = Y W_k + b_k, V = Z W_v + b_v        (B, T, D) x (D, e) -> (B, T, e)
    split      (B, T, H·d) -> (B, H, T, d); K/V may have fewer heads (grouped-query: expand_kv)
    normalise  QK-norm: rms_norm of each head's q and k                 (..., T, d) -> (..., T, d)
    rotate     RoPE: rope_of (its tables, built once for the engine and check), rotate at positions P + i and j
    score      the registered score function (attncli.core.scoring)          (..., m, d) x (..., n, d) -> (..., m, n)
    scale      S · factor / T
    cap        softcap: c · tanh(s / c)
    bias       ALiBi (alibi_slopes, alibi_rows in the forms of attncli.core.alibi) and additive float masks
    mask       keep-mask (valid lengths, causal / window / chunk / local window at positions, boolean masks)
    softmax    stable (row_shift: rows of -inf give zeros); softmax_of: plain or with sinks; OnlineSoftmax
               (blocks of keys) for the output-only path; row_dead: the one fully-masked-row rule
    select     hard attention, dropout
    sum        weights · V                                              (..., m, n) x (..., n, d_v) -> (..., m, d_v)
    merge      (B, H, T, d) -> (B, T, H·d), then W_o + b_o

The explicit path (attncli.core.engine), the blocked output-only path and PyTorch's fused kernel
(attncli.core.blocked), ``check``'s variants, the explanations and the diagnostics all call these:
none keeps a private copy of a softmax, a mask fill or a head merge. The stages of today's
models follow the references of ``shared/CONVENTIONS.md`` to rounding (tests/test_modern_reference.py
runs each beside transformers and torch); the tables built from positions (inverse frequencies,
cos/sin, slopes, keep-masks) are plain numpy that the caller moves onto its backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attncli.core.problem import Problem
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core import alibi
from attncli.core.backend import Backend, round_bfloat16, to_numpy
from attncli.core.heads import check_rope, check_rope_dim
from attncli.core.options import ROPE_TYPES, check_chunk, check_local_window, check_rope_mode, check_window
from attncli.core.scoring import SCALINGS, ScoreInput, get_score
from attncli.core.trace import Trace
from attncli.core.weights import seeded_rng
from attncli.errors import InputError

# ---- 1) project, 2) split, 11) merge ------------------------------------------------------


def project(xp: Any, x: Any, w: Any, b: Any = None) -> Any:
    """A projection in the textbook convention: X W (+ b). (B, T, D) x (D, e) -> (B, T, e)

    A namespace with ``fused_linear`` computes it in one operation (attncli.check.precision: torch's ``F.linear``
    adds the bias in the product's accumulator and rounds once in a half type)."""
    fused = getattr(xp, "fused_linear", None)
    if fused is not None:
        return fused(x, w, b)
    y = x @ w  # (B, T, D) x (D, e) -> (B, T, e)
    return y if b is None else y + b


def split_heads(xp: Any, a: Any, heads: int) -> Any:
    """Each head its own slice of the features: (B, T, H·d) -> (B, T, H, d) -> (B, H, T, d)."""
    B, T, e = (int(s) for s in a.shape)
    return xp.permute_dims(xp.reshape(a, (B, T, heads, e // heads)), (0, 2, 1, 3))


def rope_first(xp: Any, a: Any, heads: int, d_nope: int) -> Any:
    """MLA's queries: each head's features [nope | pe] put as [pe | nope]. (B, T, H·(n+r)) -> (B, T, H·(r+n))"""
    B, T, e = (int(s) for s in a.shape)
    h = xp.reshape(a, (B, T, heads, e // heads))  # (B, T, H·d) -> (B, T, H, d)
    return xp.reshape(xp.concat([h[..., d_nope:], h[..., :d_nope]], axis=-1), (B, T, e))


def shared_rope_keys(xp: Any, k_nope: Any, k_pe: Any, heads: int) -> Any:
    """MLA's keys: k_h = [k_pe | k_nope_h], k_pe the same for every head. (B, S, H·n), (B, S, r) -> (B, S, H·(r+n))"""
    B, S, e = (int(s) for s in k_nope.shape)
    r = int(k_pe.shape[-1])
    kn = xp.reshape(k_nope, (B, S, heads, e // heads))  # (B, S, H·n) -> (B, S, H, n)
    kp = xp.broadcast_to(xp.reshape(k_pe, (B, S, 1, r)), (B, S, heads, r))  # (B, S, r) -> (B, S, H, r)
    return xp.reshape(xp.concat([kp, kn], axis=-1), (B, S, heads * (r + e // heads)))


def merge_heads(xp: Any, a: Any) -> Any:
    """The heads side by side, in order: (B, H, T, d) -> (B, T, H, d) -> (B, T, H·d)."""
    B, H, T, d = (int(s) for s in a.shape)
    return xp.reshape(xp.permute_dims(a, (0, 2, 1, 3)), (B, T, H * d))


def expand_kv(xp: Any, a: Any, n_rep: int) -> Any:
    """Grouped-query heads: query head h reads K/V head h // n_rep. (..., G, S, d) -> (..., G·n_rep, S, d)

    As SDPA's ``enable_gqa`` (``repeat_interleave`` on the head axis) and HF ``repeat_kv``;
    tiling instead (``repeat``: head h reads h % G) is the classic mistake."""
    if n_rep == 1:
        return a
    *lead, G, S, d = (int(s) for s in a.shape)
    b = xp.broadcast_to(xp.expand_dims(a, axis=-3), (*lead, G, n_rep, S, d))  # (..., G, 1, S, d) -> (..., G, r, S, d)
    return xp.reshape(b, (*lead, G * n_rep, S, d))


# ==== the stages of today's models: grouped-query heads, RoPE, ALiBi, windows, soft-capping, sinks, norms ====

# Scores for which a position stage means something (canonical names of the score registry).
# RoPE: the rotated q·k (and with it a cosine or a distance ‖q - k‖) depends on i - j only; a score
# that mixes the features through learned matrices (general, additive) or ignores the query
# (location) sees rotated features at absolute positions, which no reference does.
# ALiBi: a bias on any score, except location, whose weights are by definition the same for every query.



# ---- rotary position embedding --------------------------------------------------------------


def _float32_pow(base: float, x: np.ndarray) -> np.ndarray:
    """base ** x rounded to float32 (x float32): correctly rounded, as torch's float32 pow gives here."""
    return np.power(np.float64(base), x.astype(np.float64)).astype(np.float32)


def _default_inv_freq(dim: int, base: float) -> np.ndarray:
    """1 / base^(2k/dim), k = 0..dim/2-1, in float32 as HF (the exponent is float32 arange / dim)."""
    x = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)  # (dim/2,)
    return np.float32(1.0) / _float32_pow(base, x)


def rope_inv_freq(dim: int, base: float, scaling: dict[str, Any] | None, max_positions: int | None = None,
                  seq_len: int | None = None, source: str = "--rope-scaling") -> tuple[np.ndarray, float]:
    """inv_freq_k = 1 / base^(2k/dim) (scaled as ``scaling`` says), and the cos/sin factor. -> ((dim/2,) float32, float)

    ``scaling``: the ``rope_scaling`` (or transformers 5 ``rope_parameters``) of a config.json,
    ``None`` for plain RoPE; ``rope_type`` (or the older ``type``) is one of default, linear,
    llama3, yarn, dynamic, computed as ``transformers.modeling_rope_utils`` does:

    - linear: inv_freq / factor.
    - llama3: frequencies with a wavelength above original/low_freq_factor divided by factor,
      below original/high_freq_factor kept, smoothly mixed between.
    - yarn: interpolation (inv_freq / factor) and extrapolation (inv_freq) mixed by a linear
      ramp between the correction dims of beta_fast / beta_slow; the factor returned is
      ``attention_factor`` or 0.1·ln(factor) + 1 (mscale / mscale_all_dim as DeepSeek).
    - dynamic (NTK): plain RoPE while the sequence (``seq_len``, the largest position + 1) is
      at most ``max_positions``; beyond it the base grows to
      base·(factor·seq_len/max_positions - (factor - 1))^(dim/(dim-2)), as HF recomputes it
      for a longer sequence.

    ``dim`` is the rotary width (head_dim · partial_rotary_factor). ``max_positions``: the
    config's ``max_position_embeddings`` (yarn without ``original_max_position_embeddings``
    falls back to it, as HF does; dynamic needs it). Returns float32 frequencies and the factor
    that multiplies cos and sin (1.0 except yarn). ``source``: where the scaling came from, for messages (the
    flag, or config.json and its key).
    """
    check_rope_dim(dim, source)
    p = dict(scaling or {})
    kind = str(p.get("rope_type", p.get("type", "default")))
    if kind not in ROPE_TYPES:
        raise InputError(f"rope_type {kind!r} is not supported; choose one of {', '.join(ROPE_TYPES)}", source)
    if kind == "default":
        return _default_inv_freq(dim, base), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(dim, base, p, max_positions, source)
    factor = p.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor) or factor <= 0:
        raise InputError(f"rope_type {kind!r} needs a positive 'factor', got {factor!r}", source)
    if kind == "linear":
        return _default_inv_freq(dim, base) / np.float32(factor), 1.0
    if kind == "llama3":
        return _llama3_inv_freq(dim, base, p, float(factor), source), 1.0
    # dynamic
    if max_positions is None:
        raise InputError("rope_type 'dynamic' needs max_position_embeddings (the config's)", source)
    if dim <= 2:  # the grown base is base · ratio^(d / (d - 2)): transformers' own formula divides by zero
        raise InputError(f"rope_type 'dynamic' needs a rotary width above 2 (its base grows as ratio^(d/(d-2))), "
                         f"got {dim}", source)
    n = max_positions if seq_len is None else max(seq_len, max_positions)
    f32 = np.float32  # HF computes the grown base from a tensor sequence length: in float32
    ratio = f32(f32(factor) * f32(n)) / f32(max_positions) - f32(factor - 1)
    grown = f32(base) * _float32_pow(float(ratio), np.asarray(dim / (dim - 2), dtype=np.float32))  # = base at n = max
    return _default_inv_freq(dim, float(grown)), 1.0


def _need(p: dict[str, Any], key: str, kind: str, source: str = "--rope-scaling") -> float:
    v = p.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise InputError(f"rope_type {kind!r} needs a number {key!r}, got {v!r}", source)
    return float(v)


def _llama3_inv_freq(dim: int, base: float, p: dict[str, Any], factor: float, source: str) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling (``_compute_llama3_parameters``), in float32."""
    low, high = _need(p, "low_freq_factor", "llama3", source), _need(p, "high_freq_factor", "llama3", source)
    old = _need(p, "original_max_position_embeddings", "llama3", source)
    f32 = np.float32
    inv = _default_inv_freq(dim, base)
    wavelen = (f32(1) / inv) * f32(2 * math.pi)  # (dim/2,); torch's scalar / tensor is reciprocal(tensor) · scalar
    low_wavelen, high_wavelen = old / low, old / high
    scaled = np.where(wavelen > low_wavelen, inv / f32(factor), inv)
    smooth = ((f32(1) / wavelen) * f32(old) - f32(low)) / f32(high - low)
    smoothed = (f32(1) - smooth) * scaled / f32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_inv_freq(dim: int, base: float, p: dict[str, Any], max_positions: int | None,
                   source: str) -> tuple[np.ndarray, float]:
    """YaRN (``_compute_yarn_parameters``): ramped mix of interpolated and extrapolated frequencies."""
    original = p.get("original_max_position_embeddings", max_positions)
    if original is None:
        raise InputError("rope_type 'yarn' needs original_max_position_embeddings (or the config's "
                         "max_position_embeddings)", source)
    original = _need({"original_max_position_embeddings": original}, "original_max_position_embeddings", "yarn", source)
    if p.get("factor") is None:  # DeepSeek-V3 style: the ratio of the two lengths
        if max_positions is None:
            raise InputError("rope_type 'yarn' without 'factor' needs max_position_embeddings", source)
        factor = max_positions / original
    else:
        factor = _need(p, "factor", "yarn", source)
        if factor <= 0:
            raise InputError(f"rope_type 'yarn' needs a positive 'factor', got {factor!r}", source)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = float(mscale(factor, ms) / mscale(factor, ms_all)) if ms and ms_all else mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001  # as HF: no division by zero
    f32 = np.float32
    x = np.arange(0, dim, 2, dtype=np.float32) / f32(dim)
    pos_freqs = _float32_pow(base, x)  # (dim/2,)
    extrapolation = f32(1) / pos_freqs
    interpolation = f32(1) / (f32(factor) * pos_freqs)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - f32(lo)) / f32(hi - lo), 0, 1)
    extra = f32(1) - ramp
    inv = interpolation * (f32(1) - extra) + extrapolation * extra
    return inv.astype(np.float32), float(attn)


def freqs_held_in(inv_freq: np.ndarray, precision: str) -> np.ndarray:
    """RoPE's inverse frequencies as a buffer of ``precision`` holds them (float32: unchanged; bfloat16, float16:
    rounded, as ``model.to(dtype)`` leaves transformers' ``inv_freq``, which its rotary embedding then widens to
    float32). (r/2,) -> (r/2,)"""
    if precision == "bfloat16":
        return round_bfloat16(np.asarray(inv_freq, dtype=np.float32)).astype(inv_freq.dtype)
    if precision == "float16":
        return np.asarray(inv_freq, dtype=np.float32).astype(np.float16).astype(inv_freq.dtype)
    return inv_freq


def rope_cos_sin(positions: Any, inv_freq: np.ndarray, factor: float, mode: str,
                 dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """θ_pk = position_p · inv_freq_k; cos θ · factor and sin θ · factor. (T,) x (r/2,) -> (T, r), (T, r)

    "half" (HF Llama) and "half-reversed" (nanochat): emb = cat(θ, θ), frequency k at features k and k + r/2;
    "interleaved" (GPT-J, Meta): each frequency twice in a row, features 2k and 2k+1.

    As HF: θ = float32(position) · float32 inv_freq, rounded to float32; cos and sin are taken
    in float64 and rounded to float32 (torch's float32 cos/sin are within one unit in the
    last place of them), then multiplied by the factor in float32. HF casts these float32
    tables to the model's dtype, also for a float64 model; ``dtype="float64"`` instead keeps
    θ from the same float32 frequencies in float64 and returns float64 tables.
    """
    check_rope_mode(mode)
    pos = np.asarray(positions)
    if dtype == "float64":
        th = pos.astype(np.float64)[:, None] * inv_freq.astype(np.float64)[None, :]  # (T, 1) x (1, r/2) -> (T, r/2)
    else:
        th = (pos.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]).astype(np.float64)
    emb = np.concatenate([th, th], axis=-1) if mode != "interleaved" else np.repeat(th, 2, axis=-1)  # (T, r)
    cos, sin = np.cos(emb), np.sin(emb)
    if dtype != "float64":
        cos, sin = cos.astype(np.float32), sin.astype(np.float32)
    if factor != 1.0:
        f = cos.dtype.type(factor)
        cos, sin = cos * f, sin * f
    return cos, sin


def rotate(xp: Any, x: Any, cos: Any, sin: Any, mode: str, rotary_dim: int | None = None,
           rounding: str = "each") -> Any:
    """x' = x·cos + rotate(x)·sin on the first rotary_dim features; the rest pass through. (..., T, d) -> (..., T, d)

    "half": rotate_half(x) = cat(-x[r/2:], x[:r/2]) (HF Llama, GPT-NeoX); "half-reversed": cat(x[r/2:], -x[:r/2])
    (nanochat: each pair turned by -θ); "interleaved":
    rotate_every_two(x) = (-x1, x0, -x3, x2, ...) (GPT-J, Meta's complex pairs). ``cos`` and
    ``sin``: (T, r) tables from :func:`rope_cos_sin` (numpy or xp arrays), cast to x's dtype
    as HF does (``cos.to(x.dtype)``). ``rounding`` (the option rope_rounding) for a half-precision x: "each" (every
    operation in the dtype: Llama), "once" (x in float32 times the cast tables, rounded once: Cohere, ESM, ModernBERT's
    ``q.float() * cos``), "once-float32" (x in float32 times float32 tables, rounded once: OLMo 2, Ernie 4.5, LFM3,
    whose rotary embeddings return cos and sin uncast). float32 and float64 are the same whichever.
    """
    check_rope_mode(mode)
    d = int(x.shape[-1])
    r = d if rotary_dim is None else int(rotary_dim)
    dev, dt = _device(x), x.dtype
    wide = rounding != "each" and dt not in (xp.float32, xp.float64)
    if wide and rounding == "once-float32":
        c, s = (xp.asarray(t, dtype=xp.float32, device=dev) for t in (cos, sin))  # (T, r), broadcast over the heads
    else:
        c, s = (xp.asarray(t, dtype=dt, device=dev) for t in (cos, sin))  # held in the dtype, as cos.to(x.dtype)
        c, s = (xp.astype(c, xp.float32), xp.astype(s, xp.float32)) if wide else (c, s)
    xr = xp.astype(x[..., :r], xp.float32) if wide else x[..., :r]  # (..., T, r)
    if mode == "half":
        rot = xp.concat([-xr[..., r // 2:], xr[..., :r // 2]], axis=-1)  # (..., T, r)
    elif mode == "half-reversed":  # nanochat: cat(x2, -x1), the pair (k, k + r/2) turned by -θ
        rot = xp.concat([xr[..., r // 2:], -xr[..., :r // 2]], axis=-1)  # (..., T, r)
    else:
        pairs = xp.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1)  # (..., T, r/2, 2)
        rot = xp.reshape(pairs, tuple(int(n) for n in xr.shape))  # (..., T, r/2, 2) -> (..., T, r)
    y = xr * c + rot * s
    y = xp.astype(y, dt) if wide else y  # one rounding
    return y if r == d else xp.concat([y, x[..., r:]], axis=-1)  # (..., T, r) + (..., T, d - r) -> (..., T, d)


@dataclass(frozen=True)
class Rope:
    """A problem's rotary position embedding with its tables' every input settled once (:func:`rope_of`): the
    mode, the base (per layer), the rotary width ``dim`` (partial: the rest pass through), the inverse
    frequencies after the scaling and ``--rope-freqs``, the cos/sin ``factor``, the tables' dtype (the run's:
    float64 for float64, else float32 as HF) and the family's ``rounding`` of a half-precision rotation."""

    mode: str
    base: float
    dim: int
    inv_freq: np.ndarray  # (dim/2,) float32
    factor: float
    tables: str
    rounding: str
    scaling: str | None  # the rope_type of --rope-scaling, or None
    freqs: str = "float32"  # the precision the inverse frequencies are held in (--rope-freqs, where it applies)

    def cos_sin(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """cos θ · factor and sin θ · factor at ``positions``. (T,) -> (T, dim), (T, dim)"""
        return rope_cos_sin(positions, self.inv_freq, self.factor, self.mode, self.tables)

    def rotate(self, xp: Any, a: Any, positions: Any) -> Any:
        """``a`` (..., T, d) rotated at ``positions`` (T,): the engine's q_rot and k_rot, and every RoPE of ``check``."""
        c, s = self.cos_sin(positions)
        return rotate(xp, a, c, s, self.mode, self.dim, self.rounding)


def rope_of(problem: Problem) -> Rope:
    """The one place RoPE's tables are settled for ``problem`` (its options: --rope, --rope-base / the layer's base,
    --rotary-dim / partial_rotary_factor, --rope-scaling, --rope-freqs, rope_rounding; its dtype and sequence
    length): the engine's rotate stage, check's variants and the port mistakes all rotate with it."""
    o = problem.options
    mode = str(o.rope)
    base, width = problem.rope_settings()
    rd = check_rope(problem.d_qk, width, mode)
    sc = dict(o.rope_scaling) if o.rope_scaling else None
    seq = max(problem.query_offset + problem.m - 1, problem.n - 1, 0) + 1  # the largest position + 1 (dynamic NTK)
    inv, factor = rope_inv_freq(rd, base, sc, (sc or {}).get("max_position_embeddings"), seq_len=seq,
                                source=problem.origin("rope_scaling"))
    kind = sc.get("rope_type", sc.get("type")) if sc else None
    # --rope-freqs bfloat16: as model.to(bfloat16) leaves them; but dynamic scaling beyond max_position_embeddings has
    # transformers recompute inv_freq, in float32 (its cast is gone: measured on LlamaRotaryEmbedding)
    grown = kind == "dynamic" and seq > int((sc or {}).get("max_position_embeddings") or 0)
    freqs = "float32" if grown else str(o.rope_freqs)
    return Rope(mode, base, rd, freqs_held_in(inv, freqs), factor, "float64" if problem.dtype == "float64" else "float32",
                str(o.rope_rounding), kind, freqs)


# ---- ALiBi ----------------------------------------------------------------------------------


def alibi_bias(slopes: Any, q_pos: Any, k_pos: Any) -> np.ndarray:
    """b_hij = slope_h · (k_pos_j - q_pos_i) = -slope_h · distance. (H,), (m,), (n,) -> (H, m, n): ALiBi's
    relative form (attncli.core.alibi, with the forms that models round differently)."""
    return np.asarray(alibi.relative(slopes, q_pos, k_pos, 1.0))


# ---- masks from positions ----------------------------------------------------------------


def causal_keep(q_pos: Any, k_pos: Any) -> np.ndarray:
    """keep_ij = k_pos_j <= q_pos_i. (m,), (n,) -> (m, n) bool

    Top-left: q_pos = arange(m); bottom-right / KV cache: q_pos = (n - m) + arange(m), or any
    offset P: P + arange(m); keys at arange(n).
    """
    return np.asarray(k_pos)[None, :] <= np.asarray(q_pos)[:, None]  # (1, n) vs (m, 1) -> (m, n)


def window_keep(q_pos: Any, k_pos: Any, window: int) -> np.ndarray:
    """keep_ij = q_pos_i - W < k_pos_j <= q_pos_i: each query sees W keys, itself included. (m,), (n,) -> (m, n) bool

    HF ``masking_utils``: causal and ``sliding_window_overlay`` (kv > q - W); FlashAttention
    ``window_size=(W - 1, 0)``.
    """
    check_window(window)
    k, q = np.asarray(k_pos)[None, :], np.asarray(q_pos)[:, None]
    return (k <= q) & (k > q - window)  # (1, n) vs (m, 1) -> (m, n)


def local_keep(q_pos: Any, k_pos: Any, radius: int) -> np.ndarray:
    """keep_ij = |k_pos_j - q_pos_i| <= R: a window on both sides of each query, 2R + 1 positions wide.
    (m,), (n,) -> (m, n) bool

    HF ``masking_utils.sliding_window_bidirectional_overlay`` (``abs(q_idx - kv_idx) <= sliding_window``): ModernBERT's
    and UltraBERT's local layers.
    """
    check_local_window(radius)
    k, q = np.asarray(k_pos)[None, :], np.asarray(q_pos)[:, None]
    return np.abs(k - q) <= radius  # (1, n) vs (m, 1) -> (m, n)


def chunk_keep(q_pos: Any, k_pos: Any, chunk: int) -> np.ndarray:
    """keep_ij = k_pos_j <= q_pos_i and k_pos_j // C == q_pos_i // C: causal within each chunk of C positions.
    (m,), (n,) -> (m, n) bool

    HF ``masking_utils``: causal and ``chunked_overlay`` (Llama 4's chunked attention layers).
    """
    check_chunk(chunk)
    k, q = np.asarray(k_pos)[None, :], np.asarray(q_pos)[:, None]
    return (k <= q) & (k // chunk == q // chunk)  # (1, n) vs (m, 1) -> (m, n)


def tuning_factors(positions: Any, scale: float, floor: float) -> np.ndarray:
    """Llama 4's temperature tuning: log(floor((pos + 1) / F) + 1) · a + 1 per query position, in float32 as HF
    computes it (``torch.log1p(torch.floor((positions.float() + 1) / floor_scale)) * attn_scale + 1``). (m,) -> (m,)"""
    pos = np.asarray(positions, dtype=np.float32)
    return (np.log1p(np.floor((pos + np.float32(1.0)) / np.float32(floor))) * np.float32(scale)
            + np.float32(1.0)).astype(np.float32)


# ---- scores and softmax ---------------------------------------------------------------------


def tuned(xp: Any, q: Any, factors: np.ndarray) -> Any:
    """q_i · factor_i (Llama 4's temperature tuning). (..., m, d) * (m,) -> (..., m, d)

    A half-precision q is multiplied in float32 by the float32 factors and rounded once, as Llama 4's
    ``(query_states * attn_scales).to(query_states.dtype)``; float32 and float64 in their own dtype."""
    dt = q.dtype
    if dt in (xp.float32, xp.float64):
        return q * xp.asarray(factors[:, None], dtype=dt, device=_device(q))  # (..., m, d) * (m, 1)
    f = xp.asarray(factors[:, None], dtype=xp.float32, device=_device(q))
    return xp.astype(xp.astype(q, xp.float32) * f, dt)


def softcap(xp: Any, s: Any, cap: float) -> Any:
    """s' = c · tanh(s / c): scores squashed into (-c, c), nearly unchanged where |s| << c. (...) -> (...)

    In Gemma 2's order (``eager_attention_forward``): after scaling, before the mask.
    """
    return xp.tanh(s / cap) * cap


def softmax_with_sinks(xp: Any, s: Any, sinks: Any) -> Any:
    """w_ij = exp(s_ij) / (exp(sink_h) + Σ_j' exp(s_ij')): softmax over [s | sink_h], sink column dropped.
    (..., H, m, n), (H,) -> (..., H, m, n)

    gpt-oss ``sdpa`` and HF ``modeling_gpt_oss.eager_attention_forward``: a row sums to
    1 - (the sink's share). Stable: the row maximum over keys and sink is subtracted. A row
    whose keys are all -inf (fully masked) gives the sink everything: zero weights, as HF's
    (its masked keys are at finfo.min, which exp turns into 0 beside a finite sink). A sink of
    -inf is no sink (plain softmax); a row of -inf keys and a -inf sink also gets zero weights.
    """
    n = int(s.shape[-1])
    sk = xp.asarray(sinks, dtype=s.dtype, device=_device(s))
    sk = xp.reshape(sk, (-1, 1, 1) if s.ndim >= 3 else (1, 1))  # one head: (m, n) scores
    col = xp.broadcast_to(sk, (*(int(x) for x in s.shape[:-1]), 1))  # (H,) -> (..., H, m, 1)
    c = xp.concat([s, col], axis=-1)  # (..., H, m, n) + (..., H, m, 1) -> (..., H, m, n+1)
    mx = row_shift(xp, xp.max(c, axis=-1, keepdims=True))
    return softmax(xp, c - mx)[..., :n]  # HF subtracts the max itself (rounded in a half type), then softmax


def softmax_sink_scaled(xp: Any, s: Any, sinks: Any) -> Any:
    """The weights of :func:`softmax_with_sinks` in Granite SWA's form: softmax(s) · sigmoid(logsumexp(s) - sink_h),
    the sink's share taken off each row by a scale (HF ``modeling_granite_swa.eager_attention_forward`` applies it
    to softmax(s) · V). Equal in exact arithmetic; in a half precision it rounds as that model does (the softmax
    once, the row's scale once). (..., H, m, n), (H,) -> (..., H, m, n)"""
    sk = xp.asarray(sinks, dtype=s.dtype, device=_device(s))
    sk = xp.reshape(sk, (-1, 1, 1) if s.ndim >= 3 else (1, 1))  # one head: (m, n) scores
    mx, e, z = softmax_parts(xp, s)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a row of -inf: log(0) = -inf, scale 0
        lse = mx + xp.log(z)  # (..., H, m, 1)
        scale = 1.0 / (1.0 + xp.exp(sk - lse))  # sigmoid(lse - sink)
    scale = xp.where(xp.isnan(scale), xp.zeros_like(scale), scale)  # -inf keys and a -inf sink: zero weights
    return softmax(xp, s) * scale


# ---- norms ----------------------------------------------------------------------------------


def rms_norm(xp: Any, x: Any, w: Any, eps: float, plus_one: bool = False, axes: tuple[int, ...] = (-1,),
             wide_weight: bool = False) -> Any:
    """y = x / sqrt(mean(x²) + eps) · w (Qwen3, Llama), or · (1 + w) (Gemma). (..., d), (d,) -> (..., d)

    ``axes``: the axes the mean runs over (default the features; (-3, -1): every head's features of a
    token, OLMo 2's norm over the full width). ``w`` broadcasts against x ((d,), or (H, 1, d) per head).
    As HF: half-precision inputs are computed in float32 and returned in their own dtype;
    Llama/Qwen3 cast the normalised x back before multiplying by w, Gemma (and ``wide_weight``: OLMo 2)
    multiply by the weight in float32 and cast after. float32 and float64 inputs are computed in their
    own dtype (HF computes a float64 model's norm in float32: it agrees with this to ~1e-7).
    """
    dt = x.dtype
    wide = dt if dt in (xp.float32, xp.float64) else xp.float32
    xf = xp.astype(x, wide)
    y = xf / xp.sqrt(xp.mean(xf * xf, axis=axes, keepdims=True) + eps)  # (..., d) / (..., 1)
    wt = xp.asarray(w, device=_device(x))
    if plus_one:
        return xp.astype(y * (1.0 + xp.astype(wt, wide)), dt)
    if wide_weight:
        return xp.astype(y * xp.astype(wt, wide), dt)
    return xp.astype(y, dt) * xp.astype(wt, dt)


def gate_values(xp: Any, z: Any, act: str) -> Any:
    """An output gate's activation of its logits z = X · W_g: sigmoid 1 / (1 + e^-z) or softplus log(1 + e^z), both
    written with e^-|z| (no overflow)."""
    e = xp.exp(-xp.abs(z))
    if act == "sigmoid":
        return xp.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    if act == "softplus":
        return xp.where(z > 0, z, xp.zeros_like(z)) + xp.log1p(e)
    raise AssertionError(f"unknown gate activation {act!r}")


def gated(xp: Any, concat: Any, g: Any) -> Any:
    """concat ⊙ gate: (..., T, H·d) times (..., T, H·d), or times (..., T, H) with each head's d features sharing its
    gate."""
    n, width = int(g.shape[-1]), int(concat.shape[-1])
    if n == width:
        return concat * g
    per = xp.reshape(concat, tuple(concat.shape[:-1]) + (n, width // n))  # (..., T, H·d) -> (..., T, H, d)
    return xp.reshape(per * g[..., None], tuple(concat.shape))  # (..., T, H, d) * (..., T, H, 1)


def layer_norm(xp: Any, x: Any, w: Any, b: Any, eps: float) -> Any:
    """y = (x - mean) / sqrt(var + eps) · w + b, biased variance over the last axis (nn.LayerNorm). (..., d) -> (..., d)

    ``w`` and ``b`` broadcast against x ((d,), or (H, 1, d): each head its own). Half-precision inputs are
    computed in float32 (weight and bias included) and rounded once, as torch's LayerNorm kernel and
    CohereLayerNorm do; float32 and float64 in their own dtype."""
    dt = x.dtype
    wide = dt if dt in (xp.float32, xp.float64) else xp.float32
    xf = xp.astype(x, wide)
    mu = xp.mean(xf, axis=-1, keepdims=True)  # (..., 1)
    c = xf - mu
    var = xp.mean(c * c, axis=-1, keepdims=True)  # (..., 1)
    y = c / xp.sqrt(var + eps)
    dev = _device(x)
    y = y * xp.asarray(w, dtype=wide, device=dev)
    y = y if b is None else y + xp.asarray(b, dtype=wide, device=dev)
    return y if wide == dt else xp.astype(y, dt)


def qk_norm(xp: Any, x: Any, kind: str, w: Any, b: Any, eps: float, wide_weight: bool = False) -> Any:
    """The QK-norm ``kind`` of q or k (..., H, T, d): rms, rms1p, layernorm over each head's d features, or
    rms-full over the H·d features of each token (every head at once, as OLMo 2 before the head split).
    ``w`` (and ``b``, layernorm only) broadcast: (d,) shared by the heads, (H, 1, d) each head its own.
    ``wide_weight``: see :func:`rms_norm` (the option rms_wide)."""
    if kind == "layernorm":
        return layer_norm(xp, x, w, b, eps)
    if kind == "rms-full":  # mean over heads and features = over the token's H·d features before the split
        return rms_norm(xp, x, w, eps, axes=(-3, -1) if x.ndim >= 3 else (-1,), wide_weight=wide_weight)
    return rms_norm(xp, x, w, eps, plus_one=kind == "rms1p", wide_weight=wide_weight)


# ---- 3) score, 4) scale ------------------------------------------------------------------------


def score(problem: Problem, xp: Any, q: Any, k: Any, params: dict[str, Any], trace: Trace | None = None) -> Any:
    """The problem's registered score of queries ``q`` against keys ``k``. (..., m, d) x (..., n, d) -> (..., m, n)"""
    return get_score(problem.options.score).fn(ScoreInput(xp, q, k, params, trace, problem.options))


def scale_factor(problem: Problem, xp: Any, s: Any) -> Any:
    """The factor the raw scores are multiplied by (None for none)."""
    o = problem.options
    if o.scale is not None:
        return o.scale
    rule = SCALINGS[o.scaling or get_score(o.score).scaling]
    if rule.name == "none":
        return None
    return rule.factor(xp, s, problem.d_qk, problem.n)


# ---- 5) mask ------------------------------------------------------------------------------------


Rows = tuple[int, int] | np.ndarray | None  # which queries: all, i0..i1-1 (a block), or an index array (corners)


def keep_mask(problem: Problem, n: int, rows: Rows = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(keep, bias) on the host: a boolean keep-mask broadcastable to (..., rows, n) from the valid
    lengths, the causal rule and boolean masks, and an additive float mask (or None for each)."""
    o = problem.options
    m = problem.m
    index = np.arange(*rows) if isinstance(rows, tuple) else np.arange(m) if rows is None else rows  # query indices
    keep = None
    j = np.arange(n)  # key index
    if problem.query_limit is not None:
        keep = _row_block(problem.query_limit[..., None], rows) > j  # (..., m, 1) vs (n,) -> (..., m, n)
    q_pos = problem.query_offset + index  # query i at position P + i, key j at j
    if o.causal or o.window is not None or o.chunk is not None:
        causal = causal_keep(q_pos, j) if o.window is None else window_keep(q_pos, j, o.window)  # (rows, n)
        if o.chunk is not None:  # Llama 4: only the keys of the query's own chunk
            causal = causal & chunk_keep(q_pos, j, o.chunk)
        keep = causal if keep is None else keep & causal
    if o.local_window is not None:  # ModernBERT's local layers: both sides of the query
        near = local_keep(q_pos, j, o.local_window)  # (rows, n)
        keep = near if keep is None else keep & near
    bias = None
    if problem.mask is not None:
        mk = _row_block(problem.mask, rows)
        if mk.dtype == bool:
            mk = mk if o.mask_convention == "keep" else ~mk
            keep = mk if keep is None else keep & mk
        else:
            bias = mk
    if problem.padding is not None:  # key padding (B, 1, 1, n), True = ignore, as PyTorch
        pad = problem.padding
        if pad.dtype == bool:
            keep = ~pad if keep is None else keep & ~pad
        else:
            bias = pad if bias is None else bias + pad  # a float key padding mask is added, as PyTorch merges it
    return keep, bias


def alibi_rows(problem: Problem, rows: Rows = None, r: float = 1.0) -> np.ndarray | None:
    """The ALiBi term of the queries ``rows`` on the host, in the form ``--alibi-form`` says (attncli.core.alibi:
    slope_h · (j - (P + i)) by default), broadcastable to the scores (..., H, rows, n) (or (rows, n) with one
    head); None without ALiBi. ``r``: what a form added before the scale is divided by (1 / the scale)."""
    sl = problem.slopes()
    if sl is None:
        return None
    m, n = problem.m, problem.n
    index = np.arange(*rows) if isinstance(rows, tuple) else np.arange(m) if rows is None else rows
    b = alibi.bias(problem.options.alibi_form, sl, problem.query_offset + index, np.arange(n), r)  # (H, rows, n)
    return b if problem.batch_shape else b[0]


def sink_column(problem: Problem, xp: Any, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """The sinks as a column beside the scores: (H,) -> ``shape`` = (..., H, rows, 1) (or (rows, 1), one head)."""
    sk = xp.asarray(np.array(problem.sinks), dtype=dtype, device=device)  # a copy: the Problem's arrays are read-only
    return xp.broadcast_to(xp.reshape(sk, (-1, 1, 1) if len(shape) >= 3 else (1, 1)), shape)


def masks(problem: Problem, be: Backend, rows: Rows = None) -> tuple[Any, Any]:
    """:func:`keep_mask` on the backend: (keep as booleans, bias in the computing dtype)."""
    keep, bias = keep_mask(problem, problem.n, rows)
    return (None if keep is None else be.asbool(keep)), (None if bias is None else be.asarray(bias, problem.dtype))


def _row_block(a: np.ndarray, rows: Rows) -> np.ndarray:
    """Some rows (i0..i1-1, or an index array) of an array broadcast over (..., m, n); one that has
    a single row (or none) as it is."""
    if rows is None or a.ndim < 2 or a.shape[-2] == 1:
        return a
    return a[..., rows[0]:rows[1], :] if isinstance(rows, tuple) else a[..., rows, :]


def fill_value(problem: Problem) -> float:
    """What a masked score becomes: -inf (masked weights exactly 0), or --mask-value."""
    mv = problem.options.mask_value
    return -math.inf if mv is None else mv


def apply_mask(xp: Any, s: Any, keep: Any, bias: Any, fill: float) -> Any:
    """masked = S + bias, with the keys that keep excludes set to ``fill``. (..., m, n)"""
    if bias is not None:
        s = s + bias
    if keep is not None:
        s = xp.where(keep, s, xp.asarray(fill, dtype=s.dtype, device=_device(s)))
    return s


# ---- 6) softmax ---------------------------------------------------------------------------------


def row_shift(xp: Any, mx: Any) -> Any:
    """What a row's softmax subtracts before exp: its max, or 0 where the max is not finite (a row of -inf, every
    key masked: its exps are then 0, never NaN). The one overflow rule of every softmax here, exact and online."""
    return xp.where(xp.isfinite(mx), mx, xp.zeros_like(mx))


def softmax_parts(xp: Any, s: Any, top: Any = None) -> tuple[Any, Any, Any]:
    """(row max, e = exp(s - max), z = Σ e) over the last axis; a row of -inf has max 0, e 0, z 0. ``top``: the row
    max (..., m, 1) when the caller has it already. exp is taken in place of the difference (its own new array)."""
    mx = row_shift(xp, xp.max(s, axis=-1, keepdims=True) if top is None else top)
    e = _exp(xp, s - mx, True)
    return mx, e, xp.sum(e, axis=-1, keepdims=True)


def softmax(xp: Any, s: Any, top: Any = None) -> Any:
    """Stable softmax over the last axis: exp(s - max) / Σ exp(s - max). Rows of -inf give zeros. ``top``: the row
    max of ``s`` when the caller has it (:func:`softmax_of`).

    A namespace with ``fused_softmax`` computes it in one operation (attncli.check.precision: torch's softmax of a
    half tensor computes in float32 and rounds once)."""
    fused = getattr(xp, "fused_softmax", None)
    if fused is not None:
        return fused(s)
    _, e, z = softmax_parts(xp, s, top)
    z = xp.where(z > 0, z, xp.ones_like(z))
    if type(e) is np.ndarray:  # e is this function's own array: divided in place (the same quotients)
        return np.divide(e, z, out=e)
    if hasattr(e, "div_"):
        return e.div_(z)
    return e / z


def softmax_of(problem: Problem, xp: Any, s: Any, sinks: Any = None, top: Any = None) -> Any:
    """The exact softmax ``problem`` asks for over the scores ``s`` (..., m, n): plain, or with its ``sinks`` (H,)
    on the backend in gpt-oss's form or Granite SWA's (--sink-form scale). The explicit path's; the blocked path
    folds the same sinks into :class:`OnlineSoftmax` (:meth:`OnlineSoftmax.add_sinks`)."""
    if sinks is None:
        return softmax(xp, s, top)
    if problem.options.sink_form == "scale":
        return softmax_sink_scaled(xp, s, sinks)
    return softmax_with_sinks(xp, s, sinks)


class OnlineSoftmax:
    """The softmax of a row met in chunks of keys, folded straight into the product with V:
    the running max r, the output and the sum a = Σ e·[V | 1] are rescaled by exp(r_old - r_new)
    when a chunk raises the max. ``shift=False`` (scores known to be bounded well inside exp's
    range) takes exp(s) with no max at all. ``finish()`` gives a[:d_v] / a[d_v]."""

    def __init__(self, xp: Any, shift: bool) -> None:
        self.xp, self.shift = xp, shift
        self.r: Any = None  # running max (..., b, 1)
        self.a: Any = None  # outputs and sums (..., b, d_v + 1)

    def add(self, s: Any, v1: Any, reuse: bool = False) -> None:
        """Fold in a chunk of scores ``s`` (..., b, n_c) with its values [V | 1] (..., n_c, d_v + 1);
        ``reuse``: ``s`` may be overwritten."""
        xp, alpha = self.xp, None
        if self.shift:
            mx = xp.max(s, axis=-1, keepdims=True)  # (..., b, 1)
            r_new = mx if self.r is None else xp.maximum(self.r, mx)
            ref = row_shift(xp, r_new)  # a row all -inf so far: zeros
            if self.r is not None:  # rescale what earlier chunks added: exp(r_old - r_new) <= 1 (0 where r_old is -inf)
                alpha = xp.where(xp.isfinite(self.r), xp.exp(self.r - ref), xp.zeros_like(self.r))
            self.r = r_new
            if reuse and hasattr(s, "__isub__"):
                s -= ref
            else:
                s = s - ref
        e = _exp(xp, s, reuse or self.shift)
        ev = e @ v1  # (..., b, n_c) x (..., n_c, d_v + 1) -> (..., b, d_v + 1): outputs, sums
        self.a = ev if self.a is None else (self.a + ev if alpha is None else self.a * alpha + ev)

    def add_sinks(self, col: Any) -> None:
        """Fold in the sinks (:func:`sink_column`, (..., b, 1)): one more key per head whose value is 0, so it adds
        exp(sink_h) to each row's sum only (softmax over [s | sink_h], its column dropped)."""
        xp, d1 = self.xp, int(self.a.shape[-1])
        zero_one = xp.concat([xp.zeros((1, d1 - 1), dtype=col.dtype, device=_device(col)),
                              xp.ones((1, 1), dtype=col.dtype, device=_device(col))], axis=-1)  # (1, d_v + 1)
        self.add(col, zero_one)

    def finish(self) -> Any:
        """The output rows (..., b, d_v): Σ e·v / Σ e (0 where the sum is 0)."""
        xp, a = self.xp, self.a
        total = a[..., -1:]  # (..., b, 1)
        return a[..., :-1] / xp.where(total > 0, total, xp.ones_like(total))

    def top(self) -> Any:
        """The running row max (..., b, 1) (None with shift=False: not kept)."""
        return self.r


def _exp(xp: Any, s: Any, inplace: bool) -> Any:
    if inplace and isinstance(s, np.ndarray):
        return np.exp(s, out=s)
    if inplace and hasattr(s, "exp_"):
        return s.exp_()
    return xp.exp(s)


def row_dead(xp: Any, top: Any, kept: Any) -> Any:
    """The one rule of a fully masked row, for every path: its largest score is -inf (``top``, the row max
    (..., m, 1), or None where not known) or it keeps no key (``kept``: any key kept, (..., m), or None: no keep-mask).
    (..., m) on the backend. Its weights and output are zero (:func:`row_shift`, :class:`OnlineSoftmax`)."""
    dead = None if top is None else xp.isinf(top[..., 0]) & (top[..., 0] < 0)
    if kept is not None:
        dead = ~kept if dead is None else dead | ~kept
    return dead


def dead_rows(xp: Any, s: Any, keep: Any, top: Any = None) -> np.ndarray | None:
    """Rows (..., m) with every key masked (:func:`row_dead` of the whole scores ``s`` and ``keep``), on the host; None
    if none. The warnings, diagnostics and views read it. ``top``: the row max of ``s`` when the caller has it."""
    top = xp.max(s, axis=-1, keepdims=True) if top is None else top
    dead = row_dead(xp, top, None if keep is None else xp.any(keep, axis=-1))
    dead_np = to_numpy(dead)
    return dead_np if dead_np.any() else None


def dead_row_messages(problem: Problem, dead: np.ndarray) -> list[str]:
    """One warning per fully masked row (the first 10), named by label and batch/head index."""
    dead = np.broadcast_to(dead, problem.batch_shape + (problem.m,))
    labels, mv = problem.query_labels, problem.options.mask_value
    names = problem.axis_names
    what = "its weights and head output are zero" if "head" in names else "its weights and output are zero"
    out = []
    for idx in np.argwhere(dead)[:10]:
        *b, i = (int(x) for x in idx)
        row = f"query {labels[i]!r}" if labels else f"query {i}"
        shown = [f"{n} {x}" for n, x in zip(names, b) if n] if len(names) == len(b) else [f"batch {', '.join(map(str, b))}"]
        where = f"{row} ({', '.join(shown)})" if shown else row
        if mv is None or math.isinf(mv):
            out.append(f"{where} has every key masked: {what}")
        else:
            out.append(f"{where} has every key masked: with mask value {mv:g} its weights are uniform (as d2l)")
    extra = int(dead.sum()) - len(out)
    if extra > 0:
        out.append(f"... and {extra} more fully masked rows")
    return out


def _all_fine(xp: Any, raw: Any, s: Any) -> bool:
    """Whether every raw score is finite and no score after masking is NaN or +inf: a sum of values one of which
    is not finite is not finite (a finite sum that overflows says False too: the full check then decides), a NaN
    makes a max NaN; False also when a shape or type makes it unsure."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # the sum's own overflow: no warning, the full check
            return bool(xp.isfinite(xp.sum(raw))) and (s is raw or bool(xp.max(s) < math.inf))
    except (TypeError, ValueError, RuntimeError):  # an empty block, a type without max: the full check
        return False


def check_scores(problem: Problem, xp: Any, raw: Any, s: Any, keep: Any, offset: tuple[int, int] = (0, 0)) -> None:
    """Raise a one-line InputError when a score that takes part is not finite: the inputs
    overflowed the dtype (e.g. float32 entries of 1e30, whose products reach 1e60), and no
    softmax of such a row means anything. ``raw``: the (scaled) scores, which must be finite
    where ``keep`` is True; ``s``: after masking, where only -inf (a masked key) may appear;
    ``offset``: the (query, key) index of their first score (a block of the blocked path)."""
    if _all_fine(xp, raw, s):  # the common case in three reductions, not six passes over the block
        _check_fill(problem, xp, s, keep, offset)
        return
    bad = xp.isnan(s) | (xp.isinf(s) & (s > 0))
    raw_bad = ~xp.isfinite(raw)
    bad = bad | (raw_bad if keep is None else raw_bad & keep)
    if not bool(xp.any(bad)):
        _check_fill(problem, xp, s, keep, offset)
        return
    bad_np = to_numpy(bad)
    idx = tuple(int(i) for i in np.argwhere(bad_np)[0])
    raw_np, s_np, raw_bad_np = (np.broadcast_to(to_numpy(a), bad_np.shape) for a in (raw, s, raw_bad))
    *b, i, j = idx
    where = f"query {i + offset[0]}, key {j + offset[1]}" + (f" (batch {', '.join(map(str, b))})" if b else "")
    dtype = problem.dtype
    hint = "use --dtype float64 or rescale the inputs" if dtype != "float64" else "rescale the inputs"
    given = _overflow_options(problem)  # an option that took part may be what overflows, not the inputs
    score = float(raw_np[idx]) if bool(raw_bad_np[idx]) else float(s_np[idx])
    rope_gain = next((g[1] for g in given if g[0] == "rope_scaling"), 1.0)  # q, k here are rotated, scaled
    largest = problem.largest_input() / rope_gain  # by the rope scaling's attention factor: undone
    with np.errstate(over="ignore", invalid="ignore"):
        bound = 2 * np.float64(largest) * np.float64(largest) * problem.d_qk  # |q·k| (rotated or not) at most this
    lost = not math.isfinite(largest)  # the inputs are finite (Problem.build): an option's stage on q, k made them not
    if given and (lost or bool(bound < np.finfo(np.dtype(dtype)).max / 2)):  # Q·K alone stays finite: an option is
        _, _, origin, said, fix = given[0]  # the culprit, the one that multiplies the scores most
        though = "q or k stopped being finite before the scores" if lost else \
            f"the inputs' largest |value| is {largest:.3g}"
        raise InputError(f"{said} makes the scores overflow {dtype} at {where}: the score is {score} though "
                         f"{though}; give {fix}", origin)
    words = [f"{g[2]} {g[3]}" if g[2].startswith("--") and g[0] != "alibi_slopes" else f"{g[2]}: {g[3]}" for g in given]
    hint = f"check {' and '.join(words)}, or {hint}" if given else hint
    raise InputError(f"scores overflow {dtype} at {where}: the score is {score} (largest |input| {largest:.3g}); "
                     f"{hint}", problem.where("q"))


def _overflow_options(problem: Problem) -> list[tuple[str, float, str, str, str]]:
    """The options that multiply (or shift) the scores, largest effect first: (the option, its gain, where it came
    from, its value in words, what to give instead). --scale s: |s|; --temperature T: 1/|T|; ALiBi slopes: the largest |slope|
    times the keys; rope scaling: its attention factor (or mscale), which multiplies cos and sin of q and k."""
    o = problem.options
    found: list[tuple[str, float, str, str, str]] = []
    with np.errstate(over="ignore", divide="ignore"):
        if o.scale is not None:
            origin = problem.origin("scale")
            found.append(("scale", abs(o.scale), origin, f"{o.scale:g}",
                          "a smaller --scale" if origin.startswith("--") else "a smaller scale there"))
        if o.temperature is not None:
            found.append(("temperature", float(np.float64(1.0) / abs(o.temperature)), problem.origin("temperature"),
                          f"{o.temperature:g}", "a larger --temperature"))
        if problem.alibi_slopes is not None:
            top = float(np.abs(problem.alibi_slopes).max())
            where = problem.where("alibi_slopes")
            found.append(("alibi_slopes", top * problem.n, "--alibi-slopes" if where == "input" else where,
                          f"--alibi-slopes (largest |slope| {top:g})", "smaller slopes"))
        sc = o.rope_scaling or {}
        gains = [abs(float(sc[k])) for k in ("attention_factor", "mscale", "mscale_all_dim")
                 if isinstance(sc.get(k), (int, float)) and not isinstance(sc.get(k), bool)]
        if o.rope is not None and gains and max(gains) > 1:
            found.append(("rope_scaling", max(gains), problem.origin("rope_scaling"),
                          f"rope scaling with attention factor {max(gains):g}", "a smaller attention factor"))
        if o.tuning_scale is not None:  # q_i times log1p(floor((P + i + 1) / F)) · a + 1, in float32 as HF
            with np.errstate(invalid="ignore"):
                f = tuning_factors(problem.query_offset + np.arange(problem.m), o.tuning_scale, o.tuning_floor)
            top = float(np.abs(f).max()) if bool(np.isfinite(f).all()) else math.inf
            if top > 1:
                found.append(("tuning_scale", top, problem.origin("tuning_scale"),
                              f"{o.tuning_scale:g} (with --tuning-floor {o.tuning_floor:g})",
                              "a smaller --tuning-scale or a larger --tuning-floor"))
        if o.softcap is not None and o.softcap > float(np.finfo(np.dtype(problem.dtype)).max):  # c itself is inf there
            found.append(("softcap", math.inf, problem.origin("softcap"), f"{o.softcap:g}",
                          f"a --softcap below {float(np.finfo(np.dtype(problem.dtype)).max):.3g} (or --dtype float64)"))
    return sorted(found, key=lambda f: -f[1])


def _check_fill(problem: Problem, xp: Any, s: Any, keep: Any, offset: tuple[int, int]) -> None:
    """A finite --mask-value must be below every kept score of a row that masks a key, or the masked
    keys outweigh it (1e308 with --causal made them win). Checked over the scores at hand (on the
    blocked path: this block of keys)."""
    fill = problem.options.mask_value
    if fill is None or math.isinf(fill) or keep is None:
        return
    masks_some = xp.any(~keep, axis=-1, keepdims=True)  # (..., m, 1)
    low = keep & (s <= fill) & masks_some  # (..., m, n)
    if not bool(xp.any(low)):
        return
    low_np = to_numpy(xp.broadcast_to(low, s.shape) if hasattr(xp, "broadcast_to") else low)
    idx = tuple(int(i) for i in np.argwhere(low_np)[0])
    *b, i, j = idx
    where = f"query {i + offset[0]}, key {j + offset[1]}" + (f" (batch {', '.join(map(str, b))})" if b else "")
    score = float(np.broadcast_to(to_numpy(s), low_np.shape)[idx])
    raise InputError(f"mask value {fill:g} is not below every score: the kept score at {where} is {score:.6g}, so "
                     "masked keys would outweigh it; give a lower --mask-value or leave the default -inf", "--mask-value")


# ---- 7) select ---------------------------------------------------------------------------------


def hard(xp: Any, w: Any) -> Any:
    """Hard attention: 1 at each row's argmax (the first one on ties), 0 elsewhere; zero rows stay zero."""
    n = int(w.shape[-1])
    top = xp.argmax(w, axis=-1, keepdims=True)  # (..., m, 1), the first maximum
    one = xp.astype(xp.arange(n, device=_device(w)) == top, w.dtype)  # (n,) vs (..., m, 1) -> (..., m, n)
    alive = xp.any(w > 0, axis=-1, keepdims=True)  # (..., m, 1): fully masked rows stay zero
    return xp.where(alive, one, xp.zeros_like(one))


def dropout(be: Backend, w: Any, p: float, seed: int | None) -> Any:
    """Inverted dropout as ``nn.Dropout(p)`` in training: keep with probability 1-p, scale kept by 1/(1-p).

    keep = numpy.random.default_rng(seed).random(w.shape) >= p, drawn on the host, so numpy
    and torch drop the same weights.
    """
    keep = be.asbool(seeded_rng(seed).random(tuple(int(x) for x in w.shape)) >= p)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return be.xp.where(keep, w * scale, be.xp.zeros_like(w))


# ---- 8) sum --------------------------------------------------------------------------------------


def weighted_sum(w: Any, v: Any) -> Any:
    """output = weights · V. (..., m, n) x (..., n, d_v) -> (..., m, d_v)"""
    return w @ v


def _device(a: Any) -> Any:
    from array_api_compat import device

    return device(a)
