"""Layer: the projections of self-, cross- and multi-head attention, the part that produces the core problem.

    x_norm = norm(X)                       (a checkpoint's pre-attention norm, --from-residual)
    Q = X W_q + b_q,  K = Y W_k + b_k,  V = Z W_v + b_v      (Y = Z = X for self-attention)
    (B, T, H·d) -> (B, H, T, d); K and V: G heads          -> Layer.problem(Q, K, V): the core Problem
    clip: q, k, v clamped to [-C, C] (OLMo clip_qkv, option clip_qkv), before the split
    output = concat(head_0, ..., head_{H-1}) W_o + b_o   (BitNet: sub_norm(concat) W_o + b_o)
    MLA (DeepSeek): Q, K, V from low-rank latents of X, an RMSNorm between the two matrices (core.projections.Latent)
    gated = concat ⊙ act(x_norm W_g)                     (AFMoE sigmoid, Laguna softplus: an output gate before W_o)

A Layer holds X, Y, Z, the projections, the heads, the pre-norm and the key padding mask, and ``spec``: the
problem of its heads (masks, lengths, labels, biases, options), validated once against the shapes the projections
produce (:meth:`attncli.core.problem.Problem.shaped`). Its fields read through the layer (``layer.mask`` is
``layer.spec.mask``); ``problem(q, k, v)`` is that spec with the computed Q, K, V. ``Layer.build`` validates it
all; the engine projects and splits (attncli.core.engine) and computes the Problem that ``problem`` returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    import numpy as np
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core.arrays import mask_array
from attncli.core.backend import half_type
from attncli.core.options import Options
from attncli.core.problem import Problem, Shared, computed_dtype
from attncli.core.projections import (
    GATE_ACTS,
    Gate,
    Norm,
    Projections,
    RelativeBias,
    head_mask,
    input_matrix,
    padding_mask,
)
from attncli.errors import InputError


@dataclass(frozen=True, init=False)
class Layer(Shared):
    """X, memory Y and values Z (held (B, T, D), batch first), the projections and heads, and the problem of its
    heads (``spec``): frozen.

    ``Layer.build`` is the one way in. ``problem(Q, K, V)`` is the core problem of its heads, Q
    (B, H, T, d) and K, V (B, G, S, d): ``spec`` with them. A field of the spec given to the constructor
    replaces the spec's, so ``dataclasses.replace(layer, options=o)`` works as on a Problem.
    """

    x: np.ndarray  # X (B, T, D); an unbatched (T, D) input held as (1, T, D)
    memory: np.ndarray  # Y (B, S, D_k), keys (and values) are projected from it; is x in self-attention
    values: np.ndarray  # Z (B, S, D_v), values are projected from it; is memory unless given
    projections: Projections  # W_q, W_k, W_v (W_o, biases): Q = X W_q + b_q, ...
    spec: Problem  # the heads' problem, validated against the shapes of Q, K, V (zeros: no memory)
    heads: int = 1
    pre_norm: Norm | None = None  # X is the residual stream: the layer's own norm comes first (--from-residual)
    sub_norm: Norm | None = None  # BitNet: an RMSNorm of the concatenated heads before W_o (attn_sub_norm)
    gate: Gate | None = None  # AFMoE / Laguna: concat ⊙ act(x_norm · W_g) before W_o
    batch_first: bool = True  # X given (B, T, D); False: (T, B, D), PyTorch's default (held (B, T, D) here all
    # the same; the output is returned (T, B, E), as nn.MultiheadAttention(batch_first=False) returns it)
    padding: np.ndarray | None = None  # key padding mask (B, 1, 1, S), True = ignore (PyTorch)

    # ---- derived ----
    kv_heads: int | None = field(init=False, default=None)  # K/V heads when fewer than the query heads, else None

    def __init__(self, x: np.ndarray, memory: np.ndarray, values: np.ndarray, projections: Projections, heads: int = 1,
                 pre_norm: Norm | None = None, sub_norm: Norm | None = None, gate: Gate | None = None,
                 batch_first: bool = True, spec: Problem | None = None, padding: np.ndarray | None = None,
                 **problem_fields: Any) -> None:
        """The fields as given; ``problem_fields`` (options=, mask=, ...) replace the spec's (the spec's derived
        facts follow). Validation is Layer.build's."""
        if spec is None:
            raise TypeError("Layer needs the spec of its heads' problem: use Layer.build")
        if problem_fields:
            spec = replace(spec, **problem_fields)
        for name, value in (("x", x), ("memory", memory), ("values", values), ("projections", projections),
                            ("heads", heads), ("pre_norm", pre_norm), ("sub_norm", sub_norm), ("gate", gate),
                            ("batch_first", batch_first), ("spec", spec), ("padding", padding)):
            object.__setattr__(self, name, value)
        H, dh = heads, projections.d_k // heads
        kv = H if projections.latent is not None else int(projections.W_k.shape[1]) // dh  # MLA: K, V per head
        object.__setattr__(self, "kv_heads", kv if kv != H else None)

    if TYPE_CHECKING:  # the heads' problem's fields, read through the layer: properties at run time (SPEC_FIELDS,
        # below); declared here for type checkers, so that dataclasses.replace(layer, options=o) type-checks too
        valid_lens: np.ndarray | None = None
        mask: np.ndarray | None = None  # broadcastable to the per-head scores (B, H, T, S)
        query_labels: list[str] | None = None
        key_labels: list[str] | None = None
        options: Options = Options()
        score_weights: dict[str, np.ndarray] = field(default_factory=dict)
        sources: dict[str, str] = field(default_factory=dict)  # q, k, v: where X, Y, Z came from
        relative_bias: RelativeBias | None = None
        sinks: np.ndarray | None = None
        alibi_slopes: np.ndarray | None = None
        q_norm: np.ndarray | None = None
        k_norm: np.ndarray | None = None
        q_norm_bias: np.ndarray | None = None
        k_norm_bias: np.ndarray | None = None
        batched: bool = True  # X had a batch axis (the steps drop it when not)
        result_dtype: str | None = None
        initialised: list[str] = field(default_factory=list)
        batch_shape: tuple[int, ...] = field(init=False, default=())  # (B, H): the heads' batch axes
        axis_names: tuple[str, ...] = field(init=False, default=())
        query_limit: np.ndarray | None = field(init=False, default=None)  # (B, H, T): the valid lengths' key limit

    @property
    def m(self) -> int:
        return int(self.x.shape[1])

    @property
    def n(self) -> int:
        return int(self.memory.shape[1])

    @property
    def d_qk(self) -> int:
        """The width of a query per head: what √d scales by."""
        return self.projections.d_k // self.heads

    @property
    def head_count(self) -> int:
        return self.heads

    @property
    def self_attention(self) -> bool:
        """X, Y and Z are one and the same matrix."""
        return self.memory is self.x and self.values is self.memory

    @property
    def dtype(self) -> str:
        """The dtype computed in: as :attr:`Problem.dtype`, over X, Y, Z and every given weight."""
        return _dtype(self.options, self.x, self.memory, self.values, self.projections)

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The shapes of Q (B, H, T, d), K (B, G, S, d) and V (B, G, S, d_v) the projections produce."""
        return _shapes(self.x, self.memory, self.projections, self.heads, self.kv_heads)

    def problem(self, q: Any = None, k: Any = None, v: Any = None) -> Problem:
        """The core problem of the heads: Q (B, H, T, d), K and V (B, G, S, d) as computed from this
        layer's projections, every mask, bias and option handed on. Without q, k, v: zeros of their
        shapes (no memory), for planning before they are computed."""
        if q is None or k is None or v is None:
            return self.spec if self.padding is None else replace(self.spec, padding=self.padding)
        return replace(self.spec, q=q, k=k, v=v, padding=self.padding)

    @classmethod
    def build(cls, x: Any, memory: Any = None, values: Any = None, *, projections: Projections, heads: int = 1,
              padding: Any = None, pre_norm: Norm | None = None, batch_first: bool = True,
              sub_norm: Norm | None = None, gate: Gate | None = None, **core: Any) -> Layer:
        """A validated, frozen Layer; memory and values default to x (self-attention). ``core``: the
        fields handed on to the heads' Problem (mask, valid_lens, labels, options, sinks, ...)."""
        memory = x if memory is None else memory
        values = memory if values is None else values
        k_is_q, v_is_k = memory is x, values is memory
        o: Options = core.get("options") or Options()
        src = {n: (core.get("sources") or {}).get(n, "input") for n in ("q", "k", "v", "mask", "key_padding_mask",
                                                                         "weights")}
        halves = {half_type(a) for a in (x, memory, values)}
        result_dtype = halves.pop() if len(halves) == 1 and not o.dtype else None
        X, Y, Z, batched = _inputs(x, memory, values, batch_first, src)
        B, T, S = X.shape[0], X.shape[1], Y.shape[1]
        what = ("X", "X" if k_is_q else "memory", "X" if k_is_q and v_is_k else ("memory" if v_is_k else "values"))
        if projections.latent is not None and not (k_is_q and v_is_k):
            raise InputError("multi-head latent attention computes K and V from X's own latent: self-attention only "
                             "(no memory or values)", src["k"])
        projections.check(X.shape[2], Y.shape[2], Z.shape[2], heads, what, o.kv_heads)
        eps = pre_norm.eps if pre_norm is not None else 1.0
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):  # sqrt(var + eps): NaN or inf
            raise InputError(f"the pre-attention norm's eps is {eps!r}; it must be a positive finite number "
                             "(x / sqrt(mean(x²) + eps))", (core.get("sources") or {}).get("pre_norm", src["weights"]))
        if pre_norm is not None and pre_norm.w.shape != (X.shape[2],):
            raise InputError(f"the pre-attention norm has {pre_norm.w.shape[0]} weights but X has width {X.shape[2]}",
                             src["weights"])
        if sub_norm is not None:
            if not (isinstance(sub_norm.eps, (int, float)) and math.isfinite(sub_norm.eps) and sub_norm.eps > 0):
                raise InputError(f"the sub-norm's eps is {sub_norm.eps!r}; it must be a positive finite number",
                                 sub_norm.origin or src["weights"])
        core = dict(core, sources=dict(core.get("sources") or {}), result_dtype=result_dtype, batched=batched)
        for name, a in projections.extras().items():  # QK-norm weights and sinks that came with the weights
            if core.get(name) is None:
                core[name] = a
                core["sources"][name] = projections.source
        vl = core.get("valid_lens")
        if vl is not None and not batched:
            vl = np.asarray(vl)
            if vl.ndim == 1 and vl.shape[0] == T and T > 1:
                core["valid_lens"] = vl[None]  # one length per query of the single sequence
        if core.get("mask") is not None:
            core["mask"] = head_mask(mask_array(core["mask"], "mask", src["mask"]), B, heads, src["mask"])
        pad = None if padding is None else padding_mask(padding, B, S, batched, src["key_padding_mask"])
        dh = projections.d_k // heads
        kv = heads if projections.latent is not None else int(projections.W_k.shape[1]) // dh
        shapes = _shapes(X, Y, projections, heads, kv if kv != heads else None)
        width = shapes[0][1] * shapes[2][3]  # H · d_v: the concatenated heads
        if sub_norm is not None and sub_norm.w.shape != (width,):
            raise InputError(f"the sub-norm has weights of shape {sub_norm.w.shape}; expected ({width},), the "
                             "concatenated heads' width", sub_norm.origin or src["weights"])
        if gate is not None:
            _check_gate(gate, int(X.shape[2]), heads, width, src["weights"])
            if projections.W_o is None:  # the gate sits before W_o: without it there is nowhere to put it
                raise InputError("an output gate multiplies the heads before W_o, and these weights have no W_o",
                                 gate.origin or src["weights"])
        spec = Problem.shaped(*shapes, _dtype(o, X, Y, Z, projections), **core)
        return cls(X, Y, Z, projections, heads, pre_norm, sub_norm, gate, batch_first, spec=spec, padding=pad)


def _shapes(x: np.ndarray, memory: np.ndarray, p: Projections, heads: int,
            kv_heads: int | None) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Q (B, H, T, d), K (B, G, S, d) and V (B, G, S, d_v) as the projections produce them from X (B, T, D), Y."""
    B, T, S, H = int(x.shape[0]), int(x.shape[1]), int(memory.shape[1]), heads
    G = kv_heads or H
    return (B, H, T, p.d_k // H), (B, G, S, p.d_k // H), (B, G, S, int(p.W_v.shape[1]) // G)


def _dtype(o: Options, x: np.ndarray, memory: np.ndarray, values: np.ndarray, p: Projections) -> str:
    """As :attr:`Problem.dtype`, over X, Y, Z and every given weight (drawn ones do not count)."""
    every = [x, memory, values] + ([] if p.kind.startswith("init") else list(p.arrays().values()))
    return computed_dtype(o, every)


# the fields of the heads' problem a layer answers, read from its spec (computed once, there)
SPEC_FIELDS = ("valid_lens", "mask", "query_labels", "key_labels", "options", "score_weights", "sources", "relative_bias",
               "sinks", "alibi_slopes", "q_norm", "k_norm", "q_norm_bias", "k_norm_bias", "batched", "result_dtype",
               "initialised", "batch_shape", "axis_names", "query_limit")


def _from_spec(name: str) -> property:
    def read(self: Layer) -> Any:
        return getattr(self.spec, name)

    return property(read, doc=f"The heads' problem's {name} (spec.{name}).")


for _name in SPEC_FIELDS:
    setattr(Layer, _name, _from_spec(_name))


def _check_gate(gate: Gate, D: int, H: int, width: int, where: str) -> None:
    """An output gate's W_g (D, H·d_v) or (D, H), finite, and a known activation: else one line naming it."""
    src = gate.origin or where
    if gate.act not in GATE_ACTS:
        raise InputError(f"the output gate's activation {gate.act!r} is not one of {', '.join(GATE_ACTS)}", src)
    w = np.asarray(gate.w)
    if w.ndim != 2 or w.shape[0] != D or w.shape[1] not in (width, H):
        raise InputError(f"the output gate's W_g has shape {w.shape}; expected ({D}, {width}) (one gate per feature of "
                         f"the concatenated heads) or ({D}, {H}) (one per head)", src)
    if not np.all(np.isfinite(w)):
        raise InputError("the output gate's W_g holds NaN or infinite values", src)


def _inputs(x: Any, memory: Any, values: Any, batch_first: bool, src: dict[str, str]) -> tuple[Any, Any, Any, bool]:
    """X, Y, Z checked and held (B, T, D) batch first (Y is X, Z is Y where they were given as one); batched."""
    k_is_q, v_is_k = memory is x, values is memory
    X = input_matrix(x, "X", src["q"])
    Y = X if k_is_q else input_matrix(memory, "memory", src["k"])
    Z = Y if v_is_k else input_matrix(values, "values", src["v"])
    batched = X.ndim == 3
    for name, key, a in (("memory", "k", Y), ("values", "v", Z)):
        if a.ndim != X.ndim:
            raise InputError(f"{name} has shape {a.shape} but X has shape {X.shape}: both batched (B, T, D) or both "
                             "not", src[key])
    if batched and not batch_first:
        X, Y, Z = (np.swapaxes(a, 0, 1) for a in (X, Y, Z))  # (T, B, D) -> (B, T, D)
    if not batched:
        X, Y, Z = X[None], Y[None], Z[None]  # (T, D) -> (1, T, D)
    B, S = X.shape[0], Y.shape[1]
    for name, key, a in (("memory", "k", Y), ("values", "v", Z)):
        if a.shape[0] != B:
            raise InputError(f"{name} has batch size {a.shape[0]} but X has {B}", src[key])
    if Z.shape[1] != S:
        raise InputError(f"values have {Z.shape[1]} rows but memory has {S}: each key needs one value row", src["v"])
    Y = X if k_is_q else Y
    return X, Y, Y if v_is_k else Z, batched


Subject: TypeAlias = Problem | Layer  # what engine.run computes: a core problem, or a layer that produces one
