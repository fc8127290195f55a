"""The attention layouts of real checkpoints, recognised from tensor names (and config.json),
each converted to the textbook convention ``Q = X @ W_q`` with a note of where every matrix
came from (``W_q = model.layers.3.self_attn.q_proj.weightᵀ``).

    layout            names (after the layer's prefix)                       stored as
    mha               in_proj_weight (3E, E), out_proj                        nn.Linear (out, in)
    bert              attention.self.{query,key,value}, attention.output.dense nn.Linear (RoFormer, ESM: rotary)
    gpt2              attn.c_attn (E, 3E) = [Q | K | V] by columns, c_proj    Conv1D (in, out)
    nanogpt           attn.c_attn (3E, E), c_proj                             nn.Linear
    gptj              attn.{q,k,v,out}_proj                                   nn.Linear, rotary interleaved
    neox, bloom       query_key_value (H·3·d, E): rows (H, 3, d)              nn.Linear
    falcon (bloom)    self_attention.query_key_value: rows (G, H/G + 2, d)    nn.Linear, rotary half or ALiBi
    persimmon         self_attn.query_key_value (H, 3, d), self_attn.dense    nn.Linear, partial rotary
    phi               self_attn.{q,k,v}_proj, self_attn.dense                 nn.Linear, partial rotary
    gpt_neo           attn.attention.{q,k,v,out}_proj                         nn.Linear, scale 1, local layers
    llama             self_attn.{q,k,v,o}_proj (+ q_norm, k_norm, sinks)      nn.Linear, k/v (G·d, E); QK-norm
                      under the family's names: q_norm (d,) | (H, d) | (H·d,), q_layernorm.norms.h (StableLM),
                      query_layernorm (HunYuan), none (nanochat: weightless)
    t5                layer.0.SelfAttention.{q,k,v,o} + relative_attention_bias (layer 0)
    bart              self_attn.{q,k,v,out}_proj, self_attn_layer_norm        nn.Linear (OPT, BioGPT, XGLM, Whisper, ...)
    distilbert        attention.{q,k,v,out}_lin                               nn.Linear, post-norm
    albert            albert_layer_groups.G.albert_layers.I.attention.*       shared: layer N -> (G, I) by config.json
    mla               self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj}, kv_a_proj_with_mqa, kv_a_layernorm,
                      kv_b_proj (rows per head [k_nope; v]), o_proj            nn.Linear; DeepSeek-V2/V3 latent attention
    modernbert        attn.Wqkv (3E, E) = [Q; K; V] by rows (decoder: attn.{q,k,v}_proj), attn.Wo   nn.Linear
    transformer-lens  attn.W_Q (H, E, d), b_Q (H, d), W_O (H, d, E); _W_K/_W_V (G, E, d) for GQA

A layout is a declared :class:`Row` (its tensor names, a fused tensor per head or by blocks, biases, the norm, the
relative bias table) registered with :func:`row_layout` and read by :func:`read_row` with the generic slicers (gptj,
gpt_neo, bert, neox, persimmon, t5, distilbert, modernbert; bart, bloom and albert through it), or, where the tensors
need more than slicing, a small reader registered with :func:`layout` (llama's QK-norm names and gates, phi3's and
gpt2's fused splits, falcon's groups, mla's latents, transformer-lens, mha). Either way the layer's options (rotary,
causality, window, scale, ALiBi, relative bias) come from the family's row through the one resolver,
:func:`layer_options` (transformer-lens and mha excepted: no family). :func:`load_layer` finds the layout
whose marker tensor is present, picks the layer, and reads only that layer's tensors. The same
registry, ``LAYOUTS``, holds the layouts of a weights file (one module's entries in memory,
read from .npz/.yaml/.json/.pt: textbook, d2l, notes, mha-kdim, converted by attncli.io.weights;
:func:`module_layout`), which :func:`projections_from` recognises by the same lookup
(:func:`find_layouts`); nn.MultiheadAttention's entry (mha-module) reads both.
:func:`inspect_checkpoint` reports the same from headers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from attncli.core.options import ROPE_TYPES, Options
from attncli.core.projections import BIASES, Projections
from attncli.errors import InputError, printable
from attncli.io import config as cfgcheck
from attncli.io import weights
from attncli.io.checkpoint import Checkpoint, model_args, open_checkpoint
from attncli.io.families import (
    CONFIG_DECIDES,
    FAMILIES,
    REFUSED,
    Family,
    attention_keys,
    unsupported_key,
    with_class_defaults,
)
from attncli.io.weights import Converter, entries_of


@dataclass
class AttentionFacts:
    """What the model does around the projections, from config.json and the layout (None: unknown)."""
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    scale: float | None = None  # the score scale when it is not 1/sqrt(head_dim)
    causal: bool = False  # a decoder's self-attention
    rope: str | None = None  # "half" (Llama, NeoX, Qwen, Gemma, gpt-oss) | "interleaved" (GPT-J) | None
    rope_base: float | None = None
    rotary_dim: int | None = None
    rope_scaling: dict[str, Any] | None = None
    window: int | None = None  # the sliding window of THIS layer; None if it does not slide
    local_window: int | None = None  # the bidirectional local window R of THIS layer (|j - i| <= R); None: none
    softcap: float | None = None  # attn_logit_softcapping
    qk_norm: str | None = None  # "rms" | "rms1p" (Gemma's 1 + w) | "layernorm" | "rms-full" | None
    qk_norm_at: str | None = None  # "after-rope" (HunYuan, nanochat); None: before RoPE
    norm_eps: float | None = None
    pre_norm: str | None = None  # "layernorm" | "rms" | "rms1p" | None: the norm --from-residual applies first
    pre_norm_eps: float | None = None  # the eps of pre_norm (and of sub_norm)
    norm_at: str | None = None  # where the layer's norm sits: "before" the attention module (pre-norm) | "inside"
    # it, first (pre-LN BERTs, ESM) | "after" the residual (post-norm; X is hidden_states[N] itself) | None: none
    norm_missing: str | None = None  # the norm tensor the layer lacks (--from-residual is then refused)
    alibi: bool = False  # Bloom / Falcon
    alibi_form: str | None = None  # how the model computes it (attncli.core.alibi.FORMS): Bloom, Falcon round slope·j
    alibi_scaled: bool = False  # ALiBi added to q·k before the scale (Falcon)
    chunk: int | None = None  # chunked attention of THIS layer (Llama 4 attention_chunk_size); None: not chunked
    clip_qkv: float | None = None  # q, k, v clamped to [-C, C] after the projections (OLMo)
    tuning_scale: float | None = None  # Llama 4's temperature tuning of q on THIS layer (attn_scale); None: none
    tuning_floor: float | None = None  # its floor_scale
    sub_norm: str | None = None  # "rms": an RMSNorm of the concatenated heads before o_proj (BitNet); eps: norm_eps
    gate: str | None = None  # "sigmoid" | "softplus": an output gate act(x · W_g) of the concatenated heads (AFMoE, Laguna)
    sinks: bool = False  # gpt-oss
    rms_wide: bool = False  # its RMSNorms apply w in float32 before rounding to a half dtype (OLMo 2, GPT-OSS, Helium)
    rope_rounding: str | None = None  # "once" / "once-float32": q, k rotated in float32, rounded once (the option)
    sink_form: str | None = None  # "scale": Granite SWA's sinks, a scale after the softmax (the option sink_form)
    latent: tuple[int, int, float] | None = None  # MLA: (qk_nope_head_dim, qk_rope_head_dim, the latents' RMS eps)
    relative_bias: str | None = None  # "t5": T5's bucketed relative position bias (rel_* below)
    rel_buckets: int | None = None  # its relative_attention_num_buckets
    rel_max_distance: int | None = None  # its relative_attention_max_distance
    rel_bidirectional: bool | None = None  # an encoder's (both directions) or a decoder's (past only) buckets
    from_config: list[str] = field(default_factory=list)
    # the config.json key (and the arithmetic) each option came from, where it is not the option's own name (rotary_dim
    # from "partial_rotary_factor 0.75 × head_dim 4"): what a refusal of the option's value names as its culprit
    keys: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # display only (inspect, --explain): never decides anything

    def given(self, **facts: Any) -> None:
        """Set facts that config.json gave (listed in from_config, which the views mark)."""
        for n, v in facts.items():
            setattr(self, n, v)
            if n not in self.from_config:
                self.from_config.append(n)

    def config_gave(self, name: ConfigFact) -> bool:
        """Whether config.json gave the fact ``name`` (listed in from_config)."""
        return name in self.from_config

    def mark_config(self, *names: ConfigFact) -> None:
        """List facts set elsewhere from config.json's values in from_config."""
        self.from_config.extend(n for n in names if n not in self.from_config)

    def unmark_config(self, name: ConfigFact) -> None:
        """The fact ``name`` no longer comes from config.json (the layout or the family decided it)."""
        self.from_config = [n for n in self.from_config if n != name]

    def options(self) -> dict[str, Any]:
        """The facts that are :class:`~attncli.core.options.Options` fields, by the same names (a partial Options):
        those set (not None, not False)."""
        return {n: v for n in OPTION_FACTS if (v := getattr(self, n)) is not None and v is not False}


# The facts whose origin (config.json or not) a reader asks or changes by name; spelled as a Literal so that mypy
# checks every call, and each one a field of AttentionFacts (asserted at import)
ConfigFact = Literal["heads", "kv_heads", "head_dim", "rotary_dim", "rope_scaling", "pre_norm_eps"]
assert set(get_args(ConfigFact)) <= {f.name for f in fields(AttentionFacts)}

# The facts that are options: the fields AttentionFacts and Options share (the rest is structure: heads, norms, ...)
OPTION_FACTS = tuple(f.name for f in fields(AttentionFacts) if f.name in {o.name for o in fields(Options)})


@dataclass
class LayerAttention:
    """One layer's attention weights in textbook form, and where each came from."""
    arrays: dict[str, np.ndarray]  # W_q (E, H·d), b_q, W_k (E, G·d), b_k, W_v, b_v, W_o (H·d, E), b_o, q_norm (d,), ...
    origin: dict[str, str]  # name -> where it came from in the checkpoint
    layout: str
    layer: int
    layers: int
    facts: AttentionFacts
    source: str


# ---- the registry ----------------------------------------------------------------------------

Reader = Callable[["Ctx"], None]


@dataclass(frozen=True)
class Layout:
    """A way of naming attention weights. A checkpoint layout ``read``s layer N of a stack through a Ctx; a
    module layout ``convert``s one module's entries held in memory (a weights file: .npz/.yaml/.json/.pt,
    attncli.io.weights). nn.MultiheadAttention's is both: one reader for weights files and checkpoints."""
    name: str
    marker: re.Pattern[str]  # groups: stack (the prefix before the layer index), n (the layer index)
    read: Reader | None
    description: str
    convert: Converter | None = None  # (entries, prefix, source) -> {textbook name: array, "origin": {...}}
    file_name: str = ""  # what a weights file read with ``convert`` is called (Projections.kind); default: name

    def reader(self) -> Reader:
        if self.read is None:
            raise AssertionError(f"{self.name} is a weights-file layout, not a checkpoint's")
        return self.read

    def converter(self) -> Converter:
        if self.convert is None:
            raise AssertionError(f"{self.name} is a checkpoint layout, not a weights file's")
        return self.convert


LAYOUTS: dict[str, Layout] = {}


def layout(name: str, marker: str, description: str, *, convert: Converter | None = None,
           file_name: str = "") -> Callable[[Reader], Reader]:
    """Register a checkpoint layout recognised by its ``marker`` (a regex over tensor names); ``convert``: it
    also reads a weights file that holds one such module."""

    def deco(fn: Reader) -> Reader:
        LAYOUTS[name] = Layout(name, re.compile(marker), fn, description, convert, file_name)
        return fn

    return deco


def module_layout(name: str, key: str, convert: Converter, description: str) -> None:
    """Register a weights-file layout recognised by its marker ``key``, alone or under a module prefix
    (``encoder.attn.W_q``)."""
    LAYOUTS[name] = Layout(name, re.compile(rf"^(?P<stack>(?:.*\.)?){re.escape(key)}$"), None, description, convert)


module_layout("textbook", "W_q", weights.textbook, "W_q, W_k, W_v (and W_o, b_q, b_k, b_v, b_o) with Q = X @ W_q")
module_layout("d2l", "W_q.weight", weights.d2l, "nn.Linear layers W_q, W_k, W_v, W_o (d2l's MultiHeadAttention)")
module_layout("notes", "q.weight", weights.notes, "nn.Linear layers q, k, v (and o), as in the notes' MultiheadAttention")
module_layout("mha-kdim", "q_proj_weight", weights.mha_separate,
              "nn.MultiheadAttention with kdim/vdim: q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias, out_proj")


# Layouts attncli recognises but does not read: a name pattern -> what it is and why.
UNSUPPORTED: dict[str, tuple[re.Pattern[str], str]] = {
    "mpt": (re.compile(r"attn\.Wqkv\.weight$"), "MPT / Mosaic (fused attn.Wqkv)"),
}


# ---- reading one layer -------------------------------------------------------------------------

def _cfg(config: dict[str, Any] | None, *keys: str) -> tuple[Any, str | None]:
    """The first of ``keys`` present (and not None) in config.json, and its name; checked by type
    (attncli.io.config.KEYS): a wrong one is one line naming config.json and the key."""
    for k in keys:
        if config and config.get(k) is not None:
            return cfgcheck.value(config, k, "config.json"), k
    return None, None


@dataclass
class Ctx:
    """What a layout reader works with: the checkpoint, the chosen layer's prefixes, the result so far."""
    ckpt: Checkpoint
    stack: str  # e.g. "model.layers."
    layer: int
    layers: int
    config: dict[str, Any] | None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    facts: AttentionFacts = field(default_factory=AttentionFacts)
    heads_hint: int | None = None
    name: str | None = None  # a variant's name when the reader decides it (gpt2 / nanogpt)
    family: Family | None = None  # the declaration config.json's model_type (or --layout) names; None: no config

    @property
    def block(self) -> str:
        return f"{self.stack}{self.layer}."

    def has(self, name: str) -> bool:
        return name in self.ckpt

    def get(self, name: str) -> np.ndarray:
        if name not in self.ckpt:
            raise InputError(f"has no tensor {name!r}, which layer {self.layer} of this layout needs", self.ckpt.source)
        return self.ckpt.tensor(name)

    def put(self, key: str, a: np.ndarray, where: str) -> None:
        self.arrays[key], self.origin[key] = a, where

    def linear(self, key: str, name: str, bias: str | None = None) -> None:
        """An nn.Linear (out, in) as the textbook (in, out), and its bias."""
        w = self.get(name)
        if w.ndim != 2:
            raise InputError(f"tensor {name!r} has shape {w.shape}; expected a 2-D nn.Linear weight", self.ckpt.source)
        self.put(key, w.T, f"{name}ᵀ")  # (out, in) -> (in, out)
        if bias is not None and self.has(bias):
            self.put("b_" + key[-1], self.get(bias), bias)

    def linears(self, prefix: str, *names: str) -> None:
        """W_q, W_k, W_v (and W_o), in that order, from the nn.Linear tensors ``prefix + name`` (.weight, .bias)."""
        for key, n in zip(("W_q", "W_k", "W_v", "W_o"), names):
            self.linear(key, f"{prefix}{n}.weight", f"{prefix}{n}.bias")

    def conf(self, default: Any = None, cast: Callable[[Any], Any] | None = None, **fact: tuple[str, ...]) -> Any:
        """Set one fact, ``conf(rope_base=("rope_theta", ...))``, from the first of its config keys present (listed in
        from_config), else ``default``."""
        (name, keys), = fact.items()
        value, key = _cfg(self.config, *keys)
        if key is None:
            value = default
        else:
            if name not in self.facts.from_config:
                self.facts.from_config.append(name)
            if key != name:
                self.facts.keys[name] = key  # the culprit a refusal of the option's value names
        if value is not None and cast is not None:
            value = cast(value)
        setattr(self.facts, name, value)
        return value

    def fail(self, message: str) -> InputError:
        return InputError(message, self.ckpt.source)


def _heads(c: Ctx, *keys: str, kv_keys: tuple[str, ...] = ("num_key_value_heads",), width: int | None = None,
           dim_keys: tuple[str, ...] = ("head_dim", "d_kv")) -> None:
    """heads, kv_heads, head_dim from the config (heads_hint when it has none); head_dim = width / heads by default
    (always where ``dim_keys`` is empty: ModernBERT's hidden_size // num_attention_heads)."""
    heads = c.conf(heads=keys, cast=int)
    if c.heads_hint is not None:
        c.facts.heads = heads = c.heads_hint
        c.facts.unmark_config("heads")
    c.conf(kv_heads=kv_keys, default=heads, cast=int)
    d = c.conf(head_dim=dim_keys, cast=int)
    if d is None and heads and width is not None:
        c.facts.head_dim = width // heads if width % heads == 0 else None


def _check_shapes(c: Ctx) -> None:
    """The textbook arrays agree with each other and with the facts (one line naming the tensor)."""
    a, f = c.arrays, c.facts
    if f.latent is not None:  # MLA: W_q, W_k, W_v read latents; Projections.check sees their widths
        E = a["W_kva"].shape[0]
        width, key = _cfg(c.config, "hidden_size")
        if key is not None and int(width) != E:
            raise c.fail(f"{c.origin['W_kva']} has {E} inputs but config.json says {key} = {width}")
        for k in ("norm_w",):
            if k in a and a[k].shape != (E,):
                raise c.fail(f"{c.origin[k]} has shape {a[k].shape}; expected ({E},), the model width")
        return
    E = a["W_q"].shape[0]
    width, key = _cfg(c.config, "hidden_size", "n_embd", "d_model", "dim")
    if key is not None and int(width) != E:
        raise c.fail(f"{c.origin['W_q']} has {E} inputs but config.json says {key} = {width}")
    for k in ("W_k", "W_v"):
        if k in a and a[k].shape[0] != E:
            raise c.fail(f"{c.origin[k]} has {a[k].shape[0]} inputs but {c.origin['W_q']} has {E}")
    if f.heads and f.head_dim:
        kv = f.kv_heads or f.heads
        want = {"W_q": f.heads * f.head_dim, "W_k": kv * f.head_dim, "W_v": kv * f.head_dim}
        for k, cols in want.items():
            if k in a and a[k].shape[1] != cols:
                src = "config.json" if f.config_gave("heads") else "the layout"
                raise c.fail(f"{c.origin[k]} gives {a[k].shape[1]} features but {src} says "
                             f"{f.heads if k == 'W_q' else kv} heads x head_dim {f.head_dim} = {cols}")
    if "W_o" in a and a["W_o"].shape[0] != a["W_q"].shape[1]:
        raise c.fail(f"{c.origin['W_o']} takes {a['W_o'].shape[0]} features but {c.origin['W_q']} gives "
                     f"{a['W_q'].shape[1]} (the heads' outputs, concatenated)")
    if f.heads and a["W_q"].shape[1] % f.heads:
        raise c.fail(f"{f.heads} heads do not divide the {a['W_q'].shape[1]} query features of {c.origin['W_q']}")
    for k, n in (("b_q", "W_q"), ("b_k", "W_k"), ("b_v", "W_v"), ("b_o", "W_o")):
        if k in a and n in a and a[k].shape != (a[n].shape[1],):
            raise c.fail(f"{c.origin[k]} has shape {a[k].shape}; expected ({a[n].shape[1]},) to match {c.origin[n]}")
    for k in ("q_norm", "k_norm", "q_norm_bias", "k_norm_bias"):
        if k not in a or not (f.heads and f.head_dim):
            continue
        hn, d = (f.heads if k.startswith("q") else f.kv_heads or f.heads), f.head_dim
        if f.qk_norm == "rms-full":
            ok: tuple[tuple[int, ...], ...] = ((hn * d,),)
            what = f"an RMSNorm over the full width, {hn} heads x {d}"
        else:
            ok = ((d,), (hn, d))
            what = f"a norm over each head's {d} features, shared or one row per head"
        if a[k].shape not in ok:
            raise c.fail(f"{c.origin[k]} has shape {a[k].shape}; expected {' or '.join(map(str, ok))}: {what}")
    if "sinks" in a and f.heads and a["sinks"].shape != (f.heads,):
        raise c.fail(f"{c.origin['sinks']} has shape {a['sinks'].shape}; expected ({f.heads},), one per query head")
    for k in ("norm_w", "norm_b"):
        if k in a and a[k].shape != (E,):
            raise c.fail(f"{c.origin[k]} has shape {a[k].shape}; expected ({E},), the model width")
    if "sub_norm" in a and "W_o" in a and a["sub_norm"].shape != (a["W_o"].shape[0],):
        raise c.fail(f"{c.origin['sub_norm']} has shape {a['sub_norm'].shape}; expected ({a['W_o'].shape[0]},), the "
                     f"width {c.origin['W_o']} takes")


def _norm(c: Ctx, kind: str, w: str, b: str | None = None, eps_keys: tuple[str, ...] = (), eps: float | None = None) -> None:
    """The layer's pre-attention norm (weight, bias) and its kind."""
    if not c.has(w):
        return
    c.put("norm_w", c.get(w), w)
    if b is not None and c.has(b):
        c.put("norm_b", c.get(b), b)
    c.facts.pre_norm, c.facts.norm_at = kind, c.facts.norm_at or "before"
    c.conf(pre_norm_eps=eps_keys, default=eps, cast=float)


def _post_norm(c: Ctx, name: str) -> None:
    """A post-norm layer: its norm ``name`` comes after the residual, so nothing comes before attention."""
    c.facts.norm_at = "after"
    c.facts.notes["post_norm"] = f"{name} (after the residual; X is hidden_states[{c.layer}] itself)"


def _rope(c: Ctx, kind: str, default_base: float = 10000.0, layer_type: str | None = None) -> None:
    """RoPE facts: theta and scaling from rope_theta / rope_scaling (transformers 4) or rope_parameters (5),
    per layer type where the model has several (Gemma 3); partial rotary from partial_rotary_factor/rotary_pct."""
    f, cfg = c.facts, c.config or {}
    f.rope = kind
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    _rope_scaling_replaces(c, params, default_base)
    if isinstance(params, dict) and params.get("rope_theta") is not None:
        f.given(rope_base=float(params["rope_theta"]))
        f.keys["rope_base"] = "rope_parameters.rope_theta"
    else:
        c.conf(rope_base=("rope_theta", "rotary_emb_base", "rope_base"), default=default_base, cast=float)
    if layer_type == "sliding_attention" and cfg.get("rope_local_base_freq") is not None:  # Gemma 3, transformers 4
        f.rope_base = float(cfg["rope_local_base_freq"])
    scaling = cfg.get("rope_scaling") or (params if isinstance(params, dict) else None)
    if isinstance(scaling, dict):
        kind_ = scaling.get("rope_type", scaling.get("type", "default"))
        if kind_ not in (None, "default"):
            f.given(rope_scaling={k: v for k, v in scaling.items() if k != "rope_theta"})
    if f.rope_scaling is not None:
        f.rope_scaling.setdefault("max_position_embeddings", cfg.get("max_position_embeddings"))
        if cfg.get("rope_scaling") is None:
            f.keys["rope_scaling"] = "rope_parameters"
    d = f.head_dim
    factor = (params or {}).get("partial_rotary_factor") if isinstance(params, dict) else None
    key: str | None = "rope_parameters.partial_rotary_factor"
    if factor is None:
        factor, key = _cfg(cfg, "partial_rotary_factor", "rotary_pct")
    if cfg.get("rotary_dim") is not None:
        f.given(rotary_dim=int(cfg["rotary_dim"]))
    elif factor is not None and d:
        f.given(rotary_dim=int(d * float(factor)))
        f.keys["rotary_dim"] = f"{key} {printable(str(factor), 20)} × head_dim {d}"  # HF: int(head_dim · factor)
    else:
        f.rotary_dim = d
        f.keys["rotary_dim"] = "head_dim"  # the whole head rotates


def _rope_scaling_replaces(c: Ctx, params: Any, default_base: float) -> None:
    """transformers 5 (RotaryEmbeddingConfigMixin.convert_rope_params_to_dict) takes a config.json's rope_scaling
    *instead of* its rope_parameters, then fills rope_theta and partial_rotary_factor from the top-level keys (or
    the config class's defaults, the family's partial_default: GPT-NeoX's rotary_pct 0.25): a rope_theta or
    partial_rotary_factor that only rope_parameters holds is dropped. Where that changes a number, refused,
    naming both keys (never one guessed)."""
    cfg = c.config or {}
    scaling = cfg.get("rope_scaling")
    if not (isinstance(scaling, dict) and scaling and isinstance(params, dict)):
        return
    fam = c.family
    default_factor = fam.partial_default if fam is not None and fam.partial_default is not None else 1.0
    theirs = {"rope_theta": scaling.get("rope_theta", cfg.get("rope_theta", default_base)),
              "partial_rotary_factor": scaling.get("partial_rotary_factor", cfg.get(
                  "partial_rotary_factor", cfg.get("rotary_pct", default_factor)))}
    for key, used in theirs.items():
        ours = params.get(key)
        if ours is not None and used is not None and ours != used:
            raise c.fail(f"config.json has rope_scaling beside rope_parameters: transformers reads rope_scaling "
                         f"alone, so rope_parameters' {key} {ours!r} gives way to {used!r}; keep one of the two keys")


def _layer_type(c: Ctx) -> str | None:
    types = (c.config or {}).get("layer_types")
    if isinstance(types, list) and c.layer < len(types):
        return str(types[c.layer])
    return None


ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "attention", "global", "local")



def _window(c: Ctx, fam: Family, k: LayerKind) -> None:
    """The window of a sliding layer: its size from the family's window key (sliding_window; GPT-Neo's window_size,
    default 256), which layers slide from layer_types, the family's layer-type rule (GPT-Neo: "local") or its
    sliding rule (else every layer)."""
    cfg = c.config or {}
    w = cfg.get(fam.window_key)
    kind = k.type
    if fam.layer_type is not None:  # the family's own layer kinds (GPT-Neo: global / local; ModernBERT: full / sliding)
        if k.by_rule:
            c.facts.notes["layer_type"] = f"{kind}: layer {c.layer}'s kind ({fam.model_type}'s layer-type rule)"
        if kind not in ("local", "sliding_attention"):
            return
        if w is not None:
            w = int(cfgcheck.value(cfg, fam.window_key, "config.json"))
        elif fam.window_half is not None:  # ModernBERT: local_attention // 2 (config.sliding_window's getter)
            key, default = fam.window_half
            w = int(cfgcheck.value(cfg, key, "config.json", default)) // 2
            if w < 1 and fam.window_kind != "both":
                raise c.fail(f"{fam.model_type}: layer {c.layer} is local with a window of {w} keys ({key} "
                             f"{cfg.get(key)}): every query would see no key")
        else:
            w = fam.window_default
    if w is None and (kind == "sliding_attention" or (kind is None and fam.slides is not None
                                                      and fam.slides(c.layer, cfg, None))):
        # a sliding layer without its window: transformers' create_sliding_window_causal_mask raises on it
        said = "config.json's layer_types" if kind is not None else f"{fam.model_type}'s layer rule"
        raise c.fail(f"{fam.model_type}: {said} makes layer {c.layer} a sliding-window layer, but config.json's "
                     f"{fam.window_key} is null: its window is unknown (transformers cannot run it either)")
    if w is None or (cfg.get("use_sliding_window") is False and kind != "sliding_attention"):
        # Qwen 2/3 (MoE) and SmolLM3: no window unless use_sliding_window (their classes' default false: see
        # with_class_defaults), whatever sliding_window says beside it (their configs null it, or 0 for Qwen2-MoE; the
        # hub's Qwen1.5-MoE and Qwen2.5 config.json files keep 32768/131072)
        return
    if kind == "chunked_attention" and c.facts.chunk is None:
        raise c.fail(f"layer {c.layer} is a chunked-attention layer (Llama 4), which is not supported")
    if fam.always_slides or fam.layer_type is not None:
        slides = True
    elif kind is not None:
        slides = kind == "sliding_attention"
    else:  # the family's own rule (as its modeling file), else every layer
        slides = fam.slides is None or fam.slides(c.layer, cfg, None)
    if not slides:
        return
    c.facts.given(**{"local_window" if fam.window_kind == "both" else "window": int(w)})
    if fam.window_kind == "both":  # UltraBERT, ModernBERT: |j - i| <= R (sliding_window_bidirectional_overlay)
        c.facts.notes["bidirectional"] = (f"{fam.model_type}: an encoder's local layer, each token sees the tokens "
                                          f"within {int(w)} positions on either side")


# ---- the layouts -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """A tensor layout as a declared row: where a layer's projections sit and how a fused q/k/v is cut. Read by
    :func:`read_row` with the generic slicers; everything else (rotary, causality, window, scale, biases of the
    scores) is the family's, through the one resolver (:func:`layer_options`)."""
    default: str  # the family whose declaration reads bare weights (forced with --layout on a config-less checkpoint)
    module: str  # the attention module after the layer's prefix ("attention.", "layer.0.SelfAttention.")
    q: str = "q_proj"  # the nn.Linear projections after the module (NAME.weight (out, in), NAME.bias)
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    fused: str | None = None  # one nn.Linear holding q, k, v instead (unless the family's split_qkv), cut by fused_by
    fused_by: str = "heads"  # "heads": rows (H, 3, d) per head (GPT-NeoX, Bloom) | "blocks": [Q; K; V] by rows,
    # three equal blocks (ModernBERT's Wqkv)
    needs_heads: bool = False  # the heads must come from config.json (or --heads): refused without
    head_dim_keys: tuple[str, ...] = ("head_dim", "d_kv")  # config keys of head_dim (none: the width / heads)
    heads: tuple[str, ...] = ("num_attention_heads",)  # config keys of the query heads ("{side}": encoder | decoder)
    kv_heads: tuple[str, ...] = ()  # config keys of the K/V heads (empty: the heads keys)
    same_kv: bool = False  # as many K/V heads as query heads, whatever the config says
    eps: tuple[str, ...] = ()  # config keys of the pre-norm's eps (none: the norm's own default)
    post_norm: str | None = None  # a post-norm family's norm after the layer's prefix (default: its norm_name)
    qk: bool = False  # the family's QK-norm tensors may sit in the module (Persimmon's q_layernorm, k_layernorm)
    relative: str | None = None  # a relative position bias table after the module, else the first layer's (T5)
    only: bool = False  # the module holds these tensors only: any other one is another attention (refused)
    foreign: tuple[str, ...] = ()  # tensors after the module that mean another attention (BERT's distance embedding)
    bias_key: str | None = None  # a config key whose false means no biases (OPT's enable_bias): the tensors agree
    cross: str | None = None  # a cross-attention tensor after the layer's prefix, noted as not read
    notes: tuple[tuple[str, str], ...] = ()  # display notes (name, text)


def read_row(c: Ctx, row: Row, block: str | None = None) -> None:
    """One layer of a row layout: its projections (nn.Linear, or the fused per-head tensor), heads, relative bias
    table, norm; then the family's options by the resolver. ``block``: the prefix of the module that runs this layer
    when it is not the layer's own (ALBERT's shared groups)."""
    fam = c.family or FAMILIES[row.default]  # without config.json the read is refused where the tensors leave it open
    block = c.block if block is None else block
    a = block + row.module
    fused = None if fam.split_qkv else row.fused
    names = (fused,) if fused is not None else (row.q, row.k, row.v)
    if row.only:
        known = {f"{a}{n}.{p}" for n in (*names, row.o) for p in ("weight", "bias")}
        other = sorted(n for n in c.ckpt.tensors if n.startswith(a) and n not in known)
        if other:  # another family's QK-norm, a prompt, a rotary table: not this attention
            raise c.fail(f"has {other[0]} in {a.rstrip('.')}, which the {fam.model_type} declaration ({fam.layout} "
                         f"layout: {row.module}{'/'.join((*names, row.o))}) does not read")
    for n in row.foreign:
        if c.has(a + n):
            raise c.fail(f"has {a}{n}, another attention's tensor, which the {fam.model_type} declaration does not read")
    side = "encoder" if re.search(r"(^|\.)encoder\.", c.stack) else "decoder"
    heads = tuple(k.format(side=side) for k in row.heads)
    kv = tuple(k.format(side=side) for k in row.kv_heads) or heads
    if fused is None:
        for t, n in zip(QKV, names):
            c.linear(t, f"{a}{n}.weight", f"{a}{n}.bias")
        _heads(c, *heads, kv_keys=kv, width=c.arrays["W_q"].shape[1], dim_keys=row.head_dim_keys)
    else:
        _heads(c, *heads, kv_keys=kv, width=None, dim_keys=row.head_dim_keys)
    if row.needs_heads and c.facts.heads is None:
        raise c.fail(f"{a.rstrip('.')} fuses or splits its heads by {heads[0]}: put config.json beside it")
    if fused is not None and row.fused_by == "blocks":
        _fused_blocks(c, f"{a}{fused}.weight", f"{a}{fused}.bias")
    elif fused is not None:
        _fused_per_head(c, f"{a}{fused}.weight", f"{a}{fused}.bias")
    c.linear("W_o", f"{a}{row.o}.weight", f"{a}{row.o}.bias")
    if row.bias_key is not None and (c.config or {}).get(row.bias_key) is False and any(k in c.arrays for k in BIASES):
        raise c.fail(f"{fam.model_type}: config.json says {row.bias_key} false, but {a}{names[0]} has a bias")
    if row.same_kv:
        c.facts.kv_heads = c.facts.heads
    if row.relative is not None:  # UMT5 has one per layer; T5 only in layer 0, shared by all
        own, first = a + row.relative, f"{c.stack}0.{row.module}{row.relative}"
        table = own if c.has(own) else first
        if not c.has(table):
            raise c.fail(f"has no {first}: its relative position bias lives in layer 0 and every layer uses it")
        c.put("rel_bias", c.get(table), table)
    if row.qk:
        _qk_tensors(c, a, fam)
        if "q_norm" in c.arrays:  # an nn.LayerNorm over each head's features (Phi, Persimmon)
            c.facts.qk_norm = fam.qk_norm
            c.conf(norm_eps=("layer_norm_eps",), default=1e-5, cast=float)
    if row.cross is not None and c.has(block + row.cross):
        c.facts.notes["cross_attention"] = f"{block}{row.cross.rsplit('.', 2)[0]} (cross-attention) is not read"
    c.facts.notes.update(row.notes)
    _row_norm(c, fam, row.post_norm, row.eps, block)
    layer_options(c, fam, a)


def _fused_blocks(c: Ctx, name: str, bias: str) -> None:
    """A fused [Q; K; V] of three equal blocks by rows (ModernBERT's Wqkv: qkv.view(..., 3, H, d)); head_dim is
    each block's rows / heads."""
    w, H = c.get(name), c.facts.heads or 0
    if not H:
        raise c.fail(f"{name} fuses q, k and v, so the number of heads is needed: put config.json beside the weights")
    if w.ndim != 2 or w.shape[0] % 3 or (w.shape[0] // 3) % H:
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected (3·{H}·head_dim, E): [Q; K; V] by rows")
    n = w.shape[0] // 3
    if c.facts.head_dim is None:
        c.facts.head_dim = n // H
    _split_blocks(c, name, bias, (n, n, n))  # Q rows first, then K, then V


def _row_norm(c: Ctx, fam: Family, post: str | None, eps: tuple[str, ...], block: str | None = None) -> None:
    """The family's norm: none on the layers its norm_skip names (ModernBERT's layer 0: an nn.Identity), after the
    residual (post-norm: its row's pre_norm None, or its norm switch false, OPT's do_layer_norm_before), without
    weight and bias (its affine key false, OPT's layer_norm_elementwise_affine), or the pre-norm before (or inside)
    the attention module."""
    block = c.block if block is None else block
    cfg, ln = c.config or {}, block + fam.norm_name
    if fam.norm_skip is not None and fam.norm_skip(c.layer, cfg, _layer_type(c)):
        c.facts.notes["pre_norm"] = f"none: layer {c.layer}'s {fam.norm_name} is nn.Identity ({fam.model_type})"
        if c.has(ln + ".weight"):
            c.facts.notes["pre_norm_ignored"] = (f"{ln}.weight (layer {c.layer} has no {fam.norm_name}; transformers "
                                                 "ignores it)")
    elif fam.pre_norm is None or (fam.norm_switch is not None and cfg.get(fam.norm_switch, True) is False):
        _post_norm(c, block + post if post is not None else ln)
    elif fam.norm_affine is not None and cfg.get(fam.norm_affine) is False:  # nn.LayerNorm without parameters
        E = c.arrays["W_q"].shape[0]
        c.put("norm_w", np.ones(E), f"(none: {ln} has no weight, {fam.norm_affine} false; w = 1)")
        c.put("norm_b", np.zeros(E), f"(none: {ln} has no bias; b = 0)")
        c.facts.pre_norm, c.facts.pre_norm_eps, c.facts.norm_at = "layernorm", 1e-5, "before"
    else:
        _family_norm(c, fam, ln, eps)


def row_layout(name: str, marker: str, description: str, row: Row) -> None:
    """Register a checkpoint layout that is a declared row (no reader of its own)."""
    layout(name, marker, description)(lambda c: read_row(c, row))


@layout("llama", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.self_attn\.q_proj\.weight$",
        "Llama / Mistral / Qwen2 / Qwen3 / Gemma 1-3 / gpt-oss: self_attn.{q,k,v,o}_proj, q_norm, k_norm, sinks")
def _llama(c: Ctx) -> None:
    a = c.block + "self_attn."
    if not c.has(a + "o_proj.weight"):
        raise c.fail(f"has {a}q_proj.weight but no {a}o_proj.weight: not a Llama-style layer (see the layouts "
                     "attncli inspect lists)")
    fam = c.family
    if fam is not None and fam.gate is not None and fam.gate[0] == "q_proj":
        _q_and_gate(c, a)
    else:
        c.linear("W_q", f"{a}q_proj.weight", f"{a}q_proj.bias")
    for t, n in (("W_k", "k"), ("W_v", "v")):
        c.linear(t, f"{a}{n}_proj.weight", f"{a}{n}_proj.bias")
    _llama_rest(c, a)


def _q_and_gate(c: Ctx, a: str) -> None:
    """Qwen3-Next / Qwen3.5: q_proj (H·2d, E) holds, head by head, the head's query (d rows) then its output gate (d
    rows) (their forward: view (…, H, 2d), chunk in two): W_q and W_g, each (E, H·d) in the concatenated heads' order."""
    name = a + "q_proj.weight"
    w = c.get(name)
    _heads(c, "num_attention_heads", width=None)
    H, d = c.facts.heads, c.facts.head_dim
    if H is None or d is None or w.ndim != 2 or w.shape[0] != 2 * H * d:
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected (2·H·d, E) = query and gate per head, with H and d "
                     "from config.json (num_attention_heads, head_dim)")
    if c.has(a + "q_proj.bias"):
        raise c.fail(f"{a}q_proj.bias: a bias of the query and its output gate is not supported")
    r = w.reshape(H, 2, d, w.shape[1])  # (H, [q; gate], d, E)
    c.put("W_q", r[:, 0].reshape(H * d, -1).T, f"{name} rows [h·2d, h·2d + d) per head, ᵀ")
    c.put("W_g", r[:, 1].reshape(H * d, -1).T, f"{name} rows [h·2d + d, (h + 1)·2d) per head, ᵀ")


@layout("phi3", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.self_attn\.qkv_proj\.weight$",
        "Phi-3 / Phi-4: self_attn.qkv_proj = [Q (H·d); K (G·d); V (G·d)] by rows (nn.Linear), o_proj")
def _phi3(c: Ctx) -> None:
    a = c.block + "self_attn."
    name = a + "qkv_proj.weight"
    w = c.get(name)
    _heads(c, "num_attention_heads", width=None)
    f = c.facts
    if f.heads is None or w.ndim != 2:
        raise c.fail(f"{name} fuses q, k and v, so the number of heads is needed: put config.json beside the weights")
    if f.head_dim is None:
        E = w.shape[1]
        f.head_dim = E // f.heads if E % f.heads == 0 else None
    kv = f.kv_heads or f.heads
    d = f.head_dim or 0
    sizes = (f.heads * d, kv * d, kv * d)
    if w.shape[0] != sum(sizes):
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected ({sum(sizes)}, E): [Q ({f.heads}·{d}); "
                     f"K ({kv}·{d}); V ({kv}·{d})] by rows")
    _split_blocks(c, name, a + "qkv_proj.bias", sizes)
    _llama_rest(c, a)


def _llama_rest(c: Ctx, a: str, out: str = "o_proj") -> None:
    """Everything of a Llama-style layer after W_q, W_k, W_v: the output projection (``out``: o_proj; Phi's
    dense), QK-norm, sinks, heads, the family's rope, pre-norm, window and scale (its declaration in
    attncli.io.families; Llama's without a config)."""
    c.linear("W_o", f"{a}{out}.weight", f"{a}{out}.bias")
    fam = c.family or FAMILIES["llama"]  # a config.json or --layout names the family; bare weights are refused
    _qk_tensors(c, a, fam)
    if c.has(a + "sinks"):
        c.put("sinks", c.get(a + "sinks"), a + "sinks")
        c.facts.sinks = True
        c.facts.sink_form = c.family.sink_form if c.family is not None else None
    f, width, kv_width = c.facts, c.arrays["W_q"].shape[1], c.arrays["W_k"].shape[1]
    if f.heads is None:
        _heads(c, "num_attention_heads", width=None)
    if fam.heads_key is not None:
        _layer_heads(c, fam.heads_key)
    if f.head_dim is None:  # no head_dim in the config: a per-head q_norm's width, else the model width / heads
        f.head_dim = (c.arrays["q_norm"].shape[-1] if "q_norm" in c.arrays and fam.qk_norm != "rms-full"
                      else width // f.heads if f.heads and width % f.heads == 0 else None)
    if f.heads is None and f.head_dim:
        f.heads = width // f.head_dim
    if not f.config_gave("kv_heads") and f.head_dim:  # grouped-query heads follow from k_proj's width
        f.kv_heads = kv_width // f.head_dim
    if "q_norm" in c.arrays or _weightless_qk(c, fam):
        if fam.qk_norm is None:
            raise c.fail(f"{fam.model_type}: {a}{fam.qk_names[0]}.weight is a QK-norm its declaration does not have")
        c.facts.qk_norm = fam.qk_norm
        if fam.qk_at != "before-rope":
            c.facts.qk_norm_at = fam.qk_at
        if fam.qk_norm == "layernorm":  # nn.LayerNorm / CohereLayerNorm: layer_norm_eps, default 1e-5
            c.conf(norm_eps=("layer_norm_eps",), default=1e-5, cast=float)
        else:
            # LFM3's config class maps rms_norm_eps to norm_eps (attribute_map): its config.json has only norm_eps
            c.conf(norm_eps=("rms_norm_eps", "norm_eps"), default=1e-6, cast=float)
    c.facts.rms_wide = fam.rms_wide
    _family_norm(c, fam, c.block + fam.norm_name, ("rms_norm_eps", "layer_norm_eps", "norm_eps", "norm_epsilon"))
    layer_options(c, fam, a)


# ---- the resolver: (family, config.json, layer) -> the layer's options -------------------------------------------

@dataclass(frozen=True)
class LayerKind:
    """What config.json says of one layer, before any option is set: its layer_types entry, and whether the family
    leaves it without rotary (NoPE); and the attention module's prefix (its gate and sub-norm tensors)."""
    type: str | None
    nope: bool
    module: str
    by_rule: bool = False  # the type came from the family's layer-type rule, not config.json's layer_types


def layer_kind(fam: Family, config: dict[str, Any] | None, layer: int, source: str, module: str) -> LayerKind:
    """The layer's type and NoPE flag as the family's row declares them (layer_types required, nope rule)."""
    cfg = config or {}
    types = cfg.get("layer_types")
    lt = str(types[layer]) if isinstance(types, list) and layer < len(types) else None
    by_rule = lt is None and fam.layer_type is not None
    if lt is None and fam.layer_type is not None:  # the family's own rule (GPT-Neo's attention_layers, ModernBERT's
        lt = fam.layer_type(layer, config)  # global_attn_every_n_layers)
        if lt is None:
            raise InputError(f"{fam.model_type}: config.json does not say whether layer {layer} is global or local "
                             f"({printable(', '.join(sorted(fam.reads() - {'layer_types'})), 80)})", source)
    if fam.layer_types and lt is None:  # save_pretrained writes them; a config without them is not guessed
        raise InputError(f"{fam.model_type}: config.json has no layer_types entry for layer {layer}, which says "
                         "whether it slides (and, for some families, has rotary)", source)
    if fam.layer_kinds and lt not in fam.layer_kinds:
        raise InputError(f"{fam.model_type}: layer {layer} is a {printable(str(lt), 40)} layer, which its declaration "
                         "does not read", source)
    return LayerKind(lt, fam.nope is not None and fam.nope(layer, cfg, lt), module, by_rule)


def _rope_renamed(c: Ctx, fam: Family) -> None:
    """A rope_type the family's config class renames before computing (Phi3Config: su, yarn -> longrope) or does
    not accept: the renamed type is what the model computes, so it is the one checked; one it refuses is refused."""
    sc = c.facts.rope_scaling
    if sc is None:
        return
    kind = str(sc.get("rope_type", sc.get("type", "default")))
    key = c.facts.keys.get("rope_scaling", "rope_scaling")
    computed = dict(fam.rope_renamed).get(kind, kind)
    if computed != kind and computed not in ROPE_TYPES:
        raise c.fail(f"config.json {key}: {fam.model_type} computes rope_type {printable(kind, 30)} as {computed} "
                     "(its config class renames it), which is not supported")
    if fam.rope_types is not None and computed not in fam.rope_types:
        raise c.fail(f"config.json {key}: {fam.model_type}'s config class refuses rope_type {printable(kind, 30)} "
                     f"(it takes {' or '.join(sorted(fam.rope_types))})")


def _opt_rope(c: Ctx, fam: Family, k: LayerKind) -> None:
    """Rotary: the family's style, theta / scaling / partial width from the config (per layer type), HunYuan's NTK
    alpha, full-head rotary, Granite SWA's theta per layer; a NoPE layer has none."""
    cfg = c.config or {}
    if _alibi_on(c, fam):  # Falcon with alibi: no rotary
        return
    if fam.rope is not None and not k.nope and fam.rope_whole:
        _bert_rope(c, fam)
    elif fam.rope is not None and not k.nope:
        kind = fam.rope
        if fam.rope_switch is not None:  # the config classes' default: true (interleaved)
            kind = "half" if cfg.get(fam.rope_switch) is False else "interleaved"
        _rope(c, kind, layer_type=k.type)
        _rope_renamed(c, fam)
        if fam.rotary_key is not None:  # MLA: the rotary turns qk_rope_head_dim features (required)
            c.facts.rotary_dim = int(cfgcheck.value(cfg, fam.rotary_key, "config.json"))
        if fam.rope_alpha:
            _ntk_alpha(c)
        _full_rotary(c, fam)
        _type_theta(c, fam, k.type)
        if fam.theta_key is not None and isinstance(cfg.get(fam.theta_key), list):  # Granite SWA: base per layer
            thetas = cfg[fam.theta_key]
            if c.layer >= len(thetas) or not isinstance(thetas[c.layer], (int, float)):
                raise c.fail(f"config.json {fam.theta_key} has no rotary base for layer {c.layer}")
            c.facts.given(rope_base=float(thetas[c.layer]))
        if fam.partial_default is not None:
            _partial_default(c, fam.partial_default)
    elif fam.rope is not None:
        c.facts.notes["rope"] = f"none: layer {c.layer} is a NoPE layer of {fam.model_type} (no rotary)"


def _type_theta(c: Ctx, fam: Family, lt: str | None) -> None:
    """The rotary base of the layer's type from the family's per-type keys (ModernBERT's global_rope_theta,
    local_rope_theta, with their defaults) where rope_parameters gives none for the type; a key absent beside the
    one its default once followed (transformers 4: local_rope_theta defaulted to global_rope_theta) is refused."""
    cfg, params = c.config or {}, (c.config or {}).get("rope_parameters")
    for kind, key, default, beside in fam.type_theta:
        if kind != lt or (isinstance(params, dict) and isinstance(params.get(lt), dict)
                          and params[lt].get("rope_theta") is not None):
            continue
        if beside is not None and key not in cfg and cfg.get(beside) is not None:
            raise c.fail(f"{fam.model_type}: config.json has {beside} but no {key}, whose default differs between "
                         f"transformers 4 ({beside}) and 5 ({default:g})")
        c.facts.rope_base = float(cfgcheck.value(cfg, key, "config.json", default))
        if key in cfg:
            c.facts.given(rope_base=c.facts.rope_base)


def _opt_clip(c: Ctx, fam: Family, k: LayerKind) -> None:
    """OLMo's clip_qkv: q, k, v clamped to [-C, C]."""
    if "clip_qkv" in fam.reads():
        c.conf(clip_qkv=("clip_qkv",), cast=float)


def _opt_chunk(c: Ctx, fam: Family, k: LayerKind) -> None:
    """Llama 4's chunked layers: attention_chunk_size (required on them)."""
    if fam.chunked is not None and fam.chunked(c.layer, c.config or {}, k.type):
        size, key = _cfg(c.config, "attention_chunk_size")
        if key is None:
            raise c.fail(f"{fam.model_type}: layer {c.layer} is a chunked-attention layer but config.json has no "
                         "attention_chunk_size")
        c.facts.given(chunk=int(size))


def _opt_tuning(c: Ctx, fam: Family, k: LayerKind) -> None:
    """Llama 4's temperature tuning of q on its NoPE layers."""
    if "attn_temperature_tuning" in fam.reads() and k.nope and (c.config or {}).get("attn_temperature_tuning"):
        c.conf(tuning_scale=("attn_scale",), default=0.1, cast=float)  # Llama4TextConfig's defaults
        c.conf(tuning_floor=("floor_scale",), default=8192.0, cast=float)


def _opt_tensors(c: Ctx, fam: Family, k: LayerKind) -> None:
    """The tensors the family's row adds around the attention: an output gate (AFMoE, Laguna, LFM3, Qwen3-Next),
    BitNet's attn_sub_norm (an RMSNorm of the concatenated heads before o_proj)."""
    if fam.gate is not None and ("use_attention_gate" not in fam.reads()
                                 or (c.config or {}).get("use_attention_gate", True) is not False):
        _gate(c, fam, k.module)  # LFM3: use_attention_gate false builds no gate
    if fam.sub_norm is not None:
        name = f"{k.module}{fam.sub_norm}.weight"
        c.put("sub_norm", c.get(name), name)
        c.facts.sub_norm = "rms"
        c.conf(pre_norm_eps=("rms_norm_eps",), default=1e-6, cast=float)


def _opt_window(c: Ctx, fam: Family, k: LayerKind) -> None:
    _window(c, fam, k)  # after the chunk: a chunked layer without one is refused there


def _opt_scale(c: Ctx, fam: Family, k: LayerKind) -> None:
    """The score scale from the config key the family names (Gemma's query_pre_attn_scalar, Granite's
    attention_multiplier), then the soft-cap."""
    if fam.scale == "query_pre_attn_scalar":
        scalar, key = _cfg(c.config, "query_pre_attn_scalar")
        if key is not None:
            c.facts.given(scale=float(scalar) ** -0.5)
            c.facts.keys["scale"] = f"query_pre_attn_scalar {printable(str(scalar), 20)} (the scale is its ^-½)"
    elif fam.scale == "attention_multiplier":
        mult, key = _cfg(c.config, "attention_multiplier")  # required (Family.requires): set when there is a config
        if key is None:
            raise c.fail(f"{fam.model_type}: config.json has no attention_multiplier, the score scale")
        c.facts.given(scale=float(mult))
        c.facts.keys["scale"] = "attention_multiplier"
    elif fam.scale == "mscale":  # yarn_get_mscale: any rope scaling with mscale_all_dim multiplies it by mscale²
        sc, d = c.facts.rope_scaling or {}, c.facts.head_dim
        mad = sc.get("mscale_all_dim")
        if sc and mad and d:
            factor = float(sc.get("factor", 1.0))
            m = 0.1 * float(mad) * math.log(factor) + 1.0 if factor > 1 else 1.0
            c.facts.given(scale=d ** -0.5 * m * m)
    elif fam.scale == "none":  # GPTNeoSelfAttention._attn, T5Attention: q·k, never divided by sqrt(d)
        c.facts.scale = 1.0
        c.facts.notes["scale"] = f"1: {fam.model_type} does not scale the scores"
    elif fam.scale == "gpt2":  # GPT2Attention: / sqrt(d) unless scale_attn_weights false, / (layer + 1) if asked
        cfg, d = c.config or {}, c.facts.head_dim
        by_d, by_layer = cfg.get("scale_attn_weights", True), cfg.get("scale_attn_by_inverse_layer_idx", False)
        if (not by_d or by_layer) and d:
            c.facts.given(scale=(d ** -0.5 if by_d else 1.0) / (c.layer + 1 if by_layer else 1))
    c.conf(softcap=("attn_logit_softcapping",), cast=float)


def _opt_causal(c: Ctx, fam: Family, k: LayerKind) -> None:
    """Causality: the family's, or where its row says so config.json's is_decoder (BERT), the decoder's stack (T5),
    every stack but an encoder's (BART-style encoder-decoders)."""
    f, how = c.facts, fam.causal_from
    if how == "is_decoder":
        f.causal = bool((c.config or {}).get("is_decoder", False))
    elif how == "decoder-stack":
        f.causal = "decoder" in c.stack
    elif how == "encoder-stack":  # a decoder's self-attention: is_causal=True in every one of these families
        f.causal = re.search(r"(^|\.)encoder\.", c.stack) is None
        if not f.causal:
            f.notes["bidirectional"] = f"{fam.model_type}: the encoder's self-attention, every token sees every token"
    else:
        f.causal = fam.causal
        if not fam.causal:
            f.notes["bidirectional"] = f"{fam.model_type}: an encoder, every token sees every token"


def _opt_positions(c: Ctx, fam: Family, k: LayerKind) -> None:
    """position_embedding_type, where the family reads it: absolute (learned positions added to the embeddings,
    outside attention), or rotary for a rotary family; relative_key (BERT's distance embedding) is refused."""
    if "position_embedding_type" not in fam.reads():
        return
    pe = (c.config or {}).get("position_embedding_type", "absolute")
    if pe not in (None, "absolute", *(("rotary",) if fam.rope is not None else ())):
        raise c.fail(f"uses BERT's position_embedding_type {pe!r} (relative_key), which is not supported")


def _opt_relative(c: Ctx, fam: Family, k: LayerKind) -> None:
    """T5's bucketed relative position bias (the table the reader found): its buckets (default: the table's rows),
    its maximum distance (default 128), both directions in an encoder, the past only in a decoder."""
    if fam.relative != "t5":
        return
    f, cfg = c.facts, c.config or {}
    f.relative_bias = "t5"
    f.rel_buckets = int(cfg.get("relative_attention_num_buckets") or c.arrays["rel_bias"].shape[0])
    f.rel_max_distance = int(cfg.get("relative_attention_max_distance") or 128)
    f.rel_bidirectional = not f.causal


def _opt_alibi(c: Ctx, fam: Family, k: LayerKind) -> None:
    """ALiBi added unscaled after the scale, in the family's form (Bloom: build_alibi_tensor, fl32(slope_h · j) at
    key j's absolute position, torch.baddbmm in modeling_bloom.py)."""
    if not _alibi_on(c, fam):
        return
    f = c.facts
    if fam.alibi_key is not None:
        f.given(alibi=True)
    f.alibi, f.alibi_form, f.alibi_scaled = True, fam.alibi, fam.alibi_scaled
    if fam.alibi_scaled:  # Falcon: build_alibi_tensor in bfloat16, added before FalconAttention's 1/sqrt(d)
        f.notes["alibi"] = ("scaled with the scores: (q·k + bf16(bf16(slope_h)·bf16(j))) / sqrt(d) "
                            "(modeling_falcon.py), added by attncli as fl32(bf16(...) / sqrt(d)) after its scale; "
                            "transformers' eager path (output_attentions) adds alibi / sqrt(d) once more through "
                            "the mask FalconModel builds, its SDPA path and Falcon-RW's own code do not: attncli "
                            "adds it once")
    else:
        f.notes["alibi"] = (f"added unscaled: scores = alibi + (q·k)/sqrt(d), ALiBi form {fam.alibi} at key j's "
                            "absolute position")


def _alibi_on(c: Ctx, fam: Family) -> bool:
    """ALiBi on this layer: the family has it, and its config switch (if any) is on (then no rotary)."""
    return fam.alibi is not None and (fam.alibi_key is None or bool((c.config or {}).get(fam.alibi_key)))


# The resolver's steps, in the order their facts depend on each other (the window reads the chunk)
# (causality first: T5's relative buckets read it); every step is a no-op unless the family's row declares its fact
# (a config key a row does not read is refused before reading when it is not neutral: families.unsupported_key)
RESOLVE_STEPS: tuple[Callable[[Ctx, Family, LayerKind], None], ...] = (
    _opt_causal, _opt_positions, _opt_rope, _opt_clip, _opt_chunk, _opt_tuning, _opt_tensors, _opt_window,
    _opt_scale, _opt_relative, _opt_alibi)


def layer_options(c: Ctx, fam: Family, module: str,
                  steps: tuple[Callable[[Ctx, Family, LayerKind], None], ...] = RESOLVE_STEPS) -> None:
    """The one resolver: (family, config.json, layer) -> the layer's options (rotary, clamp, chunk, tuning, window,
    scale, soft-cap), each step reading only the family's row and the config, after the reader has set the tensors,
    heads and norm."""
    k = layer_kind(fam, c.config, c.layer, c.ckpt.source, module)
    for step in steps:
        step(c, fam, k)


def _full_rotary(c: Ctx, fam: Family) -> None:
    """After _rope, for the families whose rotary covers the whole head (ModernBERT, UltraBERT: their own
    compute_default_rope_parameters takes head_dim, whatever partial_rotary_factor says): rotary_dim = head_dim;
    scaling other than linear (checked against ModernBertRotaryEmbedding) is refused, and so is a partial factor
    beside it (transformers' shared scaling functions read it)."""
    f = c.facts
    if not fam.full_rotary or f.rope is None:
        return
    f.rotary_dim = f.head_dim
    f.unmark_config("rotary_dim")
    f.keys["rotary_dim"] = "head_dim"
    sc = f.rope_scaling or {}
    kind = sc.get("rope_type", sc.get("type"))
    if f.rope_scaling is not None and (kind != "linear" or sc.get("partial_rotary_factor") is not None):
        raise c.fail(f"{fam.model_type}: rope_parameters rope_type {printable(str(kind), 30)} (rotary scaling) is not "
                     "supported on its layers")


def _layer_heads(c: Ctx, key: str) -> None:
    """Query heads per layer from a config list (Laguna's num_attention_heads_per_layer): this layer's entry."""
    per = (c.config or {}).get(key)
    if per is None or c.heads_hint is not None:
        return
    if not isinstance(per, list) or c.layer >= len(per) or not isinstance(per[c.layer], int) or per[c.layer] < 1:
        raise c.fail(f"config.json {key} has no head count for layer {c.layer}")
    c.facts.given(heads=int(per[c.layer]))


def _gate(c: Ctx, fam: Family, a: str) -> None:
    """An output gate's weight (AFMoE gate_proj, Laguna g_proj): (H·d, E), one gate per feature of the concatenated
    heads, or (H, E), one per head; Laguna's gating (true / per-head: per head) must agree with its shape."""
    assert fam.gate is not None
    tensor, act = fam.gate
    if tensor == "q_proj":  # W_g read with W_q (_q_and_gate): one gate per feature
        c.facts.gate = act
        return
    name = f"{a}{tensor}.weight"
    c.linear("W_g", name)  # (n, E) -> (E, n)
    if c.has(f"{a}{tensor}.bias"):
        raise c.fail(f"{fam.model_type}: {a}{tensor}.bias is a gate bias its declaration does not have")
    f, n = c.facts, c.arrays["W_g"].shape[1]
    width = c.arrays["W_q"].shape[1]
    cfg = c.config or {}
    if "gating" in cfg:
        per_head = cfg["gating"] is True or cfg["gating"] == "per-head"
        want = f.heads if per_head else width
        if n != want:
            raise c.fail(f"{name} has {n} outputs but config.json gating = {cfg['gating']!r} means one gate per "
                         f"{'head' if per_head else 'feature'} ({want})")
    elif fam.gate_heads and n != f.heads:  # LFM3's g_proj: one gate per head
        raise c.fail(f"{name} has {n} outputs; expected {f.heads}, one gate per head")
    elif not fam.gate_heads and n != width:
        raise c.fail(f"{name} has {n} outputs; expected {width}, one gate per feature of the concatenated heads")
    f.gate = act


def _ntk_alpha(c: Ctx) -> None:
    """HunYuan: rope_type dynamic with an ``alpha`` is a fixed base theta · alpha^(d / (d - 2)), whatever the
    sequence length (its compute_ntk_alpha_rope_parameters), not dynamic NTK scaling."""
    f, sc = c.facts, c.facts.rope_scaling
    if not sc or sc.get("rope_type", sc.get("type")) != "dynamic" or sc.get("alpha") is None:
        return
    d = f.head_dim
    if not d or d <= 2:
        raise c.fail(f"rope_parameters alpha needs a head_dim above 2 (head_dim {d})")
    f.rope_base = float(f.rope_base or 10000.0) * float(sc["alpha"]) ** (d / (d - 2))
    f.rope_scaling = None
    f.unmark_config("rope_scaling")
    f.notes["rope"] = f"rope_parameters alpha {sc['alpha']:g}: base theta · alpha^(d/(d-2)) = {f.rope_base:g}"


def _qk_tensors(c: Ctx, a: str, fam: Family) -> None:
    """The QK-norm's weights (and LayerNorm biases) under the family's names: NAME.weight ((d,), (H, d) or (H·d,)),
    or one nn.LayerNorm per head, NAME.norms.h.weight (StableLM), stacked (H, d). Its config switch (qk_layernorm,
    use_qk_norm) must agree with the tensors."""
    for n, name in zip(("q_norm", "k_norm"), fam.qk_names):
        base = f"{a}{name}"
        if c.has(base + ".weight"):
            c.put(n, c.get(base + ".weight"), base + ".weight")
            if c.has(base + ".bias"):
                c.put(n + "_bias", c.get(base + ".bias"), base + ".bias")
        elif c.has(base + ".norms.0.weight"):  # a ModuleList of per-head norms
            heads = [c.get(f"{base}.norms.{h}.weight") for h in range(_count(c, base + ".norms.", ".weight"))]
            c.put(n, np.stack(heads), f"{base}.norms.{{0..{len(heads) - 1}}}.weight stacked (heads, d)")
            if c.has(base + ".norms.0.bias"):
                c.put(n + "_bias", np.stack([c.get(f"{base}.norms.{h}.bias") for h in range(len(heads))]),
                      f"{base}.norms.{{0..{len(heads) - 1}}}.bias stacked (heads, d)")
    if ("q_norm" in c.arrays) != ("k_norm" in c.arrays):
        have, lack = (fam.qk_names if "q_norm" in c.arrays else fam.qk_names[::-1])
        raise c.fail(f"{fam.model_type}: layer {c.layer} has {a}{have} but no {a}{lack}: a QK-norm needs both")
    if fam.qk_key is not None and c.config is not None and fam.qk_key in c.config and not fam.qk_weightless:
        on = bool(c.config[fam.qk_key])
        if on != ("q_norm" in c.arrays):
            raise c.fail(f"config.json says {fam.qk_key} = {str(on).lower()} but layer {c.layer} "
                         f"{'has no' if on else 'has'} {a}{fam.qk_names[0]} tensors")


def _weightless_qk(c: Ctx, fam: Family) -> bool:
    """A weightless QK-norm on this layer: the family has one, its config switch (if any) is on, the layer is one
    of those it applies to."""
    cfg = c.config or {}
    return fam.qk_weightless and (fam.qk_key is None or bool(cfg.get(fam.qk_key))) and (
        fam.qk_layers is None or fam.qk_layers(c.layer, cfg, _layer_type(c)))


def _count(c: Ctx, prefix: str, suffix: str) -> int:
    """How many consecutive PREFIX{i}SUFFIX tensors the checkpoint holds from i = 0."""
    i = 0
    while c.has(f"{prefix}{i}{suffix}"):
        i += 1
    return i


def _family_norm(c: Ctx, fam: Family, w: str, eps_keys: tuple[str, ...]) -> None:
    """The family's pre-attention norm from its tensor ``w`` (+ bias): rms, rms1p, layernorm, layernorm1p
    (Nemotron: LayerNorm with 1 + w, read as a LayerNorm of weight 1 + w). None: nothing before attention."""
    kind = fam.pre_norm
    if kind is None:
        c.facts.notes["pre_norm"] = f"none: {fam.model_type} applies no norm before attention"
        c.facts.norm_at = "after"
        return
    if kind == "layernorm-weightless":  # OLMo: nn.LayerNorm without parameters (w = 1, b = 0), eps 1e-5
        E = c.arrays["W_q"].shape[0]
        c.put("norm_w", np.ones(E), f"(none: {fam.model_type}'s LayerNorm has no weight; w = 1)")
        c.put("norm_b", np.zeros(E), f"(none: {fam.model_type}'s LayerNorm has no bias; b = 0)")
        c.facts.pre_norm, c.facts.pre_norm_eps, c.facts.norm_at = "layernorm", 1e-5, "before"
        return
    if kind == "rms-weightless":  # nanochat: an RMSNorm without a weight (w = 1), eps rms_norm_eps
        E = c.arrays["W_q"].shape[0]
        c.put("norm_w", np.ones(E), f"(none: {fam.model_type}'s RMSNorm has no weight; w = 1)")
        c.facts.pre_norm, c.facts.norm_at = "rms", "before"
        c.conf(pre_norm_eps=("rms_norm_eps",), default=1e-6, cast=float)
        return
    c.facts.norm_at = fam.norm_at
    if fam.norm_at == "inside":
        c.facts.notes["norm_at"] = f"{w}: inside the attention module; X is the query projection's input, and " \
                                   "--from-residual applies it"
    wn, bn = (".gamma", ".beta") if not c.has(w + ".weight") and c.has(w + ".gamma") else (".weight", ".bias")
    if not c.has(w + wn):  # plain runs need no norm; --from-residual is refused (model.py)
        c.facts.norm_missing = f"{w}.weight ({fam.model_type}'s pre-attention {kind})"
        return
    bias = w + bn if kind.startswith("layernorm") else None  # ESM saves its LayerNorms as gamma / beta
    _norm(c, "layernorm" if kind == "layernorm1p" else kind, w + wn, bias, eps_keys=eps_keys,
          eps=1e-5 if kind.startswith("layernorm") else 1e-6)
    if kind == "layernorm1p":
        c.put("norm_w", 1.0 + np.asarray(c.arrays["norm_w"], np.float64), f"1 + {w}{wn} (LayerNorm1p)")


def _partial_default(c: Ctx, default: float) -> None:
    """After _rope: the family's partial_rotary_factor ``default`` when config.json says none (Phi and
    Persimmon: 0.5, set by their config classes), rotary on the first head_dim · default features."""
    if not c.facts.config_gave("rotary_dim") and c.facts.head_dim:
        c.facts.rotary_dim = int(c.facts.head_dim * default)
        c.facts.keys["rotary_dim"] = f"head_dim {c.facts.head_dim} × the family's partial_rotary_factor {default}"
        c.facts.notes["rotary_dim"] = f"partial_rotary_factor {default} (the family's default; config.json has none)"


@layout("mla", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.self_attn\.kv_a_proj_with_mqa\.weight$",
        "DeepSeek-V2/V3 multi-head latent attention: self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj}, "
        "kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj")
def _mla(c: Ctx) -> None:
    """MLA (attncli.core.projections.Latent), as DeepseekV3Attention.forward: W_qa = q_a_projᵀ, q_a_norm =
    q_a_layernorm, W_q = q_b_projᵀ (or q_projᵀ); W_kva = kv_a_proj_with_mqaᵀ, kv_a_norm = kv_a_layernorm; kv_b_proj's
    rows per head [k_nope (n); v (d_v)] split into W_k and W_v; the latents' RMSNorms have eps 1e-6 (their modules'
    default, not rms_norm_eps). Widths and rotary from config.json (it is required)."""
    a, fam, cfg = c.block + "self_attn.", c.family, c.config or {}
    if fam is None or fam.layout != "mla" or not cfg:
        raise c.fail("holds multi-head latent attention (kv_a_proj_with_mqa), whose widths only config.json says: put "
                     "config.json beside the weights")
    dims = {}
    for k, _ in fam.requires:  # every one set: checked by resolve_family (Family.missing)
        v, _ = _cfg(cfg, k)
        dims[k] = int(v)
    n, r, dv, r_kv, H = (dims[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
                                            "num_attention_heads"))
    kvh, _ = _cfg(cfg, "num_key_value_heads")
    if kvh is not None and int(kvh) != H:
        raise c.fail(f"{fam.model_type}: num_key_value_heads {kvh} differs from num_attention_heads {H}, which its "
                     "latent attention (one K and V per head) does not support")
    hd, _ = _cfg(cfg, "head_dim")
    if hd is not None and int(hd) != r:  # HF's rotary tables are head_dim · partial_rotary_factor wide
        raise c.fail(f"{fam.model_type}: head_dim {hd} differs from qk_rope_head_dim {r}, the width its rotary turns")
    rp_ = cfg.get("rope_parameters")
    rp: dict[str, Any] = rp_ if isinstance(rp_, dict) else {}
    for prf in (cfg.get("partial_rotary_factor"), rp.get("partial_rotary_factor")):
        if prf is not None and float(prf) != 1.0:
            raise c.fail(f"{fam.model_type}: partial_rotary_factor {prf} is not supported with latent attention")
    if c.has(a + "q_a_proj.weight"):
        c.linear("W_qa", a + "q_a_proj.weight")
        if c.has(a + "q_a_proj.bias"):
            c.put("b_qa", c.get(a + "q_a_proj.bias"), a + "q_a_proj.bias")
        c.put("q_a_norm", c.get(a + "q_a_layernorm.weight"), a + "q_a_layernorm.weight")
        c.linear("W_q", a + "q_b_proj.weight")
    else:
        c.linear("W_q", a + "q_proj.weight")
    c.linear("W_kva", a + "kv_a_proj_with_mqa.weight")
    if c.has(a + "kv_a_proj_with_mqa.bias"):
        c.put("b_kva", c.get(a + "kv_a_proj_with_mqa.bias"), a + "kv_a_proj_with_mqa.bias")
    c.put("kv_a_norm", c.get(a + "kv_a_layernorm.weight"), a + "kv_a_layernorm.weight")
    name = a + "kv_b_proj.weight"
    kvb = c.get(name)
    if kvb.shape != (H * (n + dv), r_kv):
        raise c.fail(f"tensor {name!r} has shape {kvb.shape}; expected ({H * (n + dv)}, {r_kv}): per head "
                     f"[k_nope ({n}); v ({dv})] rows of kv_lora_rank {r_kv} inputs")
    per_head = kvb.reshape(H, n + dv, r_kv)  # rows (H·(n+d_v), r_kv) -> (H, n+d_v, r_kv)
    c.put("W_k", per_head[:, :n].reshape(H * n, r_kv).T, f"{name} rows [k_nope] of each head (the first {n} of "
          f"every {n + dv})ᵀ")
    c.put("W_v", per_head[:, n:].reshape(H * dv, r_kv).T, f"{name} rows [v] of each head (the last {dv} of every "
          f"{n + dv})ᵀ")
    c.linear("W_o", a + "o_proj.weight", a + "o_proj.bias")
    for t, want in (("W_q", (None, H * (n + r))), ("W_kva", (None, r_kv + r))):
        if c.arrays[t].shape[1] != want[1]:
            raise c.fail(f"{c.origin[t]} gives {c.arrays[t].shape[1]} features; config.json's widths say {want[1]}")
    f = c.facts
    f.heads, f.head_dim = H, n + r  # K and V: one per query head (kv_heads left unset: not an option here)
    f.mark_config("heads", "head_dim")
    f.latent = (n, r, 1e-6)
    f.notes["latent"] = (f"q {'q_a_proj, q_a_layernorm, q_b_proj' if 'W_qa' in c.arrays else 'q_proj'}; "
                         f"kv_lora_rank {r_kv}; per head q/k {n} + {r} rotary (placed first), v {dv}")
    _family_norm(c, fam, c.block + fam.norm_name, ("rms_norm_eps",))
    layer_options(c, fam, a)  # rotary on qk_rope_head_dim features (style: rope_interleave), the mscale


@layout("phi", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.self_attn\.dense\.weight$",
        "Phi-1 / 1.5 / 2: self_attn.{q,k,v}_proj, self_attn.dense (nn.Linear, biases); partial half rotary")
def _phi(c: Ctx) -> None:
    a = c.block + "self_attn."
    if not c.has(a + "q_proj.weight"):
        raise c.fail(f"has {a}dense.weight but no {a}q_proj.weight: not a Phi layer (see the layouts attncli "
                     "inspect lists)")
    c.linears(a, "q_proj", "k_proj", "v_proj")
    _llama_rest(c, a, out="dense")  # q_layernorm / k_layernorm under the declaration's qk_names


row_layout("persimmon", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.self_attn\.query_key_value\.weight$",
        "Persimmon: self_attn.query_key_value fused, rows (H, 3, d); self_attn.dense; partial half rotary",
           Row("persimmon", "self_attn.", fused="query_key_value", o="dense", same_kv=True, qk=True,
               eps=("layer_norm_eps",)))


@layout("gpt2", r"^(?P<stack>(?:.*\.)?h\.)(?P<n>\d+)\.attn\.c_attn\.weight$",
        "GPT-2: attn.c_attn (E, 3E) Conv1D = [Q | K | V] by columns, attn.c_proj (nanoGPT's nn.Linear (3E, E) too)")
def _gpt2(c: Ctx) -> None:
    a = c.block + "attn."
    w, name = c.get(a + "c_attn.weight"), a + "c_attn.weight"
    if w.ndim != 2:
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected (E, 3E)")
    if c.family is not None and c.family.fused == "linear":
        _bigcode(c, a, w, name)
        return
    if w.shape[1] == 3 * w.shape[0]:  # Conv1D (in, out): HF GPT-2
        E, conv = w.shape[0], True
    elif w.shape[0] == 3 * w.shape[1]:  # nn.Linear (out, in): nanoGPT
        E, conv = w.shape[1], False
        if c.config is not None and c.family is not None:  # GPT-2, GPT-SW3, OpenAI GPT: HF's Conv1D, never a Linear
            raise c.fail(f"{name} has shape {w.shape}, an nn.Linear (3E, E), but config.json says model_type "
                         f"{c.family.model_type}, whose Conv1D stores (E, 3E)")
    else:
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected (E, 3E) (GPT-2 Conv1D) or (3E, E) (nanoGPT Linear)")
    _split_blocks(c, name, a + "c_attn.bias", (E, E, E), conv1d=conv)
    o = c.get(a + "c_proj.weight")
    c.put("W_o", o if conv else o.T, f"{a}c_proj.weight" + ("" if conv else "ᵀ"))
    if c.has(a + "c_proj.bias"):
        c.put("b_o", c.get(a + "c_proj.bias"), a + "c_proj.bias")
    _heads(c, "n_head", "num_attention_heads", kv_keys=("n_head", "num_attention_heads"), width=E)
    fam = c.family or FAMILIES["gpt2"]  # nanoGPT's bare weights: GPT-2's declaration
    _row_norm(c, fam, None, ("layer_norm_epsilon",))  # OpenAI GPT: post-LN, ln_1 comes after attention
    layer_options(c, fam, a)
    c.name = "gpt2" if conv else "nanogpt"


def _bigcode(c: Ctx, a: str, w: np.ndarray, name: str) -> None:
    """GPT-BigCode's c_attn, an nn.Linear (out, in): multi_query [Q (E); k (d); v (d)] by rows (one K/V head),
    else rows (H, 3, d) per head (its forward views the output as (H, 3·d) and splits each head's part)."""
    _heads(c, "n_head", "num_attention_heads", kv_keys=("n_head",), width=None)
    f, cfg = c.facts, c.config or {}
    H, E = f.heads, w.shape[1]
    if H is None or E % H:
        raise c.fail(f"{name}: config.json's n_head does not divide the width {E}")
    d = E // H
    f.head_dim = d
    if cfg.get("multi_query", True):
        if w.shape[0] != E + 2 * d:
            raise c.fail(f"tensor {name!r} has shape {w.shape}; expected ({E + 2 * d}, {E}): [Q; k; v] (multi_query)")
        _split_blocks(c, name, a + "c_attn.bias", (E, d, d))  # [Q; k; v] by rows
        f.given(kv_heads=1)
    else:
        _fused_per_head(c, name, a + "c_attn.bias")
        f.kv_heads = H
    c.linear("W_o", a + "c_proj.weight", a + "c_proj.bias")
    fam = c.family or FAMILIES["gpt_bigcode"]
    _row_norm(c, fam, None, ("layer_norm_epsilon",))
    layer_options(c, fam, a)
    c.name = "gpt_bigcode"


row_layout("gptj", r"^(?P<stack>(?:.*\.)?h\.)(?P<n>\d+)\.attn\.q_proj\.weight$",
        "GPT-J: attn.{q,k,v,out}_proj (nn.Linear, no biases), rotary interleaved on the first rotary_dim features",
           Row("gptj", "attn.", o="out_proj", heads=("n_head", "num_attention_heads"), kv_heads=("n_head",),
               eps=("layer_norm_epsilon",)))


row_layout("gpt_neo", r"^(?P<stack>(?:.*\.)?h\.)(?P<n>\d+)\.attn\.attention\.q_proj\.weight$",
        "GPT-Neo: attn.attention.{q,k,v,out}_proj (nn.Linear, q/k/v without bias); no score scaling; local layers",
           Row("gpt_neo", "attn.attention.", o="out_proj", heads=("num_heads", "num_attention_heads"),
               eps=("layer_norm_epsilon",)))


row_layout("bert", r"^(?P<stack>(?:.*\.)?encoder\.layer\.)(?P<n>\d+)\.attention\.self\.query\.weight$",
        "BERT / RoBERTa: attention.self.{query,key,value}, attention.output.dense (nn.Linear); post-norm",
           Row("bert", "attention.", "self.query", "self.key", "self.value", "output.dense", eps=("layer_norm_eps",),
               post_norm="attention.output.LayerNorm", foreign=("self.distance_embedding.weight",)))


def _bert_rope(c: Ctx, fam: Family) -> None:
    """RoFormer's and ESM's rotary, over the whole head and without scaling, whatever else config.json says (their
    modeling files read no partial factor or scaling): RoFormer's stored table is base 10000 (checked), ESM's base
    is rope_theta (default 10000)."""
    f = c.facts
    f.rope, f.rotary_dim = fam.rope, f.head_dim
    if fam.rope_table:
        f.rope_base = 10000.0
        _sinusoidal_table(c)
    else:
        c.conf(rope_base=("rope_theta",), default=10000.0, cast=float)


def _sinusoidal_table(c: Ctx) -> None:
    """RoFormer keeps its rotary table as a weight, encoder.embed_positions.weight (P, d): sin(pos · 10000^(-2i/d))
    in columns 0..d/2-1, cos in d/2..d-1 (RoFormerSinusoidalPositionalEmbedding), and HF computes with the stored
    one. attncli computes the interleaved RoPE of that formula: a stored table that is not it is refused."""
    name = c.stack[: -len("layer.")] + "embed_positions.weight"
    if not c.has(name):  # HF builds it from the formula when the checkpoint lacks it
        return
    table = c.get(name)
    d = c.facts.head_dim
    if table.ndim != 2 or d is None or table.shape[1] != d or d % 2:
        raise c.fail(f"{name} has shape {table.shape}; expected (positions, {d}), the sinusoidal rotary table")
    pos = np.arange(table.shape[0], dtype=np.float64)[:, None] * 10000.0 ** (-2.0 * np.arange(d // 2) / d)  # (P, d/2)
    want = np.concatenate([np.sin(pos), np.cos(pos)], axis=1)  # (P, d)
    got = np.asarray(table.astype(np.float64))
    tol = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}.get(table.dtype.name, 2.0 ** -22)  # twice the rounding
    err = float(np.abs(got - want).max(initial=0.0))
    if not err <= tol:
        raise c.fail(f"{name} is not the sinusoidal rotary table sin/cos(pos · 10000^(-2i/{d})) (off by {err:.3g}), "
                     "which attncli computes; it is not supported")
    c.facts.notes["rope_table"] = f"{name}: the sinusoidal table, interleaved RoPE base 10000 (checked)"


QKV = ("W_q", "W_k", "W_v")


def _split_blocks(c: Ctx, name: str, bias: str | None, sizes: tuple[int, int, int], conv1d: bool = False) -> None:
    """A fused [Q; K; V]: blocks of ``sizes`` one after another, by rows of an nn.Linear (out, in) (Phi-3 qkv_proj,
    ModernBERT Wqkv, nanoGPT and GPT-BigCode c_attn) or by columns of a Conv1D (in, out) (GPT-2 c_attn)."""
    w = c.get(name)
    b = c.get(bias) if bias is not None and c.has(bias) else None
    lo = 0
    for t, n in zip(QKV, sizes):
        if conv1d:
            c.put(t, w[:, lo:lo + n], f"{name}[:, {lo}:{lo + n}]")  # Conv1D (in, out): already textbook
        else:
            c.put(t, w[lo:lo + n].T, f"{name}[{lo}:{lo + n}]ᵀ")  # rows (out) -> columns (in, out)
        if b is not None:
            c.put("b_" + t[-1], b[lo:lo + n], f"{bias}[{lo}:{lo + n}]")
        lo += n


def _split_groups(c: Ctx, name: str, bias: str, H: int, G: int, d: int) -> None:
    """A fused q/k/v whose rows are (G, H/G + 2, d): per K/V group its H/G query heads, then its k, then its v
    (Falcon); G = H is (H, 3, d), each head's q, k, v (GPT-NeoX, Bloom, Persimmon, GPT-BigCode per head)."""
    w = c.get(name)
    E, r = w.shape[1], H // G + 2
    w4 = w.reshape(G, r, d, E)  # rows ((H + 2G)·d) -> (G, H/G + 2, d)
    b3 = c.get(bias).reshape(G, r, d) if c.has(bias) else None
    for t, s, n in zip(QKV, (slice(0, r - 2), slice(r - 2, r - 1), slice(r - 1, r)), (H, G, G)):
        if G == H:
            where, bwhere = f"{name} rows (H={H}, 3, d={d})[:, {s.start}]ᵀ", f"{bias} (H, 3, d)[:, {s.start}]"
        else:
            where = f"{name} rows (G={G}, H/G+2={r}, d={d})[:, {s.start}:{s.stop}]ᵀ"
            bwhere = f"{bias} (G, H/G+2, d)[:, {s.start}:{s.stop}]"
        c.put(t, w4[:, s].reshape(n * d, E).T, where)  # (G, ., d, E) -> (E, n·d)
        if b3 is not None:
            c.put("b_" + t[-1], b3[:, s].reshape(n * d), bwhere)


def _fused_per_head(c: Ctx, name: str, bias: str) -> None:
    """query_key_value (H·3·d, E) with rows (H, 3, d): GPT-NeoX and Bloom."""
    w = c.get(name)
    H = c.facts.heads
    if H is None:
        raise c.fail(f"{name} interleaves q, k, v per head, so the number of heads is needed: put config.json "
                     "beside the weights or give --heads")
    if w.ndim != 2 or w.shape[0] % (3 * H):
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected ({H}·3·d, E) for {H} heads")
    d = w.shape[0] // (3 * H)
    if c.facts.head_dim not in (None, d):
        raise c.fail(f"tensor {name!r} has shape {w.shape}: head_dim {d}, but the config says {c.facts.head_dim}")
    c.facts.head_dim = d
    _split_groups(c, name, bias, H, H, d)


row_layout("neox", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.attention\.query_key_value\.weight$",
        "GPT-NeoX / Pythia: attention.query_key_value fused, rows (H, 3, d); attention.dense; partial rotary",
           Row("gpt_neox", "attention.", fused="query_key_value", o="dense", same_kv=True,
               eps=("layer_norm_eps",)))


@layout("bloom", r"^(?P<stack>(?:.*\.)?h\.)(?P<n>\d+)\.self_attention\.query_key_value\.weight$",
        "Bloom: self_attention.query_key_value fused, rows (H, 3, d); self_attention.dense; ALiBi. "
        "Falcon (model_type falcon): the same names, rows (G, H/G + 2, d)")
def _bloom(c: Ctx) -> None:
    a = c.block + "self_attention."
    if c.family is not None and c.family.fused == "groups":
        _falcon(c, a)
        return
    mt = (c.config or {}).get("model_type")
    if mt is None and not any(k.endswith("word_embeddings_layernorm.weight") for k in c.ckpt.tensors):
        raise c.fail("holds self_attention.query_key_value as Bloom and Falcon both name it; without config.json "
                     "(model_type, heads, multi_query, new_decoder_architecture, alibi) it is not read: put "
                     "config.json beside it")
    read_row(c, BLOOM)


BLOOM = Row("bloom", "self_attention.", fused="query_key_value", o="dense", heads=("n_head", "num_attention_heads"),
            kv_heads=("n_head",), same_kv=True, eps=("layer_norm_epsilon",))


def _falcon(c: Ctx, a: str) -> None:
    """Falcon's query_key_value (nn.Linear): rows (G, H/G + 2, d), per K/V group its H/G query heads, then k, v
    (FalconAttention._split_heads). new_decoder_architecture: G = num_kv_heads; else multi_query: G = 1
    ([Q (H·d); k (d); v (d)]); else G = H ((H, 3, d) per head, as Bloom). head_dim = hidden_size / H."""
    cfg, fam = c.config, c.family
    name = a + "query_key_value.weight"
    w = c.get(name)
    _heads(c, "num_attention_heads", "n_head", kv_keys=(), width=None)
    f = c.facts
    H = f.heads
    if H is None:
        raise c.fail(f"{name} fuses q, k and v per K/V group, so the number of heads is needed: put config.json "
                     "beside the weights or give --heads")
    if w.ndim != 2 or w.shape[1] % H:
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected ((H + 2·G)·d, E) with E divisible by {H} heads")
    E = w.shape[1]
    d = E // H  # FalconAttention: head_dim = hidden_size // num_heads, whatever head_dim says
    rows = w.shape[0]
    if cfg is None:  # --layout falcon on bare weights: the three variants are all (G, H/G + 2, d); the rows say G
        G, what = (rows // d - H) // 2, "G from the rows"
    elif cfg.get("new_decoder_architecture"):
        G = int(cfgcheck.value(cfg, "num_kv_heads", "config.json") or H)
        what = f"new_decoder_architecture, num_kv_heads {G}"
        f.mark_config("kv_heads")
    elif cfg.get("multi_query", True):
        G, what = 1, "multi_query"
        f.mark_config("kv_heads")
    else:
        G, what = H, "per-head (multi_query false)"
        kv = cfg.get("num_kv_heads")
        if kv is not None and int(cfgcheck.value(cfg, "num_kv_heads", "config.json")) != H:
            raise c.fail(f"falcon: num_kv_heads {kv} with multi_query and new_decoder_architecture false: its "
                         f"query_key_value holds k and v for all {H} heads (transformers cannot run it either)")
    if cfg is not None and (G < 1 or H % G):
        raise c.fail(f"falcon: num_kv_heads {G} does not divide num_attention_heads {H} (each K/V group serves "
                     "H/G query heads)")
    if G < 1 or H % G or rows != (H + 2 * G) * d:
        raise c.fail(f"tensor {name!r} has shape {w.shape}; expected ({(H + 2 * max(G, 1)) * d}, {E}) = "
                     f"(G, H/G + 2, d) rows for {H} heads of {d} ({what})")
    _split_groups(c, name, a + "query_key_value.bias", H, G, d)
    c.linear("W_o", a + "dense.weight", a + "dense.bias")
    f.head_dim, f.kv_heads = d, G
    cfg = cfg or {}
    new = bool(cfg.get("new_decoder_architecture"))
    if c.config is None:  # --layout falcon on bare weights: the norm the checkpoint has
        ln = "ln_attn" if c.has(c.block + "ln_attn.weight") else "input_layernorm"
    else:  # FalconDecoderLayer: ln_attn in the new decoder with two norms (num_ln_in_parallel_attn None or 2)
        ln = "ln_attn" if new and cfg.get("num_ln_in_parallel_attn") in (None, 2) else "input_layernorm"
    assert fam is not None  # Bloom's reader sends a declared Falcon here
    _family_norm(c, fam, c.block + ln, ("layer_norm_epsilon",))
    layer_options(c, fam, a)  # rotary half, or ALiBi (config.json alibi), scaled with the scores
    c.name = "falcon"


row_layout("t5", r"^(?P<stack>(?:.*\.)?block\.)(?P<n>\d+)\.layer\.0\.SelfAttention\.q\.weight$",
        "T5: layer.0.SelfAttention.{q,k,v,o}; relative position bias from layer 0; no score scaling",
           Row("t5", "layer.0.SelfAttention.", "q", "k", "v", "o", heads=("num_heads",), eps=("layer_norm_epsilon",),
               relative="relative_attention_bias.weight", notes=(("rms_note", "T5LayerNorm: w · x / sqrt(mean(x²) + "
                                                      "eps), no mean subtracted, no bias"),)))


@layout("bart", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.self_attn\.out_proj\.weight$",
        "BART / OPT / BioGPT / XGLM / Whisper / Marian / Pegasus: self_attn.{q,k,v,out}_proj (nn.Linear), "
        "self_attn_layer_norm before (pre-norm) or after (post-norm) attention")
def _bart(c: Ctx) -> None:
    a = c.block + "self_attn."
    fam = c.family or FAMILIES["bart"]  # without config.json the read is refused (CONFIG_DECIDES)
    if fam.qk_norm is None:
        read_row(c, BART)
        return
    known = {f"{a}{n}_proj.{p}" for n in ("q", "k", "v", "out") for p in ("weight", "bias")}  # LFM2
    other = sorted(n for n in c.ckpt.tensors if n.startswith(a) and n not in known
                   and n not in (f"{a}q_layernorm.weight", f"{a}k_layernorm.weight"))
    if other:  # a prompt, a rotary table: not this attention
        raise c.fail(f"has {other[0]} in {a.rstrip('.')}, which the {fam.model_type} declaration (bart layout: "
                     "self_attn.q/k/v/out_proj) does not read")
    _lfm2(c, a, fam)


# BART-style self_attn.{q,k,v,out}_proj: heads of the stack's side (encoder_attention_heads, decoder_attention_heads)
BART = Row("bart", "self_attn.", o="out_proj", heads=("{side}_attention_heads", "num_attention_heads", "attention_heads"),
           same_kv=True, only=True, bias_key="enable_bias", cross="encoder_attn.q_proj.weight",
           notes=(("scale", "q_proj(x) · head_dim^-0.5 before q·kᵀ (the same as q·kᵀ / sqrt(head_dim))"),))


def _lfm2(c: Ctx, a: str, fam: Family) -> None:
    """LFM2's attention layers (between its convolution layers): q/k/v_proj, out_proj (nn.Linear, no biases),
    RMSNorm per head q_layernorm / k_layernorm before rotary (half), GQA, causal; RMS operator_norm before."""
    c.linears(a, "q_proj", "k_proj", "v_proj", "out_proj")
    _heads(c, "num_attention_heads", width=c.arrays["W_q"].shape[1])
    f = c.facts
    if f.head_dim and not f.config_gave("kv_heads"):
        f.kv_heads = c.arrays["W_k"].shape[1] // f.head_dim
    for ours, theirs in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
        c.put(ours, c.get(f"{a}{theirs}.weight"), f"{a}{theirs}.weight")
    f.qk_norm = fam.qk_norm
    c.conf(norm_eps=("norm_eps",), default=1e-5, cast=float)
    f.causal = True
    _family_norm(c, fam, c.block + fam.norm_name, ("norm_eps",))
    if not f.config_gave("pre_norm_eps") and c.config and c.config.get("norm_eps") is None:
        f.pre_norm_eps = 1e-5  # Lfm2Config's default
    layer_options(c, fam, a)  # its row: rope "half"


row_layout("modernbert", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.attn\.Wo\.weight$",
           "ModernBERT: attn.Wqkv = [Q; K; V] by rows, attn.Wo (nn.Linear); ModernBERT decoder: attn.{q,k,v}_proj, "
           "attn.Wo; pre-norm attn_norm (layer 0: none)",
           Row("modernbert", "attn.", o="Wo", fused="Wqkv", fused_by="blocks", kv_heads=("num_attention_heads",),
               same_kv=True, needs_heads=True, head_dim_keys=(), eps=("norm_eps",), only=True,
               notes=(("scale", "1 / sqrt(head_dim), head_dim = hidden_size / num_attention_heads"),)))


row_layout("distilbert", r"^(?P<stack>(?:.*\.)?transformer\.layer\.)(?P<n>\d+)\.attention\.q_lin\.weight$",
        "DistilBERT: attention.{q,k,v,out}_lin (nn.Linear, biases); bidirectional; post-norm sa_layer_norm",
           Row("distilbert", "attention.", "q_lin", "k_lin", "v_lin", "out_lin", heads=("n_heads", "num_attention_heads"),
               post_norm="sa_layer_norm"))


def _albert_call(cfg: dict[str, Any] | None, layer: int, source: str) -> tuple[int, int, list[int]]:
    """ALBERT's layer ``layer`` (the layer-th call of a shared AlbertLayer, as hidden_states[layer] counts them):
    its group, its inner layer, and every layer that runs the same module (modeling_albert.py's
    ``int(i / (num_hidden_layers / num_hidden_groups))``, each group running inner_group_num layers)."""
    L, G, inner = _albert_shape(cfg, source)

    def where(n: int) -> tuple[int, int]:
        r, i = divmod(n, inner)
        return int(r / (L / G)), i

    g, i = where(layer)
    return g, i, [n for n in range(L * inner) if where(n) == (g, i)]


def _albert_shape(cfg: dict[str, Any] | None, source: str) -> tuple[int, int, int]:
    if not cfg or cfg.get("num_hidden_layers") is None:
        raise InputError("holds ALBERT's shared layers (albert_layer_groups), and which layer runs which group is "
                         "set by config.json (num_hidden_layers, num_hidden_groups): put config.json beside it", source)
    L = int(cfgcheck.value(cfg, "num_hidden_layers", "config.json"))
    G = int(cfgcheck.value(cfg, "num_hidden_groups", "config.json", 1))
    inner = int(cfgcheck.value(cfg, "inner_group_num", "config.json", 1))
    if G > L:
        raise InputError(f"num_hidden_groups is {G}, more than num_hidden_layers ({L})", "config.json")
    return L, G, inner


def _albert_layers(ckpt: Checkpoint, found: Found) -> list[int]:
    L, G, inner = _albert_shape(ckpt.config, ckpt.source)
    if found.layers != list(range(G)):
        raise InputError(f"holds albert_layer_groups {_layer_range(found.layers)}, but config.json says "
                         f"num_hidden_groups = {G}", ckpt.source)
    return list(range(L * inner))


@layout("albert", r"^(?P<stack>(?:.*\.)?albert_layer_groups\.)(?P<n>\d+)\.albert_layers\.0\.attention\.query\.weight$",
        "ALBERT: albert_layer_groups.G.albert_layers.I.attention.{query,key,value,dense}, shared by the layers of "
        "group G; post-norm attention.LayerNorm")
def _albert(c: Ctx) -> None:
    g, i, shared = _albert_call(c.config, c.layer, c.ckpt.source)
    a = f"{c.stack}{g}.albert_layers.{i}.attention."
    read_row(c, ALBERT, f"{c.stack}{g}.albert_layers.{i}.")
    runs = f"layers {_layer_range(shared)}" if shared == list(range(shared[0], shared[-1] + 1)) else \
        "layers " + ", ".join(map(str, shared))
    for k in list(c.origin):
        c.origin[k] += f" (shared by {runs})"
    c.facts.notes["shared"] = (f"layer {c.layer} runs group {g}, inner layer {i} ({a.rstrip('.')}), "
                               f"which {runs} share")


ALBERT = Row("albert", "attention.", "query", "key", "value", "dense", post_norm="attention.LayerNorm")


# Layouts whose layer numbers are not the indices in their tensor names (ALBERT: groups shared by the layers)
SHARED_LAYERS: dict[str, Callable[[Checkpoint, Found], list[int]]] = {"albert": _albert_layers}


@layout("transformer-lens", r"^(?P<stack>(?:.*\.)?blocks\.)(?P<n>\d+)\.attn\.W_Q$",
        "TransformerLens: attn.W_Q (H, E, d), b_Q (H, d), W_K/W_V (or _W_K/_W_V (G, E, d)), W_O (H, d, E)")
def _tl(c: Ctx) -> None:
    a = c.block + "attn."

    def pick(n: str) -> str:
        for name in (a + n, a + "_" + n):
            if c.has(name):
                return name
        raise c.fail(f"has {a}W_Q but no {a}{n}: a TransformerLens block needs it")

    wq = c.get(a + "W_Q")
    if wq.ndim != 3:
        raise c.fail(f"tensor {a + 'W_Q'!r} has shape {wq.shape}; expected (H, E, d)")
    H, E, d = wq.shape
    for t, n in (("W_q", "W_Q"), ("W_k", "W_K"), ("W_v", "W_V")):
        name = pick(n)
        w = c.get(name)
        if w.ndim != 3 or w.shape[1:] != (E, d):
            raise c.fail(f"tensor {name!r} has shape {w.shape}; expected (heads, {E}, {d}) like W_Q")
        c.put(t, w.transpose(1, 0, 2).reshape(E, w.shape[0] * d), f"{name} (H, E, d) -> (E, H·d)")  # per head -> concat
        bn = n.replace("W_", "b_")
        for bname in (a + bn, a + "_" + bn):
            if c.has(bname):
                c.put("b_" + t[-1], c.get(bname).reshape(-1), f"{bname} (H, d) -> (H·d,)")
                break
    wo = c.get(a + "W_O")
    if wo.shape != (H, d, E):
        raise c.fail(f"tensor {a + 'W_O'!r} has shape {wo.shape}; expected ({H}, {d}, {E})")
    c.put("W_o", wo.reshape(H * d, E), f"{a}W_O (H, d, E) -> (H·d, E)")
    if c.has(a + "b_O"):
        c.put("b_o", c.get(a + "b_O"), a + "b_O")
    f = c.facts
    f.heads, f.kv_heads, f.head_dim = H, c.arrays["W_k"].shape[1] // d, d
    f.causal = True
    f.notes["assumed"] = "causal (attention_dir='causal') and scale 1/sqrt(d_head): the state dict does not say"
    ln = c.block + "ln1."
    if c.has(ln + "w"):
        _norm(c, "layernorm" if c.has(ln + "b") else "rms", ln + "w", ln + "b", eps=1e-5)
    if c.has(a + "rotary_sin") and c.has(a + "rotary_cos"):
        _tl_rope(c, c.get(a + "rotary_sin"), c.get(a + "rotary_cos"), a)


def _tl_rope(c: Ctx, sin: np.ndarray, cos: np.ndarray, a: str) -> None:
    """RoPE from TransformerLens' stored tables sin/cos (n_ctx, rotary_dim) = f(pos · freq): the frequencies
    repeat as [f0..fk, f0..fk] (rotate_half, the default) or [f0, f0, f1, f1, ...] (rotary_adjacent_pairs),
    and the base follows from freq_1 = base^(-2/rotary_dim)."""
    f = c.facts
    if sin.ndim != 2 or sin.shape[0] < 2 or sin.shape[1] < 4 or sin.shape[1] % 2:
        return
    rd = sin.shape[1]
    row_s, row_c = np.asarray(sin[1], np.float64), np.asarray(cos[1], np.float64)  # position 1: the angles are freqs
    freq = np.arctan2(row_s, row_c)
    f.rope = "interleaved" if abs(freq[1] - freq[0]) < 1e-6 else "half"
    f1 = freq[2] if f.rope == "interleaved" else freq[1]
    f.rotary_dim = rd
    if f1 > 0:
        base = float(f1 ** (-rd / 2))
        f.rope_base = float(round(base)) if abs(base - round(base)) < 1e-3 * base else base
    f.notes["rope_from"] = f"{a}rotary_sin, {a}rotary_cos (the tables TransformerLens stores)"


@layout("mha", r"^(?P<stack>(?:.*\.)?layers\.)(?P<n>\d+)\.(?:[^.]+\.)*?self_attn\.in_proj_weight$",
        "nn.MultiheadAttention in nn.TransformerEncoder/Decoder: layers.N.self_attn.in_proj_weight, out_proj")
def _mha(c: Ctx) -> None:
    a = c.block + "self_attn."
    w = c.get(a + "in_proj_weight")
    if w.ndim != 2 or w.shape[0] != 3 * w.shape[1]:
        raise c.fail(f"tensor {a + 'in_proj_weight'!r} has shape {w.shape}; expected (3E, E)")
    _mha_parts(c, a, w)


def _mha_parts(c: Ctx, a: str, w: np.ndarray) -> None:
    """nn.MultiheadAttention's in_proj_weight (3E, E) = [W_q; W_k; W_v] by rows, each nn.Linear (out, in):
    parsed by the one reader of that module (attncli.io.weights.mha_packed, as in a weights file)."""
    names = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias", "bias_k", "bias_v")
    entries = {a + n: c.get(a + n) for n in names if c.has(a + n)}
    parts = weights.mha_packed(entries, a, c.ckpt.source)
    origin = parts.pop("origin", {})
    for k, v in parts.items():
        if v is not None:
            c.put(k, v, origin.get(k, a + k))
    _heads(c, "num_heads", "nhead", kv_keys=("num_heads", "nhead"), width=w.shape[1])
    c.facts.notes["assumed"] = "nn.MultiheadAttention: scale 1/sqrt(E/heads); the state dict does not hold heads"


@layout("mha-module", r"^(?P<stack>(?:.*\.)?)in_proj_weight$",
        "one nn.MultiheadAttention: in_proj_weight (3E, E), in_proj_bias, out_proj (a single layer)",
        convert=weights.mha_packed, file_name="mha")
def _mha_module(c: Ctx) -> None:
    a = c.stack  # the module itself: no layer index in its names
    w = c.get(a + "in_proj_weight")
    if w.ndim != 2 or w.shape[0] != 3 * w.shape[1]:
        raise c.fail(f"tensor {a + 'in_proj_weight'!r} has shape {w.shape}; expected (3E, E)")
    _mha_parts(c, a, w)


# ---- finding the layout and the layer ----------------------------------------------------------

@dataclass
class Found:
    layout: Layout
    stack: str
    layers: list[int]


def find_layouts(names: list[str], files: bool = False) -> list[Found]:
    """Every (layout, stack) whose marker occurs, with the layer indices present: the checkpoint layouts, or
    (``files``) those that read one module held in memory (a weights file)."""
    found: dict[tuple[str, str], set[int]] = {}
    for name in names:
        for lay in LAYOUTS.values():
            if (lay.convert if files else lay.read) is None:
                continue
            m = lay.marker.match(name)
            if m:
                n = m.groupdict().get("n")
                found.setdefault((lay.name, m.group("stack")), set()).add(int(n) if n is not None else 0)
                break
    return [Found(LAYOUTS[k], s, sorted(v)) for (k, s), v in found.items()]


# A marker without this companion in the same layer is not that layout (Llama's q_proj and BART's out_proj share
# names with other modules: OPT's q_proj has no o_proj beside it, nn.MultiheadAttention's out_proj no q_proj, a
# vision tower's q_proj sits beside out_proj; Persimmon's dense beside its query_key_value)
COMPANION = {"llama": "self_attn.o_proj.weight", "phi": "self_attn.q_proj.weight", "bart": "self_attn.q_proj.weight"}


def _complete(found: list[Found], ckpt: Checkpoint) -> list[Found]:
    return [f for f in found if f.layout.name not in COMPANION
            or f"{f.stack}{f.layers[0]}.{COMPANION[f.layout.name]}" in ckpt]


def _unsupported(names: list[str]) -> str | None:
    for pattern, what in UNSUPPORTED.values():
        if any(pattern.search(n) for n in names):
            return what
    return None


CROSS = re.compile(r"(^|\.)(encoder_attn|crossattention|cross_attn|EncDecAttention)(\.|$)")


def _choose(ckpt: Checkpoint, prefix: str | None, want: str | None = None) -> Found:
    names = list(ckpt.tensors)
    if prefix is not None and CROSS.search(prefix):
        raise InputError(f"names a cross-attention module ({printable(prefix, 80)}), which is not supported: a "
                         "checkpoint's layer is read for its self-attention", "--prefix")
    found = find_layouts(names)
    if prefix is not None:
        want = prefix.rstrip(".") + "."
        found = [f for f in found if f.stack.startswith(want) or want.startswith(f.stack) or f.stack == want]
        if not found:
            raise InputError(f"has no attention layers under the prefix {prefix!r}", ckpt.source)
    # a marker without its companions (e.g. a vision tower's q_proj beside out_proj) is not that layout
    complete = _complete(found, ckpt)
    if not complete:
        what = _unsupported(names)
        if what is not None:
            raise InputError(f"holds {what} attention, which attncli recognises but does not read", ckpt.source)
        if found:
            complete = found  # the reader names what is missing
        else:
            layouts = ", ".join(n for n, lay in LAYOUTS.items() if lay.read is not None)
            sample = ", ".join(names[:6])
            raise InputError(f"holds no attention layout attncli knows ({layouts}); its tensors start {sample}",
                             ckpt.source)
    if len(complete) > 1 and want is not None:  # config.json's family names its layout (MiniMax: qkv_proj elsewhere)
        complete = [f for f in complete if f.layout.name == want] or complete
    if len(complete) > 1:
        stacks = ", ".join(f"{f.stack.rstrip('.')} ({f.layout.name}, {len(f.layers)} layers)" for f in complete)
        raise InputError(f"holds several attention stacks: {stacks}; choose one with --prefix", ckpt.source)
    return complete[0]


# ---- a weights file: one module's entries, by the same registry ----------------------------------

def projections_from(content: Any, source: str, prefix: str | None = None) -> Projections:
    """Projection weights from a loaded file (npz/yaml/json mapping or a state dict), converted.

    The layout is recognised by its marker key (the module layouts of ``LAYOUTS``), optionally under a
    module prefix (``encoder.attn.in_proj_weight``); ``prefix`` picks one when several are present.
    """
    entries = entries_of(content, source)
    found = [(f.stack, f.layout) for f in find_layouts(list(map(str, entries)), files=True)]
    if prefix is not None:
        want = prefix if not prefix or prefix.endswith(".") else prefix + "."
        found = [(p, f) for p, f in found if p == want]
        if not found:
            raise InputError(f"has no projection weights under the prefix {prefix!r}", source)
    if not found:
        layouts = ("W_q, W_k, W_v (textbook; d2l's nn.Linear), q, k, v (the notes), in_proj_weight or "
                   "q_proj_weight (nn.MultiheadAttention)")  # a short line: the descriptions are long
        have = printable(", ".join(list(map(str, entries))[:12]), 60)
        raise InputError(f"has no projection weights (it has {have or 'nothing'}); expected one of: {layouts}", source)
    if len({p for p, _ in found}) > 1:
        raise InputError(f"holds the weights of several modules ({', '.join(sorted(p.rstrip('.') for p, _ in found))}); "
                         "choose one with --prefix", source)
    p, f = found[0]
    parts = f.converter()(entries, p, source)
    origin = parts.pop("origin", {})
    arrays = {n: (None if a is None else np.asarray(a)) for n, a in parts.items()}
    for n in BIASES:  # a bias saved by --save as a (1, d) row
        b = arrays.get(n)
        if b is not None and b.ndim == 2 and b.shape[0] == 1:
            arrays[n] = b[0]
    return Projections(**arrays, source=source, origin=origin, kind=f.file_name or f.name)  # type: ignore[arg-type]


def resolve_family(ckpt: Checkpoint, found: Layout, forced: str | None = None) -> Family | None:
    """The declaration that reads this checkpoint: config.json's model_type (checked by type first), or
    ``forced`` (--layout); None without a config (the tensor signature decides, as before). Refused in one
    line: a model_type attncli knows and does not read, one it does not know, a layout that does not match
    the tensors, a config key that changes attention and that the declaration does not read."""
    cfg = ckpt.config
    src = ckpt.config_path or "config.json"
    if cfg is not None:
        cfgcheck.check_config(cfg, src)
    if forced is not None:
        fam = FAMILIES.get(forced) or FAMILIES.get({"neox": "gpt_neox", "phi3": "phi3"}.get(forced, ""))
        if fam is None:
            known = ", ".join(sorted(FAMILIES)[:12])
            raise InputError(f"names {forced!r}, which is not a declared family (e.g. {known}, ...)", "--layout")
    elif cfg is None:
        if found.name in CONFIG_DECIDES:
            raise InputError(f"has no config.json, and {found.name} tensor names fit families whose attention differs "
                             f"({CONFIG_DECIDES[found.name]}): put config.json beside it, or give --layout {found.name} "
                             "for its defaults", ckpt.source)
        return None
    else:
        mt = cfg.get("model_type")
        if mt is None:
            raise InputError("has no model_type, so the family (and its attention) is unknown; give --layout NAME "
                             f"(e.g. --layout {found.name}) to read it as that family at your own risk", src)
        if mt in REFUSED:
            raise InputError(f"{mt}: {REFUSED[mt]}", src)
        fam = FAMILIES.get(mt)
        if fam is None:
            raise InputError(f"model_type {mt!r} is not a family attncli declares, so its attention is unknown; "
                             f"--layout {found.name} reads it as {found.name} at your own risk", src)
    if fam.layout != found.name and not (fam.layout == "llama" and found.name == "phi3"):
        raise InputError(f"{fam.model_type}: its tensors are the {found.name} layout, not the {fam.layout} layout "
                         "its declaration reads", ckpt.source)
    if cfg is not None:
        bad = unsupported_key(fam, cfg)
        if bad is not None:
            raise InputError(f"{fam.model_type}: {bad} is not supported", src)
        lack = fam.missing(cfg)
        if lack is not None:
            raise InputError(lack, ckpt.source)
    return fam


def _layer_range(layers: list[int]) -> str:
    return f"{layers[0]}..{layers[-1]}" if len(layers) > 1 else str(layers[0])


def load_layer(path: str | Path | Checkpoint, layer: int | None, prefix: str | None = None, *,
               heads: int | None = None, layout: str | None = None) -> LayerAttention:
    """The attention weights of one layer of a checkpoint, in textbook form, with the config's facts.

    ``layer`` is required when there are several (the error lists them); ``prefix`` picks a stack
    when there are several (T5's encoder/decoder); ``heads`` supplies the number of heads when no
    config.json says it. Only the chosen layer's tensors are read (memory-mapped views, stored dtype).
    """
    ckpt = path if isinstance(path, Checkpoint) else open_checkpoint(path)
    mt = str((ckpt.config or {}).get("model_type"))
    if layout is None and ckpt.config is not None and mt in REFUSED:  # config.json decides first: known, not read
        src = ckpt.config_path or "config.json"
        cfgcheck.check_config(ckpt.config, src)
        raise InputError(f"{mt}: {REFUSED[mt]}", src)
    declared = FAMILIES.get(layout or mt)
    f = _choose(ckpt, prefix, declared.layout if declared is not None else None)
    fam = resolve_family(ckpt, f.layout, layout)
    layers = SHARED_LAYERS[f.layout.name](ckpt, f) if f.layout.name in SHARED_LAYERS else f.layers
    count = layers[-1] + 1
    if layer is None:
        if len(layers) > 1:
            raise InputError(f"holds {len(layers)} attention layers ({_layer_range(layers)}); choose one with --layer",
                             ckpt.source)
        layer = layers[0]
    if layer not in layers:
        types = (ckpt.config or {}).get("layer_types")
        what = (f" (layer_types: a {printable(types[layer], 40)} layer, not attention attncli reads)"
                if isinstance(types, list) and 0 <= layer < len(types) and isinstance(types[layer], str)
                and types[layer] not in ATTENTION_TYPES else "")
        raise InputError(f"has no layer {layer}{what}: its {f.layout.name} layers are {_layer_range(layers)}",
                         "--layer")
    args = model_args(ckpt.files) if ckpt.config is None else None
    if heads is None and args is not None and args.get("n_head") is not None:  # nanoGPT's ckpt.pt says it
        heads = cfgcheck.value(args, "n_head", f"{ckpt.source} (model_args)")
    config = ckpt.config if fam is None else with_class_defaults(fam.model_type, ckpt.config)
    c = Ctx(ckpt, f.stack, layer, count, config, heads_hint=heads, family=fam)
    f.layout.reader()(c)
    if fam is not None and c.facts.rope is not None:  # how its half-precision rotation rounds (every layout)
        c.facts.rope_rounding = fam.rope_rounding
    if c.facts.heads is None:
        c.facts.notes.setdefault("heads", "unknown: no config.json beside the weights; give --heads")
    _check_shapes(c)
    return LayerAttention(c.arrays, c.origin, c.name or f.layout.name, layer, count, c.facts, ckpt.source)


def inspect_checkpoint(path: str | Path, layout: str | None = None) -> dict[str, Any]:
    """What a checkpoint holds, from headers only: layers, attention tensors, layout, config facts, the family
    (``layout``: a declaration forced on it, as --layout)."""
    ckpt = open_checkpoint(path)
    names = list(ckpt.tensors)
    out: dict[str, Any] = {
        "source": ckpt.source,
        "files": [str(p) for p in ckpt.files],
        "config": ckpt.config_path,
        "model_type": (ckpt.config or {}).get("model_type"),
        "tensors": len(names),
        "bytes": sum(t.nbytes for t in ckpt.tensors.values()),
        "dtypes": sorted({t.dtype for t in ckpt.tensors.values()}),
    }
    out.update(_family_report(ckpt, layout))
    found = _complete(find_layouts(names), ckpt) or find_layouts(names)
    open_ = sorted({f.layout.name for f in found} & set(CONFIG_DECIDES))
    if ckpt.config is None and layout is None and open_:  # what self and check would say: refused without --layout
        out["family_status"] = (f"no config.json, and {open_[0]} tensor names fit families whose attention differs "
                                f"({CONFIG_DECIDES[open_[0]]}): self and check refuse it without --layout {open_[0]}")
    out["stacks"] = []
    for f in found:
        numbers = f.layers
        if f.layout.name in SHARED_LAYERS:  # ALBERT: the layers that run the shared groups
            try:
                numbers = SHARED_LAYERS[f.layout.name](ckpt, f)
            except InputError:
                pass
        entry: dict[str, Any] = {"layout": f.layout.name, "description": f.layout.description,
                                 "prefix": f.stack.rstrip("."), "layers": len(numbers),
                                 "layer_range": _layer_range(numbers)}
        used: set[str] = set()
        try:
            entry["facts"] = _facts_only(ckpt, f, layout)
            used = {re.split(r"[ \[ᵀ]", o, maxsplit=1)[0] for o in entry["facts"]["origin"].values()}
        except InputError as e:
            entry["error"] = str(e)
        marker = next(n for n in names if (m := f.layout.marker.match(n)) and m.group("stack") == f.stack
                      and int(m.groupdict().get("n") or 0) == f.layers[0])
        module = marker.removesuffix(".weight").removesuffix(".bias").rsplit(".", 1)[0] + "."  # the attention module
        entry["layer_tensors"] = [{"name": n, "shape": list(ckpt.tensors[n].shape), "dtype": ckpt.tensors[n].dtype}
                                  for n in names if n in used or n.startswith(module)]
        out["stacks"].append(entry)
    if not found:
        out["unsupported"] = _unsupported(names)
        out["tensor_names"] = names[:40]
    return out


def _family_report(ckpt: Checkpoint, layout: str | None = None) -> dict[str, Any]:
    """The family config.json names (declared, refused or unknown) and every attention key it holds with
    'used', 'neutral (ignored)' or 'not supported' (attncli.io.families.ATTENTION_KEYS)."""
    cfg = ckpt.config
    if cfg is None:
        return {"family": None, "family_status": "no config.json: the tensor signature decides", "attention_keys": {}}
    mt = cfg.get("model_type")
    fam = FAMILIES.get(str(layout or mt))
    if fam is not None and layout is not None:
        status = f"forced with --layout {layout} ({fam.layout} layout), at your own risk"
    elif fam is not None:
        status = f"declared ({fam.layout} layout)"
    elif mt in REFUSED:
        status = f"known, refused: {REFUSED[str(mt)]}"
    else:
        status = "not declared: refused unless --layout NAME forces a declaration"
    keys = attention_keys(fam, cfg)
    return {"family": mt, "family_status": status,
            "attention_keys": {k: {"value": cfg[k], "status": v} for k, v in keys.items()}}


def _facts_only(ckpt: Checkpoint, f: Found, layout: str | None = None) -> dict[str, Any]:
    """Layer ``first``'s facts; reading its tensors only to learn shapes would map them, so headers are used."""
    shadow = _HeaderOnly(ckpt)
    fam = resolve_family(ckpt, f.layout, layout)
    config = ckpt.config if fam is None else with_class_defaults(fam.model_type, ckpt.config)
    c = Ctx(shadow, f.stack, f.layers[0], f.layers[-1] + 1, config, family=fam)  # type: ignore[arg-type]
    filled = sorted(set(config or {}) - set(ckpt.config or {}))
    if fam is not None and filled:  # what inspect shows: these facts are the class's, not the file's
        c.facts.notes["class_defaults"] = (f"config.json leaves out {', '.join(filled)}: {fam.model_type}'s config "
                                           "class defaults, as transformers reads it")
    f.layout.reader()(c)
    d = dict(c.facts.__dict__)
    d["first_layer"] = f.layers[0]
    d["origin"] = dict(c.origin)
    return d


class _HeaderOnly:
    """A Checkpoint stand-in whose large tensors are zero-stride arrays of the right shape: readers run
    on headers (and small tensors only), so inspect reports facts and origins without reading weights."""

    SMALL = 64 << 10  # tensors up to this size (norms, biases, rotary tables) are read for real

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt, self.source, self.tensors, self.config = ckpt, ckpt.source, ckpt.tensors, ckpt.config

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        if info.nbytes <= self.SMALL:
            return self.ckpt.tensor(name)
        return np.broadcast_to(np.zeros((), np.float32), info.shape)
