"""The projection weights of self- and multi-head attention, read from files or drawn from a seed.

    Q = X W_q + b_q      K = Y W_k + b_k      V = Z W_v + b_v      (Y = Z = X for self-attention)
    output = concat(head_0, ..., head_{H-1}) W_o + b_o

The computation itself is the one pipeline (attncli.core.engine). Weights use the textbook
convention ``Q = X @ W_q`` (``W_q`` has shape ``(d_model, d_k)``). Reading them from a weights
file or a checkpoint (``nn.MultiheadAttention``, d2l's and the notes' ``nn.Linear`` layers, ...) is
the io layer's: attncli.io.layouts.LAYOUTS is the one registry of weight layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attncli.core.arrays import mask_array, numeric_array
from attncli.core.heads import check_kv_heads
from attncli.core.weights import linear_init, seeded_rng
from attncli.errors import InputError

PROJECTIONS = ("W_q", "W_k", "W_v", "W_o")
BIASES = ("b_q", "b_k", "b_v", "b_o")
# QK-norm weights (d,), (H, d) or (H·d,) and LayerNorm biases, and sinks (H,), beside the projections
EXTRAS = ("q_norm", "k_norm", "q_norm_bias", "k_norm_bias", "sinks")
LATENT = ("W_qa", "b_qa", "W_kva", "b_kva")  # multi-head latent attention's first matrices (Latent)
INITS = ("mha", "linear")


# ---- projection weights ---------------------------------------------------------------


@dataclass
class Projections:
    """W_q, W_k, W_v (and W_o, biases) in the textbook convention ``Q = X @ W_q``."""

    W_q: np.ndarray  # (d_model, d_k)
    W_k: np.ndarray  # (d_kv, d_k), or (d_kv, G·d_k/H) with G K/V heads (grouped-query)
    W_v: np.ndarray  # (d_vv, d_v), or (d_vv, G·d_v/H)
    W_o: np.ndarray | None = None  # (d_v, d_out)
    b_q: np.ndarray | None = None  # (d_k,)
    b_k: np.ndarray | None = None  # (d_k,)
    b_v: np.ndarray | None = None  # (d_v,)
    b_o: np.ndarray | None = None  # (d_out,)
    q_norm: np.ndarray | None = None  # QK-norm weights: (d_head,) (Qwen3, Gemma 3), (H, d_head) per head
    k_norm: np.ndarray | None = None  # (StableLM, Cohere) or (H·d_head,) over the full width (OLMo 2)
    q_norm_bias: np.ndarray | None = None  # LayerNorm QK-norm biases, shaped as the weights
    k_norm_bias: np.ndarray | None = None
    sinks: np.ndarray | None = None  # (H,) one logit per query head (gpt-oss)
    latent: Latent | None = None  # DeepSeek's MLA: Q, K, V from low-rank latents (then W_q, W_k, W_v read them)
    source: str = "weights"
    origin: dict[str, str] = field(default_factory=dict)  # name -> where it came from, e.g. "in_proj_weight[0:8]ᵀ"
    kind: str = "textbook"
    config: dict[str, Any] = field(default_factory=dict)  # what a checkpoint's config.json said (heads, rope, ...)

    @property
    def d_k(self) -> int:
        return int(self.W_q.shape[1])

    @property
    def d_v(self) -> int:
        """The width of the heads' outputs side by side: H · (W_v's width per K/V head)."""
        return int(self.W_v.shape[1]) * self._rep

    _rep: int = field(default=1, repr=False)  # query heads per K/V head, set by check()

    def extras(self) -> dict[str, np.ndarray]:
        """QK-norm weights and sinks, when the weights hold them."""
        return {n: a for n in EXTRAS if (a := getattr(self, n)) is not None}

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights that are present, by textbook name (what ``--save`` records)."""
        out = {n: a for n in (*PROJECTIONS, *BIASES) if (a := getattr(self, n)) is not None}
        if self.latent is not None:
            out |= {n: a for n in LATENT if (a := getattr(self.latent, n)) is not None}
        return out

    def _name(self, n: str) -> str:
        return f"{n} ({self.origin[n]})" if n in self.origin else n

    def _fail(self, message: str) -> InputError:
        return InputError(message, self.source)

    def check(self, d_q: int, d_kv: int, d_vv: int, heads: int, what: tuple[str, str, str] = ("X", "X", "X"),
              kv_heads: int | None = None) -> int:
        """Shapes against the inputs' widths and the number of heads (``kv_heads`` K/V heads: None, as W_k's
        width says); an InputError naming the weight. Returns the number of K/V heads."""
        if self.latent is not None:
            return self._check_latent(d_q, heads, kv_heads)
        for n in PROJECTIONS:
            a = getattr(self, n)
            if a is not None and a.ndim != 2:
                raise self._fail(f"{self._name(n)} has shape {a.shape}; expected a matrix (in, out), as in Q = X @ W_q")
        wanted = (("W_q", d_q, what[0]), ("W_k", d_kv, what[1]), ("W_v", d_vv, what[2]))
        for n, d, x in wanted:
            a = getattr(self, n)
            if a.shape[0] != d:
                raise self._fail(f"{self._name(n)} has shape {a.shape} but {x} has width {d}: expected ({d}, ...), "
                                 f"as in {n[-1].upper()} = {x} @ {n} (a PyTorch weight must be transposed)")
        if heads < 1:
            raise InputError(f"the number of heads must be at least 1, got {heads}", "--heads")
        if self.d_k % heads:
            raise InputError(f"{heads} heads do not divide d_k = {self.d_k} (W_q has {self.d_k} columns): each head "
                             f"takes d_k / heads features; choose a number of heads that divides {self.d_k}", "--heads")
        dh, kw = self.d_k // heads, int(self.W_k.shape[1])
        if kv_heads is None:  # as many as W_k's width holds heads of Q's width
            kv_heads = kw // dh if kw % dh == 0 and kw // dh >= 1 and heads % (kw // dh) == 0 else heads
        rep = check_kv_heads(heads, kv_heads)
        if kw != kv_heads * dh:
            raise self._fail(f"{self._name('W_k')} has shape {self.W_k.shape} but W_q projects to d_k = {self.d_k}: "
                             f"expected ({d_kv}, {kv_heads * dh}) ({kv_heads} K/V head(s) of width {dh}) so that "
                             "queries and keys have the same width per head")
        if int(self.W_v.shape[1]) % kv_heads:
            raise self._fail(f"{self._name('W_v')} has shape {self.W_v.shape}: its {self.W_v.shape[1]} columns do not "
                             f"split into {kv_heads} K/V heads")
        object.__setattr__(self, "_rep", rep)
        if self.W_o is not None and self.W_o.shape[0] != self.d_v:
            raise self._fail(f"{self._name('W_o')} has shape {self.W_o.shape} but the heads concatenate to "
                             f"d_v = {self.d_v} (W_v's width): expected ({self.d_v}, d_out)")
        widths: dict[str, int | None] = {"b_q": self.d_k, "b_k": kw, "b_v": int(self.W_v.shape[1]),
                  "b_o": None if self.W_o is None else int(self.W_o.shape[1])}
        for n, width in widths.items():
            b = getattr(self, n)
            if b is None:
                continue
            if width is None:
                raise self._fail(f"{self._name(n)} is given but there is no W_o to add it to")
            if b.shape != (width,):
                raise self._fail(f"{self._name(n)} has shape {b.shape}; expected ({width},) to match {'W_' + n[-1]}")
        if self.d_v % heads:
            raise InputError(f"{heads} heads do not divide d_v = {self.d_v} (W_v has {self.W_v.shape[1]} columns): "
                             f"each head takes d_v / heads features; choose a number of heads that divides {self.d_v}",
                             "--heads")
        return kv_heads


    def _check_latent(self, d: int, heads: int, kv_heads: int | None) -> int:
        """MLA's shapes (attncli.core.projections.Latent): every head has its own K and V, so H K/V heads."""
        L = self.latent
        assert L is not None
        if kv_heads is not None and kv_heads != heads:
            raise InputError(f"multi-head latent attention has one K and V per query head ({heads}), not {kv_heads}",
                             "--kv-heads")
        if heads < 1 or self.d_k % heads or int(self.W_v.shape[1]) % heads:
            raise InputError(f"{heads} heads do not divide W_q's {self.d_k} or W_v's {self.W_v.shape[1]} columns",
                             "--heads")
        r_kv, dq, dn = int(L.kv_a_norm.shape[0]), self.d_k // heads, L.d_nope
        wanted: dict[str, tuple[np.ndarray | None, tuple[int, ...]]] = {
            "W_kva": (L.W_kva, (d, r_kv + L.d_rope)), "b_kva": (L.b_kva, (r_kv + L.d_rope,)),
            "W_k": (self.W_k, (r_kv, heads * dn)), "W_v": (self.W_v, (r_kv, int(self.W_v.shape[1])))}
        if L.W_qa is not None:
            r_q = int(L.W_qa.shape[1])
            wanted |= {"W_qa": (L.W_qa, (d, r_q)), "b_qa": (L.b_qa, (r_q,)), "W_q": (self.W_q, (r_q, self.d_k))}
            if L.q_a_norm is None or L.q_a_norm.shape != (r_q,):
                raise self._fail(f"the query latent's norm must have ({r_q},) weights, one per feature of W_qa's output")
        else:
            wanted["W_q"] = (self.W_q, (d, self.d_k))
        if L.d_rope % 2 or L.d_rope < 2:
            raise self._fail(f"the rotary part of each head has {L.d_rope} features; RoPE turns pairs, so an even number")
        if dq != L.d_nope + L.d_rope:  # the reader checked W_q against config.json: the number of heads is off
            raise InputError(f"{heads} heads give each head {dq} of W_q's {self.d_k} features; multi-head latent "
                             f"attention has {L.d_nope} + {L.d_rope} per head ({self.d_k // (L.d_nope + L.d_rope)} "
                             "heads)", "--heads")
        for n, (a, shape) in wanted.items():
            if a is not None and a.shape != shape:
                where = L.origin.get(n) or self.origin.get(n)
                raise self._fail(f"{n}{f' ({where})' if where else ''} has shape {a.shape}; expected {shape} "
                                 "(multi-head latent attention)")
        if self.W_o is not None and self.W_o.shape[0] != self.W_v.shape[1]:
            raise self._fail(f"{self._name('W_o')} has shape {self.W_o.shape} but the heads concatenate to "
                             f"{self.W_v.shape[1]} features")
        for n in ("b_q", "b_k", "b_v"):
            if getattr(self, n) is not None:
                raise self._fail(f"{n} is given, which multi-head latent attention does not have")
        if self.b_o is not None and (self.W_o is None or self.b_o.shape != (self.W_o.shape[1],)):
            raise self._fail(f"{self._name('b_o')} has shape {self.b_o.shape}; expected one per output of W_o")
        object.__setattr__(self, "_rep", 1)
        return heads


@dataclass(frozen=True)
class Latent:
    """DeepSeek's multi-head latent attention (MLA, DeepSeek-V2/V3): Q, K and V come from low-rank latents with an
    RMSNorm between the two matrices; RoPE turns d_rope features of each head, the keys' ones shared by every head.

        q_latent = X W_qa + b_qa,  q_latent_norm = w_qa · q_latent / sqrt(mean(q_latent²) + eps)
        Q = q_latent_norm W_q                   (without W_qa: Q = X W_q)     per head [q_nope | q_pe]
        kv_latent = X W_kva + b_kva = [c | k_pe],  kv_latent_norm = w_kva · c / sqrt(mean(c²) + eps)
        K_nope = kv_latent_norm W_k (H·d_nope),  V = kv_latent_norm W_v (H·d_v)
        k_h = [k_nope_h | k_pe]: k_pe (d_rope features, one for all heads) joins every head
    """

    W_kva: np.ndarray  # (E, r_kv + d_rope): kv_a_proj_with_mqa
    kv_a_norm: np.ndarray  # (r_kv,): kv_a_layernorm
    d_nope: int  # qk_nope_head_dim
    d_rope: int  # qk_rope_head_dim
    eps: float = 1e-6  # the latents' RMSNorms
    b_kva: np.ndarray | None = None  # (r_kv + d_rope,)
    W_qa: np.ndarray | None = None  # (E, r_q): q_a_proj; None: Q = X W_q
    b_qa: np.ndarray | None = None  # (r_q,)
    q_a_norm: np.ndarray | None = None  # (r_q,): q_a_layernorm
    origin: dict[str, str] = field(default_factory=dict)


def xavier_init(rng: np.random.Generator, shape: tuple[int, int], fan: tuple[int, int] | None = None) -> np.ndarray:
    """Uniform on ±sqrt(6 / (fan_in + fan_out)), float64: ``nn.init.xavier_uniform_``."""
    fan_in, fan_out = fan or shape
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


def init_projections(d_q: int, d_kv: int, d_vv: int, *, d_k: int | None = None, d_v: int | None = None,
                     d_out: int | None = None, seed: int | None = None, init: str = "mha", bias: bool = True,
                     out_proj: bool = True, heads: int = 1, kv_heads: int | None = None) -> Projections:
    """Weights drawn from ``numpy.random.default_rng(seed)`` the way PyTorch initialises them.

    ``mha`` (nn.MultiheadAttention): W_q, W_k, W_v xavier-uniform (over the stacked
    in_proj_weight (3E, E) when every width is E), biases zero, W_o as nn.Linear (uniform
    ±1/sqrt(d_v)). ``linear`` (d2l, the notes): every weight and bias as nn.Linear, uniform
    ±1/sqrt(fan_in). Drawn in the order W_q, W_k, W_v, W_o, then biases.
    """
    if init not in INITS:
        raise InputError(f"unknown initialisation {init!r}; choose one of {', '.join(INITS)}", "--init")
    d_k = d_k or d_q
    d_v = d_v or d_k
    d_out = d_out or d_q
    rng = seeded_rng(seed)
    # grouped-query (kv_heads G of H heads): K and V project to G heads of the query heads' width
    g_k, g_v = (d * kv_heads // heads if kv_heads and heads % kv_heads == 0 and d % heads == 0 else d
                for d in (d_k, d_v))
    shapes = {"W_q": (d_q, d_k), "W_k": (d_kv, g_k), "W_v": (d_vv, g_v), "W_o": (d_v, d_out)}
    packed = len({d_q, d_kv, d_vv, d_k, d_v, g_k, g_v}) == 1
    w: dict[str, Any] = {}
    for n in PROJECTIONS:
        if n == "W_o" and not out_proj:
            continue
        shape = shapes[n]
        if init == "linear" or n == "W_o":
            w[n] = linear_init(rng, shape[0], shape)
        else:
            w[n] = xavier_init(rng, shape, (d_q, 3 * d_q) if packed else shape)
    if bias:
        for n, (fan_in, width) in {"b_q": (d_q, d_k), "b_k": (d_kv, g_k), "b_v": (d_vv, g_v), "b_o": (d_v, d_out)}.items():
            if n == "b_o" and not out_proj:
                continue
            w[n] = linear_init(rng, fan_in, (width,)) if init == "linear" else np.zeros(width)
    return Projections(**w, source="--seed", kind=f"init-{init}")


@dataclass(frozen=True)
class Norm:
    """A layer's pre-attention norm (``--from-residual``): over the features of X,
    ``layernorm`` (x - mean) / sqrt(var + eps) · w + b, ``rms`` w · x / sqrt(mean(x²) + eps),
    ``rms1p`` Gemma's (1 + w) · x / sqrt(mean(x²) + eps)."""

    kind: str
    w: np.ndarray
    b: np.ndarray | None = None
    eps: float = 1e-6
    origin: str = ""

    def __post_init__(self) -> None:  # the engine computes these three; any other kind would be read as RMSNorm
        if self.kind not in NORM_KINDS:
            raise InputError(f"a norm of kind {self.kind!r} is not computed (kinds: {', '.join(NORM_KINDS)}; "
                             "LayerNorm1p is a layernorm of weight 1 + w)", self.origin or "Norm")


NORM_KINDS = ("layernorm", "rms", "rms1p")


@dataclass(frozen=True)
class Gate:
    """An output gate of the concatenated heads before W_o: ``gated = concat ⊙ act(X · W_g)``, X the attention's
    input (after its pre-norm). ``act``: sigmoid (AFMoE's gate_proj) or softplus (Laguna's g_proj); W_g (D, H·d_v):
    one gate per feature, or (D, H): one per head (its d_v features share it)."""

    act: str  # sigmoid | softplus
    w: np.ndarray  # W_g (D, n), textbook (in, out)
    origin: str = ""


GATE_ACTS = ("sigmoid", "softplus")


@dataclass(frozen=True)
class RelativeBias:
    """T5's relative position bias: ``table[bucket(j - i), h]`` added to the scores of head h
    (``relative_attention_bias.weight``, (num_buckets, H); attncli.core.chain.relative_rows)."""

    table: np.ndarray
    bidirectional: bool
    num_buckets: int
    max_distance: int
    origin: str = ""


# ---- the inputs they project --------------------------------------------------------------


def input_matrix(a: Any, title: str, source: str) -> np.ndarray:
    arr = numeric_array(a, title, source)
    if arr.ndim not in (2, 3):
        raise InputError(f"{title} has shape {arr.shape}; expected (tokens, features) or (batch, tokens, features)", source)
    if arr.size == 0:
        raise InputError(f"{title} is empty (shape {arr.shape})", source)
    return arr


def head_mask(mask: Any, batch: int, heads: int, source: str) -> np.ndarray:
    """A mask as given (T, S), (B, T, S), (B·H, T, S) (PyTorch's attn_mask) or (B, H, T, S),
    made broadcastable to the per-head scores (B, H, T, S)."""
    mk = np.asarray(mask)
    if mk.ndim == 2 or mk.ndim == 4:
        return mk
    if mk.ndim == 3:
        if mk.shape[0] == batch * heads:
            return mk.reshape(batch, heads, *mk.shape[1:])  # (B·H, T, S) -> (B, H, T, S), as PyTorch orders it
        if mk.shape[0] == batch:
            return mk[:, None]  # (B, T, S) -> (B, 1, T, S): the same for every head
    raise InputError(f"mask has shape {mk.shape}; expected (T, S), ({batch}, T, S), ({batch * heads}, T, S) "
                     f"(PyTorch's attn_mask) or ({batch}, {heads}, T, S)", source)


def padding_mask(kpm: Any, batch: int, keys: int, batched: bool, source: str) -> np.ndarray:
    """A key padding mask (B, S) (or (S,) unbatched), True = ignore, as (B, 1, 1, S)."""
    m = mask_array(kpm, "key padding mask", source)
    want = (batch, keys) if batched else (keys,)
    if m.shape != want:
        raise InputError(f"key padding mask has shape {m.shape}; expected {want} (batch, keys), True = ignore that key",
                         source)
    return m.reshape(batch, 1, 1, keys)
