"""Self-attention and multi-head attention: project, split into heads, attend, concatenate.

    Q = X W_q + b_q      K = Y W_k + b_k      V = Z W_v + b_v      (Y = Z = X for self-attention)
    Q, K, V split into H heads of width d_k/H (d_v/H for V): (B, T, d_k) -> (B, H, T, d_k/H)
    head_h = attention(Q_h, K_h, V_h)      the engine, once, over the (B, H) batch axes
    concat = [head_0 | head_1 | ... | head_{H-1}]                     (B, T, d_v)
    output = concat W_o + b_o                                          (B, T, d_out)

Weights use the textbook convention ``Q = X @ W_q`` (``W_q`` has shape ``(d_model, d_k)``).
PyTorch state dicts of ``nn.MultiheadAttention`` and of modules with ``nn.Linear`` layers
named ``W_q, W_k, W_v, W_o`` (d2l) or ``q, k, v`` (the notes) are recognised and converted
(transposed); ``WEIGHT_FORMATS`` is the registry of what is recognised.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attncli.arrays import mask_array, numeric_array
from attncli.backend import Backend, get_backend, to_numpy
from attncli.errors import InputError
from attncli.options import Options
from attncli.problem import Problem
from attncli.trace import FEATURES, KEYS, QUERIES, Step, Trace
from attncli.weights import linear_init, seeded_rng

PROJECTIONS = ("W_q", "W_k", "W_v", "W_o")
BIASES = ("b_q", "b_k", "b_v", "b_o")
INITS = ("mha", "linear")
# steps computed per head, with the head axis third from the end: (B, H, rows, cols)
PER_HEAD = ("scores", "scaled", "masked", "weights", "hard", "dropout", "head_output")
WEIGHT_AXES = ("inputs", "projected")  # rows of W are input features, columns projected features
BIAS_AXES = ("bias", "projected")


# ---- projection weights ---------------------------------------------------------------


@dataclass
class Projections:
    """W_q, W_k, W_v (and W_o, biases) in the textbook convention ``Q = X @ W_q``."""

    W_q: np.ndarray  # (d_model, d_k)
    W_k: np.ndarray  # (d_kv, d_k)
    W_v: np.ndarray  # (d_vv, d_v)
    W_o: np.ndarray | None = None  # (d_v, d_out)
    b_q: np.ndarray | None = None  # (d_k,)
    b_k: np.ndarray | None = None  # (d_k,)
    b_v: np.ndarray | None = None  # (d_v,)
    b_o: np.ndarray | None = None  # (d_out,)
    source: str = "weights"
    origin: dict[str, str] = field(default_factory=dict)  # name -> where it came from, e.g. "in_proj_weight[0:8]ᵀ"
    kind: str = "textbook"

    @property
    def d_k(self) -> int:
        return int(self.W_q.shape[1])

    @property
    def d_v(self) -> int:
        return int(self.W_v.shape[1])

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights that are present, by textbook name (what ``--save`` records)."""
        return {n: a for n in (*PROJECTIONS, *BIASES) if (a := getattr(self, n)) is not None}

    def _name(self, n: str) -> str:
        return f"{n} ({self.origin[n]})" if n in self.origin else n

    def _fail(self, message: str) -> InputError:
        return InputError(message, self.source)

    def check(self, d_q: int, d_kv: int, d_vv: int, heads: int, what: tuple[str, str, str] = ("X", "X", "X")) -> None:
        """Shapes against the inputs' widths and the number of heads; an InputError naming the weight."""
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
        if self.W_k.shape[1] != self.d_k:
            raise self._fail(f"{self._name('W_k')} has shape {self.W_k.shape} but W_q projects to d_k = {self.d_k}: "
                             f"expected ({d_kv}, {self.d_k}) so that queries and keys have the same width")
        if self.W_o is not None and self.W_o.shape[0] != self.d_v:
            raise self._fail(f"{self._name('W_o')} has shape {self.W_o.shape} but the heads concatenate to "
                             f"d_v = {self.d_v} (W_v's width): expected ({self.d_v}, d_out)")
        widths: dict[str, int | None] = {"b_q": self.d_k, "b_k": self.d_k, "b_v": self.d_v,
                  "b_o": None if self.W_o is None else int(self.W_o.shape[1])}
        for n, width in widths.items():
            b = getattr(self, n)
            if b is None:
                continue
            if width is None:
                raise self._fail(f"{self._name(n)} is given but there is no W_o to add it to")
            if b.shape != (width,):
                raise self._fail(f"{self._name(n)} has shape {b.shape}; expected ({width},) to match {'W_' + n[-1]}")
        if heads < 1:
            raise InputError(f"the number of heads must be at least 1, got {heads}", "--heads")
        for n, d in (("d_k", self.d_k), ("d_v", self.d_v)):
            if d % heads:
                raise InputError(f"{heads} heads do not divide {n} = {d} ({'W_q' if n == 'd_k' else 'W_v'} has "
                                 f"{d} columns): each head takes {n} / heads features; "
                                 f"choose a number of heads that divides {d}", "--heads")


Entries = Mapping[str, Any]
Converter = Callable[[Entries, str, str], dict[str, Any]]  # (entries, prefix, source) -> {name: array}


@dataclass(frozen=True)
class WeightFormat:
    name: str
    marker: str  # the key (after a module prefix) that identifies this format
    convert: Converter
    description: str


WEIGHT_FORMATS: dict[str, WeightFormat] = {}


def weight_format(name: str, marker: str, description: str) -> Callable[[Converter], Converter]:
    """Register a way of naming projection weights, recognised by its ``marker`` key."""

    def deco(fn: Converter) -> Converter:
        WEIGHT_FORMATS[name] = WeightFormat(name, marker, fn, description)
        return fn

    return deco


def _get(entries: Entries, key: str, source: str, why: str) -> np.ndarray:
    if key not in entries:
        raise InputError(f"has {why} but no {key!r}: a state dict with this layout needs it "
                         f"(it has {', '.join(map(str, entries))})", source)
    return numeric_array(entries[key], key, source)


def _opt(entries: Entries, key: str, source: str) -> np.ndarray | None:
    return None if key not in entries else numeric_array(entries[key], key, source)


def _t(a: np.ndarray | None) -> np.ndarray | None:
    """An ``nn.Linear`` weight (out, in) in the textbook convention (in, out)."""
    return None if a is None else (a.T if a.ndim == 2 else a)


@weight_format("textbook", "W_q", "W_q, W_k, W_v (and W_o, b_q, b_k, b_v, b_o) with Q = X @ W_q")
def _textbook(e: Entries, p: str, source: str) -> dict[str, Any]:
    out: dict[str, Any] = {n: _get(e, p + n, source, "W_q") for n in ("W_q", "W_k", "W_v")}
    out.update({n: _opt(e, p + n, source) for n in ("W_o", *BIASES)})
    return out


def _linear_layers(e: Entries, p: str, source: str, names: tuple[str, str, str, str], kind: str) -> dict[str, Any]:
    q, k, v, o = names
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for t, layer in zip(PROJECTIONS, names):
        key = f"{p}{layer}.weight"
        w = _get(e, key, source, f"{p}{q}.weight ({kind})") if layer != o else _opt(e, key, source)
        out[t] = _t(w)
        origin[t] = f"{key}ᵀ"
        b = _opt(e, f"{p}{layer}.bias", source)
        out["b_" + t[-1]] = b
        if b is not None:
            origin["b_" + t[-1]] = f"{p}{layer}.bias"
    out["origin"] = origin
    return out


@weight_format("d2l", "W_q.weight", "nn.Linear layers W_q, W_k, W_v, W_o (d2l's MultiHeadAttention)")
def _d2l(e: Entries, p: str, source: str) -> dict[str, Any]:
    return _linear_layers(e, p, source, ("W_q", "W_k", "W_v", "W_o"), "nn.Linear layers W_q, W_k, W_v")


@weight_format("notes", "q.weight", "nn.Linear layers q, k, v (and o), as in the notes' MultiheadAttention")
def _notes(e: Entries, p: str, source: str) -> dict[str, Any]:
    return _linear_layers(e, p, source, ("q", "k", "v", "o"), "nn.Linear layers q, k, v")


def _mha_rest(e: Entries, p: str, source: str, out: dict[str, Any], origin: dict[str, str], widths: list[int]) -> dict[str, Any]:
    for extra in ("bias_k", "bias_v"):
        if p + extra in e:
            raise InputError(f"holds {p + extra}: nn.MultiheadAttention(add_bias_kv=True) is not supported", source)
    bias = _opt(e, p + "in_proj_bias", source)
    if bias is not None:
        if bias.shape != (sum(widths),):
            raise InputError(f"{p}in_proj_bias has shape {bias.shape}; expected ({sum(widths)},) "
                             "(the q, k, v biases one after the other)", source)
        start = 0
        for n, w in zip(("b_q", "b_k", "b_v"), widths):
            out[n], origin[n] = bias[start:start + w], f"{p}in_proj_bias[{start}:{start + w}]"
            start += w
    out["W_o"] = _t(_get(e, p + "out_proj.weight", source, "nn.MultiheadAttention weights"))
    origin["W_o"] = f"{p}out_proj.weightᵀ"
    out["b_o"] = _opt(e, p + "out_proj.bias", source)
    out["origin"] = origin
    return out


@weight_format("mha", "in_proj_weight", "nn.MultiheadAttention: in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias")
def _mha_packed(e: Entries, p: str, source: str) -> dict[str, Any]:
    w = numeric_array(e[p + "in_proj_weight"], "in_proj_weight", source)
    if w.ndim != 2 or w.shape[0] % 3:
        raise InputError(f"{p}in_proj_weight has shape {w.shape}; expected (3·E, E) "
                         "(the q, k and v projections stacked)", source)
    d = w.shape[0] // 3
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for i, n in enumerate(("W_q", "W_k", "W_v")):
        out[n], origin[n] = w[i * d:(i + 1) * d].T, f"{p}in_proj_weight[{i * d}:{(i + 1) * d}]ᵀ"
    return _mha_rest(e, p, source, out, origin, [d, d, d])


@weight_format("mha-kdim", "q_proj_weight",
               "nn.MultiheadAttention with kdim/vdim: q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, out_proj")
def _mha_separate(e: Entries, p: str, source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for n, key in (("W_q", "q_proj_weight"), ("W_k", "k_proj_weight"), ("W_v", "v_proj_weight")):
        out[n], origin[n] = _t(_get(e, p + key, source, "q_proj_weight (nn.MultiheadAttention with kdim/vdim)")), f"{p}{key}ᵀ"
    widths = [int(out[n].shape[1]) if out[n].ndim == 2 else 0 for n in ("W_q", "W_k", "W_v")]
    return _mha_rest(e, p, source, out, origin, widths)


def _flatten(content: Any, source: str) -> dict[str, Any]:
    """A weights file's entries: the mapping itself, or its ``weights:`` sub-mapping."""
    if not isinstance(content, dict):
        raise InputError("holds a single array; projection weights need named entries "
                         "(W_q, W_k, W_v, ... or a PyTorch state dict)", source)
    inner = content.get("weights")
    if isinstance(inner, dict):
        return inner
    return content


def projections_from(content: Any, source: str, prefix: str | None = None) -> Projections:
    """Projection weights from a loaded file (npz/yaml/json mapping or a state dict), converted.

    The layout is recognised by its marker key (``WEIGHT_FORMATS``), optionally under a module
    prefix (``encoder.attn.in_proj_weight``); ``prefix`` picks one when several are present.
    """
    entries = _flatten(content, source)
    found: list[tuple[str, WeightFormat]] = []
    for key in map(str, entries):
        for f in WEIGHT_FORMATS.values():
            if key == f.marker or key.endswith("." + f.marker):
                found.append((key[: len(key) - len(f.marker)], f))
    if prefix is not None:
        want = prefix if not prefix or prefix.endswith(".") else prefix + "."
        found = [(p, f) for p, f in found if p == want]
        if not found:
            raise InputError(f"has no projection weights under the prefix {prefix!r}", source)
    if not found:
        layouts = "; ".join(f"{f.description}" for f in WEIGHT_FORMATS.values())
        have = ", ".join(list(map(str, entries))[:12])
        raise InputError(f"has no projection weights (it has {have or 'nothing'}); expected one of: {layouts}", source)
    if len({p for p, _ in found}) > 1:
        raise InputError(f"holds the weights of several modules ({', '.join(sorted(p.rstrip('.') for p, _ in found))}); "
                         "choose one with --prefix", source)
    p, f = found[0]
    parts = f.convert(entries, p, source)
    origin = parts.pop("origin", {})
    arrays = {n: (None if a is None else np.asarray(a)) for n, a in parts.items()}
    for n in BIASES:  # a bias saved by --save as a (1, d) row
        b = arrays.get(n)
        if b is not None and b.ndim == 2 and b.shape[0] == 1:
            arrays[n] = b[0]
    return Projections(**arrays, source=source, origin=origin, kind=f.name)  # type: ignore[arg-type]


def xavier_init(rng: np.random.Generator, shape: tuple[int, int], fan: tuple[int, int] | None = None) -> np.ndarray:
    """Uniform on ±sqrt(6 / (fan_in + fan_out)), float64: ``nn.init.xavier_uniform_``."""
    fan_in, fan_out = fan or shape
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


def init_projections(d_q: int, d_kv: int, d_vv: int, *, d_k: int | None = None, d_v: int | None = None,
                     d_out: int | None = None, seed: int | None = None, init: str = "mha", bias: bool = True,
                     out_proj: bool = True) -> Projections:
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
    shapes = {"W_q": (d_q, d_k), "W_k": (d_kv, d_k), "W_v": (d_vv, d_v), "W_o": (d_v, d_out)}
    packed = len({d_q, d_kv, d_vv, d_k, d_v}) == 1
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
        for n, (fan_in, width) in {"b_q": (d_q, d_k), "b_k": (d_kv, d_k), "b_v": (d_vv, d_v), "b_o": (d_v, d_out)}.items():
            if n == "b_o" and not out_proj:
                continue
            w[n] = linear_init(rng, fan_in, (width,)) if init == "linear" else np.zeros(width)
    return Projections(**w, source="--seed", kind=f"init-{init}")


# ---- the computation --------------------------------------------------------------------


def _input(a: Any, title: str, source: str) -> np.ndarray:
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


def combine_masks(mask: np.ndarray | None, convention: str, kpm: np.ndarray | None) -> tuple[np.ndarray | None, str]:
    """One mask for the engine from an attn_mask (in ``convention``) and a key padding mask
    (True = ignore, as PyTorch): boolean masks are and-ed in the keep convention; a float
    mask stays additive, with the boolean parts as -inf (as PyTorch merges them)."""
    parts = [] if mask is None else [mask if mask.dtype != bool else (mask if convention == "keep" else ~mask)]
    if kpm is not None:
        parts.append(~kpm if kpm.dtype == bool else kpm)
    if not parts:
        return None, convention
    if all(p.dtype == bool for p in parts):
        keep = parts[0]
        for p in parts[1:]:
            keep = keep & p
        return keep, "keep"
    bias: Any = 0.0
    for p in parts:
        bias = bias + (np.where(p, 0.0, -np.inf) if p.dtype == bool else p)
    return np.asarray(bias, dtype=np.float64), convention


def multihead(x: Any, memory: Any = None, values: Any = None, *, weights: Projections, heads: int = 1,
              valid_lens: Any = None, key_padding_mask: Any = None, mask: Any = None,
              query_labels: list[str] | None = None, key_labels: list[str] | None = None,
              options: Options | None = None, sources: dict[str, str] | None = None,
              batch_first: bool = True, backend: Backend | None = None,
              corners: tuple[Callable[[int], list[int]], int] | None = None) -> Trace:
    """Multi-head attention of X over memory Y (values Z; both default to X), step by step.

    Inputs are (B, T, D) or unbatched (T, D) (``batch_first=False``: (T, B, D), as PyTorch's
    default layout; the steps are batch-first). The per-head steps have shape (B, H, T, S).
    ``corners=(rows_of, limit)``: when the per-head weights (B·H·T·S) would be more than ``limit``,
    the output-only path, and the per-head steps up to the weights for the queries ``rows_of(T)``
    only (engine.corner_rows: the view of a big problem).
    """
    o = options or Options()
    src = {"x": "X", "memory": "memory", "values": "values", **(sources or {})}
    self_attention = memory is None and values is None
    X = _input(x, "X", src["x"])
    Y = X if memory is None else _input(memory, "memory", src["memory"])
    Z = Y if values is None else _input(values, "values", src["values"])
    batched = X.ndim == 3
    for name, a in (("memory", Y), ("values", Z)):
        if a.ndim != X.ndim:
            raise InputError(f"{name} has shape {a.shape} but X has shape {X.shape}: both batched (B, T, D) or both not",
                             src[name])
    if batched and not batch_first:
        X, Y, Z = (np.swapaxes(a, 0, 1) for a in (X, Y, Z))  # (T, B, D) -> (B, T, D)
    if not batched:
        X, Y, Z = X[None], Y[None], Z[None]  # (T, D) -> (1, T, D)
    B, T, S = X.shape[0], X.shape[1], Y.shape[1]
    for name, a in (("memory", Y), ("values", Z)):
        if a.shape[0] != B:
            raise InputError(f"{name} has batch size {a.shape[0]} but X has {B}", src[name])
    if Z.shape[1] != S:
        raise InputError(f"values have {Z.shape[1]} rows but memory has {S}: each key needs one value row", src["values"])
    what = ("X", "X" if memory is None else "memory", "X" if self_attention else ("memory" if values is None else "values"))
    weights.check(X.shape[2], Y.shape[2], Z.shape[2], heads, what)
    H, dk, dv = heads, weights.d_k, weights.d_v

    every = [X, Y, Z, *weights.arrays().values()]
    dt = o.dtype or ("float32" if all(a.dtype == np.float32 for a in every) else "float64")
    be = backend or get_backend(o.backend, o.device)
    xp = be.xp
    w = {n: be.asarray(a, dt) for n, a in weights.arrays().items()}
    Xb, Yb, Zb = (be.asarray(a, dt) for a in (X, Y, Z))

    # 1) project
    q = Xb @ w["W_q"]  # (B, T, D) x (D, d_k) -> (B, T, d_k)
    k = Yb @ w["W_k"]  # (B, S, D_k) x (D_k, d_k) -> (B, S, d_k)
    v = Zb @ w["W_v"]  # (B, S, D_v) x (D_v, d_v) -> (B, S, d_v)
    q, k, v = (a + w[b] if b in w else a for a, b in ((q, "b_q"), (k, "b_k"), (v, "b_v")))

    # 2) split into heads: (B, T, d) -> (B, T, H, d/H) -> (B, H, T, d/H)
    def split(a: Any, n: int, d: int) -> Any:
        return xp.permute_dims(xp.reshape(a, (B, n, H, d // H)), (0, 2, 1, 3))

    qh, kh, vh = split(q, T, dk), split(k, S, dk), split(v, S, dv)

    # 3) attend: the engine, once, over the batch axes (B, H)
    vl = valid_lens
    if vl is not None and not batched:
        vl_arr = np.asarray(vl)
        if vl_arr.ndim == 1 and vl_arr.shape[0] == T and T > 1:
            vl = vl_arr[None]  # one length per query of the single sequence
    combined, convention = combine_masks(
        None if mask is None else head_mask(mask_array(mask, "mask", src.get("mask", "mask")), B, H,
                                            src.get("mask", "mask")),
        o.mask_convention, None if key_padding_mask is None else _padding(key_padding_mask, B, S, batched,
                                                                          src.get("key_padding_mask", "key padding mask")))
    big = corners is not None and o.keep_weights and B * H * T * S > corners[1]
    inner_opts = replace(o, dtype=dt, mask_convention=convention, keep_weights=o.keep_weights and not big)
    psrc: dict[str, str] = {"q": src["x"], "k": src["memory" if memory is not None else "x"],
            "v": src["values" if values is not None else ("memory" if memory is not None else "x")],
            "valid_lens": src.get("valid_lens", "valid lengths"), "mask": src.get("mask", "mask"),
            **{n: src[n] for n in ("query_labels", "key_labels") if n in src}}
    problem = Problem.build(to_numpy(qh), to_numpy(kh), to_numpy(vh), valid_lens=vl, mask=combined,
                            query_labels=query_labels, key_labels=key_labels, options=inner_opts, sources=psrc)
    from attncli.engine import run

    inner = run(problem, be)
    if big:
        from attncli.engine import corner_rows

        assert corners is not None
        corner_rows(problem, inner, corners[0](T), corners[1])
    heads_out = inner.step("output").values  # (B, H, T, d_v/H)

    # 4) concatenate the heads in order: (B, H, T, d_v/H) -> (B, T, H, d_v/H) -> (B, T, d_v)
    concat = xp.reshape(xp.permute_dims(heads_out, (0, 2, 1, 3)), (B, T, dv))

    # 5) output projection
    out = concat
    if "W_o" in w:
        out = concat @ w["W_o"]  # (B, T, d_v) x (d_v, d_out) -> (B, T, d_out)
        if "b_o" in w:
            out = out + w["b_o"]
    avg = xp.mean(inner.step("weights").values, axis=1) if "weights" in inner else None  # (B, H, T, S) -> (B, T, S)
    shapes: dict[str, list[int]] = {"x": list(np.shape(x))}
    shapes.update({n: list(np.shape(a)) for n, a in (("memory", memory), ("values", values)) if a is not None})

    return _trace(inner, weights, w, arrays=dict(X=Xb, Y=Yb, Z=Zb, q=q, k=k, v=v, concat=concat, out=out, avg=avg),
                  heads=H, batched=batched, self_attention=self_attention, memory=memory is not None,
                  values=values is not None, shapes=shapes)


def _padding(kpm: Any, batch: int, keys: int, batched: bool, source: str) -> np.ndarray:
    """A key padding mask (B, S) (or (S,) unbatched), True = ignore, as (B, 1, 1, S)."""
    m = mask_array(kpm, "key padding mask", source)
    want = (batch, keys) if batched else (keys,)
    if m.shape != want:
        raise InputError(f"key padding mask has shape {m.shape}; expected {want} (batch, keys), True = ignore that key",
                         source)
    return m.reshape(batch, 1, 1, keys)


def _trace(inner: Trace, proj: Projections, w: dict[str, Any], arrays: dict[str, Any], *, heads: int, batched: bool,
           self_attention: bool, memory: bool, values: bool, shapes: dict[str, list[int]]) -> Trace:
    """The whole computation as one Trace: inputs, weights, projections, the engine's per-head
    steps, the concatenation, the output projection and the head-averaged weights."""
    L = arrays

    def lead(a: Any) -> Any:  # drop the batch axis added to an unbatched input
        return a if batched else a[0]

    where = r"(batch \1, head \2)" if batched else r"(head \2)"  # the engine's batch axes are (batch, head)
    warnings = [re.sub(r"\(batch (\d+), (\d+)\)", where, w) for w in inner.warnings]
    t = Trace(query_labels=inner.query_labels, key_labels=inner.key_labels, warnings=warnings,
              meta=dict(inner.meta), extra=dict(inner.extra),
              inputs={f"score_{n}": a for n, a in inner.inputs.items() if n not in ("q", "k", "v")})  # score weights
    H = heads
    dk, dv = proj.d_k, proj.d_v
    t.meta.update(heads=H, head_width={"q": dk // H, "k": dk // H, "v": dv // H}, shapes=shapes,
                  self_attention=self_attention, batched=batched, weights_format=proj.kind, weights_source=proj.source,
                  batch_axes=["batch", "head"] if batched else ["head"],  # leading axes of the per-head steps
                  per_head_steps=[s.name if s.name != "output" else "head_output" for s in inner.steps],
                  head_axis=1 if batched else 0)
    y_name = "Y" if memory else "X"
    z_name = "Z" if values else y_name
    t.add("x", f"X: the input, {'(B, T, d_model)' if batched else '(T, d_model)'}", lead(L["X"]), (QUERIES, FEATURES))
    if memory:
        t.add("memory", "Y: the memory that keys (and values) are projected from", lead(L["Y"]), (KEYS, FEATURES))
    if values:
        t.add("values", "Z: the input values are projected from", lead(L["Z"]), (KEYS, FEATURES))

    def weight(n: str) -> None:
        if n in w:
            where = f" (from {proj.origin[n]})" if n in proj.origin else ""
            if n.startswith("W"):
                t.add(n, f"{n}{where}, textbook convention (in, out)", w[n], WEIGHT_AXES)
            else:
                t.add(n, f"{n}{where}, added to every row", w[n][None, :], BIAS_AXES)

    for n in ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v"):
        weight(n)

    def plus(b: str) -> str:
        return f" + {b}" if b in w else ""

    t.add("q", f"Q = X · W_q{plus('b_q')}", lead(L["q"]), (QUERIES, FEATURES))
    t.add("k", f"K = {y_name} · W_k{plus('b_k')}", lead(L["k"]), (KEYS, FEATURES))
    t.add("v", f"V = {z_name} · W_v{plus('b_v')}", lead(L["v"]), (KEYS, FEATURES))
    split = _split_note(H, dk // H, dv // H)
    for s in inner.steps:
        name = "head_output" if s.name == "output" else s.name
        formula = s.formula.replace("output =", "head_h =", 1) if s.name == "output" else s.formula
        notes = [*s.notes, split] if s.name == "scores" else list(s.notes)
        t.steps.append(Step(name, f"{formula}  (each head h)", lead(s.values), s.axes, notes, s.rows))
    has_o = "W_o" in w
    t.add("concat" if has_o else "output", f"{'concat' if has_o else 'output'} = concat(head_0, …, head_{H - 1}): "
          "the heads side by side, in order", lead(L["concat"]), (QUERIES, FEATURES))
    weight("W_o")
    weight("b_o")
    if has_o:
        t.add("output", f"output = concat · W_o{plus('b_o')}", lead(L["out"]), (QUERIES, FEATURES))
    if L["avg"] is not None:
        t.add("avg_weights", "avg_weights = mean of the heads' weights (as nn.MultiheadAttention returns them)",
              lead(L["avg"]), (QUERIES, KEYS))
        t.steps[-1].rows = inner.step("weights").rows
    return t


def _split_note(H: int, dh: int, dvh: int) -> str:
    """Which features of Q, K (and V) each head takes, e.g. 'head 0: d0…d3, head 1: d4…d7'."""
    def span(h: int, d: int) -> str:
        return f"d{h * d}" if d == 1 else f"d{h * d}…d{(h + 1) * d - 1}"

    shown = ", ".join(f"head {h}: {span(h, dh)}" + (f" (V {span(h, dvh)})" if dvh != dh else "") for h in range(min(H, 8)))
    return f"each head takes its own {dh} feature(s) of Q and K: {shown}{', …' if H > 8 else ''}"


def select_head(trace: Trace, head: int) -> Trace:
    """A view of ``trace`` with only head ``head`` of the per-head steps (for the terminal)."""
    H = int(trace.meta.get("heads", 1))
    if not 0 <= head < H:
        raise InputError(f"head {head} does not exist: there are {H} heads (0 to {H - 1})", "--head")
    per_head = set(trace.meta.get("per_head_steps", PER_HEAD))
    axis = int(trace.meta.get("head_axis", 0))
    steps = [Step(s.name, f"head {head}: " + s.formula.replace("  (each head h)", "").replace("head_h", f"head_{head}"),
                  s.values[(slice(None),) * axis + (head,)], s.axes, s.notes, s.rows)
             if s.name in per_head else s for s in trace.steps]
    meta = {**trace.meta, "head": head, "batch_axes": ["batch"] if trace.meta.get("batched") else []}
    return Trace(steps=steps, query_labels=trace.query_labels, key_labels=trace.key_labels,
                 warnings=trace.warnings, meta=meta, inputs=trace.inputs, extra=trace.extra)
