"""The typed parameters of the steps outside the chain before the softmax (those are in
attncli.core.chain: Scale, Cap, Alibi, RelativeBias, Bias, Mask) and the run's facts, :class:`Meta`.

A renderer or a check reads these numbers; the formula text of a step is for display only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class Projection:
    """q, k or v = input · W (+ b): which input, which weight and bias, where the weight came from."""

    input: str  # "X", "Y" (the memory) or "Z" (the values' input)
    weight: str  # "W_q", "W_k", "W_v" (or "W_o" for the output)
    bias: str | None  # "b_q", ... or None without a bias
    origin: str | None = None  # the tensor the weight was read from, when known


@dataclass(frozen=True)
class Clip:
    """q_clip, k_clip, v_clip = clamp(q, -c, c) (OLMo clip_qkv): of ``before``, the projection."""

    c: float
    before: str


@dataclass(frozen=True)
class Tuning:
    """q_temp = q_i · (log(floor((P + i + 1) / floor) + 1) · scale + 1) (Llama 4's temperature tuning)."""

    scale: float
    floor: float
    q_offset: int


@dataclass(frozen=True)
class Weight:
    """A weight or bias step (W_q, b_q, ...): where it came from."""

    origin: str | None = None


@dataclass(frozen=True)
class Features:
    """Additive's features = act(q W_q + k W_k (+ b)): h numbers per (query, key)."""

    activation: str
    bias: bool


@dataclass(frozen=True)
class Normalise:
    """x_norm, q_norm, k_norm: LayerNorm (``kind`` layernorm) or RMSNorm (rms; rms1p: the weight is 1 + w;
    rms-full: over the token's features of every head at once, OLMo 2's norm before the head split)."""

    kind: str  # layernorm, rms, rms1p, rms-full (and, for x_norm, layernorm1p)
    eps: float
    weight_given: bool = True  # False: a weightless norm (w = 1)
    origin: str | None = None
    per_head: bool = False  # the weight is (H, d): each head its own (StableLM, Cohere); else (d,) shared by the heads
    bias_given: bool = False  # LayerNorm with a bias (Phi, Persimmon)
    at: str = "before-rope"  # QK-norm only: before-rope or after-rope (HunYuan, nanochat)

    @property
    def plus_one(self) -> bool:
        return self.kind == "rms1p"

    @property
    def full_width(self) -> bool:
        """Over every head's features of a token (the model width H·d), not each head's d."""
        return self.kind == "rms-full"


@dataclass(frozen=True)
class Gating:
    """gate = act(input · W_g) and gated = concat ⊙ gate (AFMoE, Laguna): one gate per feature of the
    concatenated heads, or one per head (``per_head``) shared by its features."""

    act: str  # sigmoid | softplus
    input: str  # the step the gate is computed from: x_norm or x
    per_head: bool
    origin: str | None = None


@dataclass(frozen=True)
class Rotation:
    """RoPE on q_rot and k_rot: query i at position q_offset + i, key j at j."""

    mode: str  # half (rotate_half) or interleaved
    base: float
    rotary_dim: int
    q_offset: int
    factor: float  # the attention factor of the rope scaling (1: none)
    scaling: str | None = None  # the rope scaling's type (llama3, yarn, ...), None: none

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "base": self.base, "rotary_dim": self.rotary_dim, "q_offset": self.q_offset,
                "factor": self.factor}


@dataclass(frozen=True)
class HeadMap:
    """Grouped-query heads: query head h reads K/V head h // n_rep."""

    heads: int
    kv_heads: int
    n_rep: int


@dataclass(frozen=True)
class Sink:
    """gpt-oss's sinks: one logit per query head in the softmax's denominator."""

    values: tuple[float, ...]


@dataclass(frozen=True)
class Softmax:
    """softmax (or weights) over the keys of ``before``; ``sinks``: with a sink logit per head."""

    before: str
    sinks: bool = False


@dataclass(frozen=True)
class Hard:
    """One-hot at each row's largest weight (ties: the first key)."""

    before: str


@dataclass(frozen=True)
class Dropout:
    """weights · keep / (1 - p), keep from numpy.random.default_rng(seed)."""

    p: float
    seed: int


@dataclass(frozen=True)
class Scaling:
    """The scaling rule as the explanations show it: ``factor`` None when it depends on the scores."""

    rule: str
    factor: float | None
    temperature: float | None
    name: str = "none"  # the rule (a key of attncli.core.scoring.SCALINGS), or "scale" for --scale
    d: int = 0
    n: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "factor": self.factor, "temperature": self.temperature}


@dataclass(frozen=True)
class AlibiFacts:
    q_offset: int
    slopes: tuple[float, ...]
    form: str = "relative"  # a key of attncli.core.alibi.FORMS
    divisor: float | None = None  # ALiBi added before the scale (--alibi-scaled): divided by this after attncli's scale

    def as_json(self) -> dict[str, Any]:
        return {"q_offset": self.q_offset, "slopes": list(self.slopes), "form": self.form, "divisor": self.divisor}


@dataclass(frozen=True)
class Initialised:
    """Score weights drawn from a seed, not given."""

    names: tuple[str, ...]
    seed: int
    rule: str
    hidden: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "seed": self.seed, "rule": self.rule} | (
            {} if self.hidden is None else {"hidden": self.hidden})


@dataclass
class Meta:
    """The run's facts, named: what ``--format json`` writes at its top level (each field that is set,
    under its own name) and what the renderers and checks read."""

    score: str | None = None
    score_formula: str | None = None
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    shapes: dict[str, list[int]] | None = None
    self_attention: bool | None = None
    batch_axes: list[str] | None = None  # the names of the leading axes of the steps, e.g. ["batch", "head"]
    head_axis: int | None = None  # which of them holds the heads
    kv_heads: int | None = None  # grouped-query: K/V heads (and query heads per K/V head)
    n_rep: int | None = None
    heads: int | None = None  # with projections: the query heads, each head's widths
    head_width: dict[str, int] | None = None
    batched: bool | None = None
    weights_format: str | None = None
    config: dict[str, Any] | None = None
    seed: int | None = None
    weights_source: str | None = None
    rope: Rotation | None = None
    path: str | None = None  # explicit, blocked or sdpa
    softmax: str | None = None  # the blocked path's softmax: running max or shift-free
    scaling: Scaling | None = None
    alibi: AlibiFacts | None = None
    sinks: list[float] | None = None
    weights_step: str | None = None  # the step whose weights multiplied V (weights, hard or dropout)
    per_head_steps: list[str] | None = None
    head: int | None = None  # a view of one head (--head)
    params_initialised: Initialised | None = None

    @property
    def rep(self) -> int:
        """Query heads per K/V head (1 without grouped-query heads)."""
        return self.n_rep or 1

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, by name, as JSON values."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = v.as_json() if is_dataclass(v) and hasattr(v, "as_json") else v
        return out
