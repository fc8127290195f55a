"""One attention layer of a checkpoint, as a Python call: what ``attncli self --weights MODEL --layer N``
computes on (io layer).

    layer = load_layer("./tiny-llama", 3)           # a folder, .safetensors, a sharded index, .pt/.bin
    layer.options                                   # config.json's facts as Options fields (rope, window, ...)
    layer.projections, layer.norm, layer.relative_bias
    problem = layer.problem(x)                      # x: (T, E) or (B, T, E) -> a validated core.layer.Layer
    problem = layer.problem(h, from_residual=True)  # h = hidden_states[3]: the layer's pre-norm first

The layout is read by attncli.io.layouts (one registry); this module turns its textbook arrays and
facts into the pipeline's parts. It raises :class:`~attncli.errors.InputError` and changes nothing
process-wide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.projections import Gate, Latent, Norm, Projections, RelativeBias
from attncli.errors import InputError
from attncli.io.checkpoint import ML_DTYPES, Checkpoint
from attncli.io.layouts import AttentionFacts, LayerAttention
from attncli.io.layouts import load_layer as read_layer

PROJECTION_NAMES = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o", "q_norm", "k_norm", "q_norm_bias",
                    "k_norm_bias", "sinks")


@dataclass(frozen=True)
class CheckpointLayer:
    """One attention layer of a checkpoint in the pipeline's terms (attncli.core)."""

    projections: Projections  # W_q, W_k, W_v, W_o, biases, QK-norm weights, sinks; origin says where each came from
    options: dict[str, Any]  # Options fields from config.json (and the layout): rope, window, scale, ...
    heads: int | None  # query heads (None: no config.json said; give heads=)
    norm: Norm | None  # the pre-attention norm (applied with from_residual=True); None for post-norm layers
    sub_norm: Norm | None  # BitNet's RMSNorm of the concatenated heads before W_o (applied in every run)
    gate: Gate | None  # AFMoE / Laguna: the output gate act(x · W_g) of the concatenated heads (every run)
    relative_bias: RelativeBias | None  # T5's relative position bias
    facts: AttentionFacts  # everything the layout read, as read
    layout: str
    layer: int
    layers: int
    source: str
    raw: LayerAttention = field(repr=False)

    @property
    def config_source(self) -> str:
        return f"{self.projections.source} (config.json)"

    def option_origin(self, name: str) -> str:
        """Where the option ``name`` came from, for messages: config.json and its key (the key it was computed from,
        such as partial_rotary_factor for rotary_dim, where that is not the option's own name)."""
        return f"{self.config_source}: {self.facts.keys.get(name, name)}"

    def config_options(self, base: Options | None = None) -> Options:
        """``base`` (default: Options()) with config.json's facts over it."""
        return (base or Options()).merged(self.options, self.config_source, origin=self.option_origin) if self.options \
            else (base or Options())

    def problem(self, x: Any, memory: Any = None, values: Any = None, *, options: Options | None = None,
                heads: int | None = None, from_residual: bool = False, **kw: Any) -> Layer:
        """The validated :class:`attncli.core.layer.Layer` (projections, heads, pre-norm, bias) of this
        checkpoint layer on inputs ``x`` (T, E) or (B, T, E) (``memory``, ``values`` for cross-attention).
        ``options``: what to compute with (default: :meth:`config_options`); ``heads`` when no config.json
        says it; ``from_residual``: ``x`` is the residual stream
        (``hidden_states[N]``) and the layer's norm is applied first, wherever the family keeps it (before the
        block or inside the attention module); without it ``x`` is the query projection's input. ``kw`` goes to
        Layer.build (mask, valid_lens, labels, batch_first, ...)."""
        h = heads or self.heads
        if h is None:
            raise InputError("does not say how many heads its attention has (no config.json, no model_args); "
                             "give heads= (--heads N)", self.source)
        missing = self.facts.norm_missing
        if from_residual and missing:
            raise InputError(f"has no {missing}, which --from-residual applies first", self.source)
        # X is the query projection's input for every family; the layer's norm (before the block or inside the
        # attention module, facts.norm_at) is applied only to the residual stream (from_residual)
        return Layer.build(x, memory, values, projections=self.projections, heads=h,
                           options=options if options is not None else self.config_options(),
                           pre_norm=self.norm if from_residual else None, sub_norm=self.sub_norm, gate=self.gate,
                           relative_bias=self.relative_bias, **kw)


def numbers(a: np.ndarray) -> np.ndarray:
    """A checkpoint tensor of any kind (projection, norm, bias, sink, relative bias) as numbers the pipeline
    computes with: bfloat16 and float8 (ml_dtypes, which numpy does not count as numbers) as float32, where
    every one of their values is exact; float16/32/64 as stored."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.name in ML_DTYPES else a


def load_layer(path: str | Path | Checkpoint, layer: int | None = None, prefix: str | None = None, *,
               heads: int | None = None, layout: str | None = None) -> CheckpointLayer:
    """Layer ``layer`` of a checkpoint (a .safetensors file, a sharded index, a save_pretrained folder,
    a .pt/.pth/.bin state dict): only that layer's tensors are read. ``layer`` is needed when there are
    several; ``prefix`` picks a stack (T5's encoder/decoder); ``heads`` when no config.json says it;
    ``layout`` forces a declared family (attncli.io.families) on a model_type attncli does not declare."""
    la = read_layer(path, layer, prefix, heads=heads, layout=layout)
    a, f = la.arrays, la.facts
    latent = None
    if f.latent is not None:  # MLA: the latents' matrices and norms
        d_nope, d_rope, eps = f.latent
        opt = {n: numbers(a[n]) for n in ("b_kva", "W_qa", "b_qa", "q_a_norm") if n in a}
        latent = Latent(numbers(a["W_kva"]), numbers(a["kv_a_norm"]), d_nope, d_rope, eps, **opt,
                        origin={n: la.origin[n] for n in ("W_kva", "b_kva", "W_qa", "b_qa", "q_a_norm", "kv_a_norm")
                                if n in la.origin})
    proj = Projections(**{n: numbers(a[n]) for n in PROJECTION_NAMES if n in a},  # type: ignore[arg-type]
                       latent=latent, source=f"{la.source} layer {la.layer}",
                       origin={n: la.origin[n] for n in PROJECTION_NAMES if n in la.origin}, kind=la.layout)
    options = f.options()  # the facts that are Options fields, by their names
    proj.config = {n: getattr(f, n) for n in f.from_config}
    bias = None
    if f.relative_bias == "t5":  # T5's bucketed relative position bias: per head, added to the scores
        assert f.rel_buckets is not None and f.rel_max_distance is not None
        bias = RelativeBias(numbers(a["rel_bias"]), bool(f.rel_bidirectional), f.rel_buckets, f.rel_max_distance,
                            la.origin.get("rel_bias", ""))
    norm = None
    if f.pre_norm is not None and "norm_w" in a:
        norm = Norm(f.pre_norm, numbers(a["norm_w"]), None if "norm_b" not in a else numbers(a["norm_b"]),
                    f.pre_norm_eps if f.pre_norm_eps is not None else 1e-6, la.origin.get("norm_w", ""))
    sub = None
    if f.sub_norm is not None and "sub_norm" in a:
        sub = Norm(f.sub_norm, numbers(a["sub_norm"]), None, f.pre_norm_eps if f.pre_norm_eps is not None else 1e-6,
                   la.origin.get("sub_norm", ""))
    gate = Gate(f.gate, numbers(a["W_g"]), la.origin.get("W_g", "")) if f.gate is not None else None
    return CheckpointLayer(proj, options, f.heads, norm, sub, gate, bias, f, la.layout, la.layer, la.layers, la.source, la)
