"""The typed parameters of the steps outside the chain before the softmax (those are in
attncli.core.chain: Scale, Cap, Alibi, RelativeBias, Bias, Mask) and the run's facts, :class:`Meta`.

A renderer or a check reads these numbers. Each type writes its step's formula once, as terms (``formula()``,
attncli.core.formula): the text that JSON and NPZ carry, LaTeX and HTML are all written from it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from attncli.core.formula import Data, Fn, Formula, Head, Name, Num, Piece, Sub, Sup, Term, Words, formula, plus, terms

WEIGHT_OUT = {"W_q": "Q", "W_k": "K", "W_v": "V", "W_o": "output", "W_qa": "q_latent", "W_kva": "kv_latent"}


class Input(NamedTuple):
    """x, memory, values: X (the input, or with --from-residual the residual stream), Y, Z as given."""

    symbol: str  # X, Y or Z
    residual: bool = False
    batched: bool = False

    def formula(self) -> Formula:
        what = {"Y": "the memory that keys (and values) are projected from",
                "Z": "the input values are projected from"}.get(self.symbol)
        if what is None:
            what = (f"the {'residual stream entering the layer' if self.residual else 'input'}, "
                    f"{'(B, T, d_model)' if self.batched else '(T, d_model)'}")
        return formula(Name(self.symbol), [": ", Words(what)])


class Projection(NamedTuple):
    """q, k or v = input · W (+ b): which input, which weight and bias, where the weight came from."""

    input: str  # "X", "Y" (the memory) or "Z" (the values' input), or the step it reads (q_latent_norm)
    weight: str  # "W_q", "W_k", "W_v" (or "W_o" for the output)
    bias: str | None  # "b_q", ... or None without a bias
    origin: str | None = None  # the tensor the weight was read from, when known
    out: str = ""  # the step's symbol when not the weight's (k_nope); "": Q, K, V, output, q_latent, kv_latent
    latent: tuple[int, int] | None = None  # DeepSeek's MLA: Q (d_rope, d_nope); kv_latent (r_kv, d_rope)

    def formula(self) -> Formula:
        out = self.out or WEIGHT_OUT[self.weight]
        eq = terms(Name(out), " = ", Name(self.input), " · ", Name(self.weight), plus(self.bias))
        a, b = self.latent or (0, 0)
        if out == "Q" and self.latent is not None:
            return formula(eq, [", ", Words(f"each head's features put [q_pe | q_nope] ({a} + {b}; W_q gives [q_nope | "
                                            f"q_pe]: K has the same order, so q·k is unchanged, and RoPE turns the "
                                            f"first {a})")])
        if out == "kv_latent":
            return formula([eq, " = [c | ", Sub("k", "pe"), "]"],
                           [": ", Words(f"the keys' and values' latent c ({a} features) and the rotary part of every "
                                        f"head's key k_pe ({b})")])
        remark = {"q_latent": "the queries' low-rank latent", "k_nope": "each head's keys without positions"}.get(out)
        return formula(eq, None if remark is None else [": ", Words(remark)])


class SharedRopeKey(NamedTuple):
    """DeepSeek's MLA: K = each head's [k_pe | k_nope_h], k_pe the same for every head."""

    d_rope: int

    def formula(self) -> Formula:
        return formula([Name("K")], [": ", Words(f"each head's key [k_pe | k_nope_h], k_pe (kv_latent's last {self.d_rope} "
                                                 "features) the same for every head")])


class Clip(NamedTuple):
    """q_clip, k_clip, v_clip = clamp(q, -c, c) (OLMo clip_qkv): of ``before``, the projection."""

    c: float
    before: str

    def formula(self) -> Formula:
        b, c = self.before, Num(self.c)
        return formula([Name(f"{b}_clip"), " = ", Fn("clamp"), "(", Name(b), ", -", c, ", ", c, ")"],
                       [": ", Words(f"every feature of {b.upper()} kept within "), "[-", c, ", ", c, "]",
                        Words(" (clip_qkv)")])


class Tuning(NamedTuple):
    """q_temp = q_i · (log(floor((P + i + 1) / floor) + 1) · scale + 1) (Llama 4's temperature tuning)."""

    scale: float
    floor: float
    q_offset: int
    before: str = "q"  # the step it tunes: q, q_rot or q_norm
    first: float = 1.0  # the factors of the first and the last query
    last: float = 1.0

    def formula(self) -> Formula:
        P = self.q_offset
        where = f"P + i = {P} + i" if P else "i"
        return formula([Name("q_temp"), " = ", Name(self.before), " · (", Fn("log"), "(", Fn("floor"),
                        "((position + 1) / ", Num(self.floor), ") + 1) · ", Num(self.scale), " + 1)"],
                       [", ", Words(f"position {where}: Llama 4's temperature tuning (factors {self.first:.6g} … "
                                    f"{self.last:.6g})")])


class Weight(NamedTuple):
    """A weight or bias step (W_q, b_q, ...): where it came from."""

    origin: str | None = None
    name: str = ""  # the step: W_q, b_q, W_g, ...

    def formula(self) -> Formula:
        where: Piece = [" (", Words("from "), Data(self.origin), ")"] if self.origin is not None else []
        if self.name.startswith("b"):
            return formula([Name(self.name)], [where, ", ", Words("added to every row")])
        gate: Piece = [": ", Words("the output gate's weight")] if self.name == "W_g" else []
        return formula([Name(self.name)], [where, ", ", Words("textbook convention (in, out)"), gate])


class Features(NamedTuple):
    """Additive's features = act(q W_q + k W_k (+ b)): h numbers per (query, key)."""

    activation: str
    bias: bool

    def formula(self) -> Formula:
        return formula([Name("features"), " = ", Fn(self.activation), "(q ", Sub("W", "q"), " + k ", Sub("W", "k"),
                        " + b" if self.bias else None, ")"], [": ", Words("h numbers per (query, key)")])


class KeyInQuerySpace(NamedTuple):
    """General's k_proj = W k (+ b): each key in query space."""

    bias: bool

    def formula(self) -> Formula:
        return formula(["W k", " + b" if self.bias else None], [": ", Words("each key in query space")])


class Projected(NamedTuple):
    """Additive's q_proj = q W_q, k_proj = k W_k (``of``: q or k)."""

    of: str

    def formula(self) -> Formula:
        return formula([f"{self.of} ", Sub("W", self.of)])


class UnitRows(NamedTuple):
    """Cosine's q / ‖q‖, k / ‖k‖ (``of``: q or k)."""

    of: str

    def formula(self) -> Formula:
        return formula([f"{self.of} / ‖{self.of}‖"])


class SquaredDistance(NamedTuple):
    """Gaussian's ‖q - k‖² (``sigma`` its bandwidth), or ‖(q - k)⊙w‖² with learned w (``sigma`` None)."""

    sigma: float | None

    def formula(self) -> Formula:
        if self.sigma is None:
            return formula([Words("squared distance "), "‖(q - k)⊙w‖²"])
        return formula([Words("squared distance "), "‖q - k‖², σ = ", Num(self.sigma)])


class KeyScores(NamedTuple):
    """Location's act(k W (+ b)): one score per key."""

    activation: str
    bias: bool

    def formula(self) -> Formula:
        return formula([Fn(self.activation), "(k W", " + b" if self.bias else None, ")"],
                       [": ", Words("one score per key")])


class Normalise(NamedTuple):
    """x_norm, q_norm, k_norm: LayerNorm (``kind`` layernorm) or RMSNorm (rms; rms1p: the weight is 1 + w;
    rms-full: over the token's features of every head at once, OLMo 2's norm before the head split)."""

    kind: str  # layernorm, rms, rms1p, rms-full (and, for x_norm, layernorm1p)
    eps: float
    weight_given: bool = True  # False: a weightless norm (w = 1)
    origin: str | None = None
    per_head: bool = False  # the weight is (H, d): each head its own (StableLM, Cohere); else (d,) shared by the heads
    bias_given: bool = False  # LayerNorm with a bias (Phi, Persimmon)
    at: str = "before-rope"  # QK-norm only: before-rope or after-rope (HunYuan, nanochat)
    step: str = "x_norm"  # x_norm, q_norm, k_norm, sub_norm, q_latent_norm, kv_latent_norm
    of: str = ""  # what a latent's norm normalises (q_latent, c)
    d: int = 0  # QK-norm: each head's features, the heads normalised, whether the bias is per head
    heads: int = 0
    bias_per_head: bool = False

    @property
    def plus_one(self) -> bool:
        return self.kind == "rms1p"

    @property
    def full_width(self) -> bool:
        """Over every head's features of a token (the model width H·d), not each head's d."""
        return self.kind == "rms-full"

    def formula(self) -> Formula:
        eps, name = Num(self.eps), Name(self.step)
        if self.step in ("q_norm", "k_norm"):
            return self._qk()
        if self.step == "x_norm":
            where: Piece = [" (w = ", Data(self.origin), ")"] if self.origin else []
            said: Piece = [": ", Words(f"the layer's pre-attention {self.kind}"), where]
            if self.kind == "layernorm":
                return formula([name, " = (X - ", Fn("mean"), ") / ", Fn("sqrt"), "(var + ", eps, ") · w + b"], said)
            return formula([name, " = ", "(1 + w)" if self.plus_one else "w", " · X / ", Fn("sqrt"), "(", Fn("mean"),
                            "(X²) + ", eps, ")"], said)
        of = Name(self.of or "concat")
        eq: Piece = [name, " = w · ", of, " / ", Fn("sqrt"), "(", Fn("mean"), "(", of, "²) + ", eps, ")"]
        if self.step == "sub_norm":
            return formula(eq, [": ", Words("an RMSNorm of the concatenated heads before W_o"),
                                [" (w = ", Data(self.origin), ")"] if self.origin else None])
        return formula(eq, [": ", Words("the latent's RMSNorm"), " (w = ", Data(self.origin or ""), ")"])

    def _qk(self) -> Formula:
        n = self.step[0]
        x = Name(f"{n}_rot" if self.at == "after-rope" else n)
        w: Piece = [Sub("w", n), "[h]" if self.per_head else None]
        scale: Piece = [] if not self.weight_given else [" · (1 + ", w, ")"] if self.plus_one else [" · ", w]
        bias: Piece = [" + ", Sub("b", n), "[h]" if self.bias_per_head else None] if self.bias_given else []
        eps = Num(self.eps)
        if self.kind == "layernorm":
            body: Piece = ["(", x, " - ", Fn("mean"), "(", x, ")) / ", Fn("sqrt"), "(", Fn("var"), "(", x, ") + ", eps, ")",
                    scale, bias]
            over = f", over each head's {self.d} features"
        else:
            body = [x, " / ", Fn("sqrt"), "(", Fn("mean"), "(", x, "²) + ", eps, ")", scale, bias]
            over = (f", over the token's {self.heads}·{self.d} features of every head at once (the full width, as "
                    "before the head split)" if self.full_width else f", over each head's {self.d} features")
        said = (f" (QK-norm, {self.kind}{', each head its own weights' if self.per_head else ''}"
                f"{'' if self.weight_given else ', weightless'}{', after RoPE' if self.at == 'after-rope' else ''})")
        return formula([Name(self.step), " = ", body], [Words(over), Words(said)])


class Gating(NamedTuple):
    """gate = act(input · W_g) and gated = concat ⊙ gate (AFMoE, Laguna): one gate per feature of the
    concatenated heads, or one per head (``per_head``) shared by its features."""

    act: str  # sigmoid | softplus
    input: str  # the step the gate is computed from: x_norm or x
    per_head: bool
    origin: str | None = None

    def formula(self) -> Formula:
        act = "1 / (1 + exp(-z))" if self.act == "sigmoid" else "log(1 + exp(z))"
        return formula([Name("gate"), " = ", Fn(self.act), "(", Name(self.input), " · ", Name("W_g"), ") = ", act],
                       [": ", Words(f"one gate per {'head' if self.per_head else 'feature of the concatenated heads'}")])


class Gated(NamedTuple):
    """gated = concat ⊙ gate: each feature, or each head's features (``per_head``), times its gate."""

    per_head: bool

    def formula(self) -> Formula:
        return formula([Name("gated"), " = ", Name("concat"), " ⊙ ", Name("gate")],
                       [Words(": each head's features times its gate" if self.per_head else ", feature by feature"),
                        Words(", before W_o")])


class Rotation(NamedTuple):
    """RoPE on q_rot and k_rot: query i at position q_offset + i, key j at j."""

    mode: str  # half (rotate_half) or interleaved
    base: float
    rotary_dim: int
    q_offset: int
    factor: float  # the attention factor of the rope scaling (1: none)
    scaling: str | None = None  # the rope scaling's type (llama3, yarn, ...), None: none
    of: str = "q"  # the step's: q_rot turns q (or q_norm), k_rot turns k
    before: str = "q"  # the step it turns
    d: int = 0  # each head's features (rotary_dim of them turned)

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "base": self.base, "rotary_dim": self.rotary_dim, "q_offset": self.q_offset,
                "factor": self.factor}

    def formula(self) -> Formula:
        rot = {"half": "rotate_half", "half-reversed": "rotate_half_reversed"}.get(self.mode, "rotate_every_two")
        rd, P = self.rotary_dim, self.q_offset
        fac: Piece = [" · ", Num(self.factor)] if self.factor != 1.0 else []
        x = Name(self.before)
        where = "j" if self.of == "k" else f"P + i = {P} + i" if P else "i"
        part = f" on features 0..{rd - 1} (the other {self.d - rd} pass through)" if rd < self.d else ""
        scaled = f", {self.scaling} scaling" if self.scaling else ""
        return formula([Name(f"{self.of}_rot"), " = ", x, "·", Fn("cos"), " θ", fac, " + ", Fn(rot), "(", x, ")·",
                        Fn("sin"), " θ", fac, ", θ = ", Words("position"), " · ", Sup(format(self.base, "g"), f"-2k/{rd}")],
                       [", ", Words(f"position {where}{part}{scaled} (RoPE, {self.mode})")])


class HeadMap(NamedTuple):
    """Grouped-query heads: query head h reads K/V head h // n_rep."""

    heads: int
    kv_heads: int
    n_rep: int


class Scores(NamedTuple):
    """scores = the score's matrix (Q Kᵀ, ...); ``heads``: grouped-query heads, which K/V head each query head reads."""

    score: str  # a key of attncli.core.scoring.SCORES
    symbol: tuple[Term, ...]  # its matrix in symbols (the registry's Score.symbol): Q Kᵀ
    heads: HeadMap | None = None

    def formula(self) -> Formula:
        return formula([Name("scores"), " = ", self.symbol])


class Sink(NamedTuple):
    """gpt-oss's sinks: one logit per query head in the softmax's denominator."""

    values: tuple[float, ...]
    before: str = "masked"  # the softmax's input

    def formula(self) -> Formula:
        return formula([Name("sink"), " = ", Fn("exp"), "(", Sub("sink", "h"), ") / (", Fn("exp"), "(", Sub("sink", "h"),
                        ") + ", Sub("Σ", "j"), " ", Fn("exp"), "(", Sub(self.before, "ij"), "))"],
                       [": ", Words("the sink's share of each row"), " = 1 - ", Sub("Σ", "j"), " ", Sub("weights", "ij")])


class Softmax(NamedTuple):
    """softmax (or weights) over the keys of ``before``; ``sinks``: with a sink logit per head."""

    before: str
    sinks: bool = False
    name: str = "weights"  # the step: softmax when hard attention or dropout follows, else weights

    def formula(self) -> Formula:
        b = self.before
        if not self.sinks:
            return formula([Name(self.name), " = ", Fn("softmax"), "(", Name(b), ", ", Words("over keys"), ")"])
        return formula([Name(self.name), " = ", Fn("exp"), "(", Sub(b, "ij"), ") / (", Fn("exp"), "(", Sub("sink", "h"),
                        ") + ", Sub("Σ", "j"), " ", Fn("exp"), "(", Sub(b, "ij"), "))"],
                       [": ", Words("softmax over "), "[", Name(b), " | ", Sub("sink", "h"), "]",
                        Words(", the sink's column dropped")])


class Hard(NamedTuple):
    """One-hot at each row's largest weight (ties: the first key)."""

    before: str

    def formula(self) -> Formula:
        return formula([Name("hard"), " = ", Words("one-hot at each row's largest weight")],
                       [Words(" (ties: the first key)")])


class Dropout(NamedTuple):
    """weights · keep / (1 - p), keep from numpy.random.default_rng(seed)."""

    p: float
    seed: int
    before: str = "softmax"

    def formula(self) -> Formula:
        return formula([Name("dropout"), " = ", Name(self.before), " · ", Words("keep"), " / (1 - P)"],
                       [", P(keep = 0) = P = ", Num(self.p), ", ", Words("keep from "), Fn("default_rng"),
                        f"({self.seed})"])


class WeightedSum(NamedTuple):
    """output (or one head's output, head_h) = weights · V."""

    out: str  # output or head_output
    weights: str = "weights"  # the step whose weights multiply V (weights, hard, dropout)

    def formula(self) -> Formula:
        return formula([Head() if self.out == "head_output" else Name(self.out), " = ", Name(self.weights), " · V"])


class Concat(NamedTuple):
    """concat (output without W_o) = the heads side by side, in order."""

    out: str
    heads: int

    def formula(self) -> Formula:
        return formula([Name(self.out), " = ", Fn("concat"), "(", Sub("head", "0"), ", …, ",
                        Sub("head", str(self.heads - 1)), ")"], [": ", Words("the heads side by side, in order")])


class HeadMean(NamedTuple):
    """avg_weights = the mean over the heads of the weights (as nn.MultiheadAttention returns them)."""

    def formula(self) -> Formula:
        return formula([Name("avg_weights"), " = ", Words("mean of the heads' weights")],
                       [Words(" (as nn.MultiheadAttention returns them)")])


class Scaling(NamedTuple):
    """The scaling rule as the explanations show it: ``factor`` None when it depends on the scores."""

    rule: str
    factor: float | None
    temperature: float | None
    name: str = "none"  # the rule (a key of attncli.core.scoring.SCALINGS), or "scale" for --scale
    d: int = 0
    n: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "factor": self.factor, "temperature": self.temperature}


class AlibiFacts(NamedTuple):
    q_offset: int
    slopes: tuple[float, ...]
    form: str = "relative"  # a key of attncli.core.alibi.FORMS
    divisor: float | None = None  # ALiBi added before the scale (--alibi-scaled): divided by this after attncli's scale

    def as_json(self) -> dict[str, Any]:
        return {"q_offset": self.q_offset, "slopes": list(self.slopes), "form": self.form, "divisor": self.divisor}


class Initialised(NamedTuple):
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
                out[f.name] = v.as_json() if hasattr(v, "as_json") else v
        return out
