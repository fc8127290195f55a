"""The checkpoint families attncli reads, each declared with its complete attention specification,
and the ones it knows and refuses (io layer).

A checkpoint with a config.json is read only when its ``model_type`` is declared here (or the
user forces a declaration with ``--layout NAME``, at their own risk). The declaration says which
layout reader parses the tensors and everything the family's HF ``*Attention.forward`` does around
them: rotary style per layer, pre-attention norm (kind and tensor), QK-norm kind, the score scale's
config key, causality, which config keys it reads. Then every config key that changes attention
(:data:`ATTENTION_KEYS`) and that the declaration does not read must hold its neutral value, else
the read is refused in one line naming the key ("granite: attention_multiplier is not supported").

    family             layout  rope (per layer)        pre-norm (tensor)             other
    llama & co         llama   half                    RMS input_layernorm           q_norm/k_norm RMS per head
    gemma, 2, 3, vault llama   half                    RMS (1 + w)                   query_pre_attn_scalar, soft-cap
    granite(moe)       llama   half                    RMS                           scale = attention_multiplier
    granite(moe)_swa   llama   half, theta per layer   RMS                           + sliding layers, sinks
    helium, ernie4_5   llama   interleaved             RMS
    glm, glm4          llama   partial interleaved     RMS
    smollm3            llama   half, NoPE layers       RMS                           no_rope_layers
    exaone4            llama   half; full layers NoPE  none (post-norm)              when the model slides
    cohere2            llama   interleaved; full NoPE  LayerNorm without bias
    cohere             llama   interleaved             LayerNorm without bias        QK LayerNorm per head, (H, d)
    stablelm           llama   partial half            LayerNorm with bias           QK LayerNorm per head (norms.h)
    olmo2, olmo3       llama   half                    none (post-norm)              QK RMS over the full width H·d
    flex_olmo          llama   half                    none (post-norm)              as olmo2
    olmoe, minimax_m2  llama   half (partial)          RMS                           QK RMS over the full width H·d
    qwen3_next, 3_5    llama   partial half            RMS (1 + w)                   QK RMS (1 + w); sigmoid gate rows in q_proj
    lfm3               llama   half (sliding layers)   RMS operator_norm             sigmoid(gate_proj(x)) per head
    hunyuan_v1_*       llama   half                    RMS                           QK RMS per head after RoPE
    nanochat           llama   half, rotated by -θ     weightless RMS                weightless QK RMS after RoPE
    starcoder2, jais2  llama   half                    LayerNorm with bias
    nemotron           llama   partial half            LayerNorm1p (1 + w, bias)
    apertus            llama   half                    RMS attention_layernorm
    phi3               llama   half (partial)          RMS                           fused qkv_proj [Q; K; V]
    phi                phi     partial half            LayerNorm with bias           self_attn.dense
    persimmon          persimmon partial half          LayerNorm with bias           query_key_value (H, 3, d)
    falcon             bloom   half, or ALiBi          LayerNorm ln_attn / input_layernorm  rows (G, H/G + 2, d)
    gpt_neo            gpt_neo none                    LayerNorm ln_1                scale 1, local layers
    olmo               llama   half                    LayerNorm without weights     clip_qkv (q, k, v clamped)
    bitnet             llama   half                    RMS                           attn_sub_norm before o_proj
    afmoe              llama   half on sliding layers  RMS                           sigmoid(gate_proj(x)) gate before o_proj
    laguna             llama   half (partial per type) RMS                           softplus(g_proj(x)) gate; heads per layer
    llama4_text        llama   interleaved; NoPE layers RMS                          chunked RoPE layers, q tuning
    bert & co          bert    none                    post-norm (none before)       bidirectional
    roformer           bert    interleaved (sinusoidal) post-norm (none before)      bidirectional
    esm                bert    half (rotary) or none    LayerNorm attention.LayerNorm q · d^-0.5 before the rotary
    roberta-prelayernorm, xlm-roberta-xl, megatron-bert: bert, a LayerNorm inside the attention module
    opt, biogpt, xglm  bart    none                    LayerNorm self_attn_layer_norm (OPT: do_layer_norm_before)
    bart, marian, ...  bart    none                    post-norm (pegasus, mbart, whisper, ...: pre-norm)
    distilbert         distilbert none                 post-norm (none before)       bidirectional
    albert             albert  none                    post-norm (none before)       layers share groups
    deepseek_v2/v3 &co mla     interleaved (V3: rope_interleave; minicpm3 half) on qk_rope_head_dim, RMS input_layernorm,
                               multi-head latent attention (q/kv latents with their RMSNorms)
    modernbert         modernbert half, theta per layer type LayerNorm attn_norm (layer 0: none) fused Wqkv, local layers
                                                                                     |j - i| <= local_attention // 2
    modernbert-decoder modernbert half, theta per layer type LayerNorm attn_norm (layer 0: none) q/k/v_proj, Wo, causal
                                                                                     sliding_window on local layers
    ultrabert          llama   half, theta per layer type RMS                        bidirectional, local layers
                                                                                     |j - i| <= sliding_window
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Rule = Callable[[int, dict[str, Any], "str | None"], bool]  # (layer, config, layer type) -> yes/no
TypeRule = Callable[[int, "dict[str, Any] | None"], "str | None"]  # (layer, config or None) -> its type


@dataclass(frozen=True)
class Family:
    """One family's attention, as its HF modeling file computes it."""
    model_type: str
    layout: str  # the reader (attncli.io.layouts.LAYOUTS)
    rope: str | None = "half"  # "half" | "interleaved" | None (learned or no positions)
    nope: Rule | None = None  # the layers without rotary (NoPE)
    pre_norm: str | None = "rms"  # rms | rms1p | layernorm | layernorm1p | layernorm-weightless | rms-weightless
    # | None (nothing before attention)
    norm_name: str = "input_layernorm"  # the pre-norm's tensor after the layer's prefix (without .weight), every layout
    norm_at: str = "before"  # where pre_norm sits: "before" the attention module | "inside" it, first (pre-LN BERTs,
    # ESM); either way X is the query projection's input, and --from-residual applies the norm
    qk_norm: str | None = "rms"  # the QK-norm kind (attncli.core.options.QkNorm) when its tensors are there
    qk_at: str = "before-rope"  # where it sits: before-rope | after-rope (HunYuan, nanochat)
    qk_names: tuple[str, str] = ("q_norm", "k_norm")  # its tensors after self_attn. (.weight, or .norms.N.weight)
    qk_weightless: bool = False  # applied without tensors, w = 1 (nanochat; Llama 4's L2 norm)
    qk_layers: Rule | None = None  # the layers a weightless QK-norm applies to (None: every layer; Llama 4: rope layers)
    rope_alpha: bool = False  # rope_parameters {rope_type: dynamic, alpha}: a fixed NTK base theta·alpha^(d/(d-2))
    qk_key: str | None = None  # the config key that switches it on (qk_layernorm, use_qk_norm): must agree with the tensors
    scale: str | None = None  # attention_multiplier | query_pre_attn_scalar: the config key setting the scale;
    # "none": no scaling (GPT-Neo, T5) | "gpt2": scale_attn_weights, scale_attn_by_inverse_layer_idx | "mscale": the
    # rope scaling's mscale_all_dim, head_dim^-0.5 · mscale² (MLA's yarn_get_mscale)
    causal: bool = True
    chunked: Rule | None = None  # the layers with chunked attention (Llama 4: attention_chunk_size)
    sub_norm: str | None = None  # an RMSNorm of the concatenated heads before o_proj: its tensor after self_attn.
    window_kind: str = "causal"  # its sliding layers: "causal" (the W keys up to each query) | "both" (|j - i| <= R)
    slides: Rule | None = None  # which layers slide when config.json lists no layer_types (None: every layer)
    always_slides: bool = False  # every layer slides whatever layer_types says (MiniMax's mask), given sliding_window
    rope_keys: frozenset[str] | None = None  # the rotary keys it reads (None: all of ROPE_KEYS)
    full_rotary: bool = False  # rotary over the whole head whatever partial_rotary_factor says; default or linear only
    gate: tuple[str, str] | None = None  # an output gate before o_proj: (its tensor after self_attn., sigmoid | softplus)
    gate_heads: bool = False  # the gate has one output per head, (H, E) (LFM3's g_proj); else one per feature
    heads_key: str | None = None  # a config list of query heads per layer (Laguna: num_attention_heads_per_layer)
    theta_key: str | None = None  # a config list of rotary bases per layer, 0 = NoPE (Granite SWA: layer_rope_theta)
    rms_wide: bool = False  # its RMSNorms compute (w * x.float()).to(dtype): w applied in float32 (the option rms_wide)
    rope_rounding: str | None = None  # how a half-precision q, k are rotated (the option rope_rounding; None: each)
    sink_form: str | None = None  # "scale": sinks as Granite SWA's sigmoid(lse - sink) scale (the option sink_form)
    fused: str | None = None  # its fused q/k/v where the layout has two splits: "groups" (rows (G, H/G + 2, d), G from
    # the config: Falcon) | "linear" (an nn.Linear c_attn: [Q; k; v] by rows under multi_query, else (H, 3, d): GPT-BigCode)
    rope_renamed: tuple[tuple[str, str], ...] = ()  # rope_types its config class renames: (as written, as computed)
    rope_types: frozenset[str] | None = None  # the rope_types its config class accepts (None: any attncli computes)
    rope_table: bool = False  # its sinusoidal rotary table may be stored (embed_positions.weight): checked, base 10000
    requires: tuple[tuple[str, str], ...] = ()  # config keys that must be set: (key, what it is), refused without
    layer_types: bool = False  # config.json must list layer_types (its config class derives them; attncli does not)
    layer_type: TypeRule | None = None  # the layer's type when config.json lists no layer_types (GPT-Neo's
    # attention_layers: "local" slides); None from the rule: config.json does not say (refused)
    causal_from: str | None = None  # causality from the config or the stack instead of ``causal``: "is_decoder" (BERT:
    # config.json is_decoder) | "decoder-stack" (T5: the decoder's stack is causal) | "encoder-stack" (BART: the
    # encoder's stack is bidirectional)
    window_key: str = "sliding_window"  # the config key of the window (GPT-Neo: window_size)
    window_default: int | None = None  # the window of a local layer when config.json has none (GPT-Neo: 256)
    rope_whole: bool = False  # rotary over the whole head, base rope_theta (default 10000; the stored table where
    # rope_table), no partial factor or scaling read (RoFormer, ESM: their modeling files read none)
    rope_switch: str | None = None  # a config key choosing the rotary style: false half, else interleaved (DeepSeek-V3's
    # rope_interleave, default true)
    rotary_key: str | None = None  # the config key of the rotary width, whatever the partial factor (MLA: qk_rope_head_dim)
    partial_default: float | None = None  # partial_rotary_factor when config.json says none (Phi, Persimmon: 0.5)
    relative: str | None = None  # "t5": T5's bucketed relative position bias (relative_attention_num_buckets, ...)
    alibi: str | None = None  # ALiBi in this form (attncli.core.alibi.FORMS), instead of rotary: Bloom, Falcon
    alibi_key: str | None = None  # the config key that switches ALiBi on (Falcon: alibi; else rotary); None: always
    alibi_scaled: bool = False  # ALiBi added to q·k before the scale (Falcon), else after it (Bloom)
    norm_switch: str | None = None  # a config key whose false makes the layer post-norm (OPT: do_layer_norm_before)
    norm_affine: str | None = None  # a config key whose false leaves the LayerNorm without weight and bias (OPT:
    # layer_norm_elementwise_affine)
    split_qkv: bool = False  # the layout's separate q/k/v projections, not its fused tensor (ModernBERT's decoder:
    # attn.q/k/v_proj where the encoder has attn.Wqkv); the other form is refused
    norm_skip: Rule | None = None  # the layers whose pre-norm is an nn.Identity (ModernBERT: layer 0): none there
    layer_kinds: tuple[str, ...] = ()  # the layer types the declaration reads (others refused); empty: any
    type_theta: tuple[tuple[str, str, float, str | None], ...] = ()  # per layer type (type, config key, default, a
    # key beside which its absence is ambiguous): the rotary base where rope_parameters gives none for the type
    # (ModernBERT: global_rope_theta, local_rope_theta; transformers 4 defaulted the local one to the global one)
    window_half: tuple[str, int] | None = None  # (config key, default): the window is half of it where window_key is
    # absent (ModernBERT: local_attention // 2, default 128)
    keys: frozenset[str] = frozenset()  # further config keys this declaration reads
    notes: str = ""

    def missing(self, cfg: dict[str, Any]) -> str | None:
        """The refusal for the first required key config.json does not set (None: all set)."""
        for key, what in self.requires:
            if cfg.get(key) is None:
                return f"{self.model_type}: config.json has no {key}, {what}"
        return None

    def reads(self) -> frozenset[str]:
        """Every attention key of config.json this declaration reads (the rest must be neutral)."""
        keys = set(self.keys) | set(LAYOUT_KEYS.get(self.layout, ()))
        if self.rope:
            keys |= ROPE_KEYS if self.rope_keys is None else self.rope_keys
        if self.scale in ATTENTION_KEYS:  # a config key (not "none" or "gpt2", the layout's own rules)
            keys.add(self.scale)
        if self.window_key != "sliding_window":
            keys.add(self.window_key)
        for key in (self.norm_switch, self.norm_affine, self.rope_switch, self.rotary_key):
            if key:
                keys.add(key)
        if self.qk_key:
            keys.add(self.qk_key)
        if self.heads_key:
            keys.add(self.heads_key)
        if self.theta_key:
            keys.add(self.theta_key)
        return frozenset(keys)


ROPE_KEYS = frozenset({"rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor", "rotary_pct",
                       "rotary_dim", "rotary_emb_base", "rope_local_base_freq"})
WINDOW_KEYS = frozenset({"sliding_window", "layer_types", "use_sliding_window", "max_window_layers",
                         "sliding_window_pattern", "_sliding_window_pattern"})
SHAPE_KEYS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "n_head", "n_embd",
                        "num_heads", "d_kv", "d_model", "num_hidden_layers"})  # checked against the tensors
LAYOUT_KEYS: dict[str, frozenset[str]] = {
    "llama": frozenset({"attention_bias", "rms_norm_eps", "head_dim"}),
    "bert": frozenset({"is_decoder", "position_embedding_type", "layer_norm_eps"}),
    "gpt2": frozenset({"scale_attn_weights", "scale_attn_by_inverse_layer_idx", "layer_norm_epsilon"}),
    "gptj": frozenset({"layer_norm_epsilon"}),
    "neox": frozenset({"layer_norm_eps", "use_parallel_residual"}),
    "bloom": frozenset({"layer_norm_epsilon"}),
    "phi": frozenset({"head_dim"}),
    "t5": frozenset({"relative_attention_num_buckets", "relative_attention_max_distance", "layer_norm_epsilon"}),
    "bart": frozenset({"is_decoder", "decoder_attention_heads", "encoder_attention_heads", "attention_heads",
                       "decoder_layers", "encoder_layers", "num_layers"}),
    "distilbert": frozenset({"dim", "n_heads", "n_layers"}),
    "albert": frozenset({"num_hidden_groups", "inner_group_num"}),
    "modernbert": frozenset({"attention_bias", "norm_eps", "norm_bias", "local_attention", "global_attn_every_n_layers",
                             "global_rope_theta", "local_rope_theta", "layer_types", "sliding_window"}),
}

# Layouts whose tensor names alone leave the attention open: without config.json (and without --layout) a read
# would guess these, so it is refused (mha, bert, gpt2, bloom, t5 and TransformerLens carry no such guess).
CONFIG_DECIDES: dict[str, str] = {  # layout -> what config.json decides
    "llama": "RoPE style and base, NoPE layers, window, scale",
    "phi3": "RoPE base and partial rotary, window",
    "gptj": "rotary_dim, RoPE base",
    "neox": "rotary_pct, RoPE base",
    "phi": "partial rotary, RoPE base, heads",
    "persimmon": "partial rotary, RoPE base, heads",
    "gpt_neo": "which layers are local, window_size, heads",
    "bart": "causal or not, pre- or post-norm, heads",
    "mla": "the latent widths, RoPE style and base, heads",
    "modernbert": "causal or not, local layers, window, RoPE bases, heads",
}


def _off(v: Any) -> bool:
    return v is None or v is False or v == [] or v == {}


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: _off(v) or (not isinstance(v, bool) and v in values) or v is True and True in values


def _true(v: Any) -> bool:
    """Neutral when absent or true (do_layer_norm_before, scale_attn_weights: false changes attention)."""
    return v is None or v is True


def _all_full(v: Any) -> bool:
    return _off(v) or (isinstance(v, list) and all(t in ("full_attention", "attention", "global") for t in v))


def _all_ones(v: Any) -> bool:
    return _off(v) or (isinstance(v, list) and all(x in (1, True) for x in v))


# config key -> (its neutral values, what it does): a key the declaration does not read must be neutral
ATTENTION_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "attention_multiplier": (_off, "the score scale"),
    "attention_in_multiplier": (_is(1, 1.0), "a factor on the attention input"),
    "key_multiplier": (_is(1, 1.0), "a factor on the keys"),
    "query_pre_attn_scalar": (_off, "the score scale"),
    "attn_logit_softcapping": (_off, "a soft-cap of the scores"),
    "clip_qkv": (_off, "a clamp of q, k, v"),
    "qk_layernorm": (_off, "LayerNorm of q and k per head"),
    "use_qk_norm": (_off, "a norm of q and k"),
    "attention_chunk_size": (_off, "chunked attention"),
    "attn_temperature_tuning": (_off, "query temperature tuning"),
    "no_rope_layers": (_all_ones, "layers without rotary (NoPE)"),
    "rope_interleave": (_off, "interleaved rotary"),
    "sliding_window": (_off, "a sliding window"),
    "use_sliding_window": (_off, "a sliding window"),
    "layer_types": (_all_full, "sliding / chunked / other layers"),
    "sliding_window_pattern": (_off, "which layers slide"),
    "attention_window": (_off, "local windowed attention"),
    "attention_windows": (_off, "per-layer local windows"),
    "local_attention": (_off, "local (windowed) layers"),
    "global_attn_every_n_layers": (_is(1), "which layers are local"),
    "global_rope_theta": (_off, "rotary positions"),
    "local_rope_theta": (_off, "rotary positions of local layers"),
    "attention_type": (_is("original_full"), "sparse attention"),
    "attention_layers": (_all_full, "local layers"),
    "position_embedding_type": (_is("absolute"), "relative or rotary positions in the scores"),
    "relative_attention": (_off, "disentangled relative attention"),
    "pos_att_type": (_off, "disentangled relative attention"),
    "use_bidirectional_attention": (_off, "bidirectional attention"),
    "is_decoder": (_off, "causal attention"),
    "scale_attn_weights": (_true, "the score scale"),
    "scale_attn_by_inverse_layer_idx": (_off, "the score scale"),
    "multi_query": (_off, "multi-query attention"),
    "new_decoder_architecture": (_off, "grouped fused q, k, v"),
    "alibi": (_off, "ALiBi"),
    "rotary_value": (_off, "rotary on the values"),
    "use_attention_gate": (_off, "an output gate"),
    "swa_head_dim": (_off, "per-layer head sizes"),
    "num_attention_heads_per_layer": (_off, "per-layer head counts"),
    "do_layer_norm_before": (_true, "post-norm layers"),
    "use_post_norm": (_off, "post-norm layers"),
    "rotary_dim": (_off, "rotary on part of each head"),
    "partial_rotary_factor": (_is(1, 1.0), "rotary on part of each head"),
    "rotary_pct": (_is(1, 1.0), "rotary on part of each head"),
    "rope_parameters": (_off, "rotary positions"),
    "rope_scaling": (_off, "rotary scaling"),
    "rope_theta": (_off, "rotary positions"),
    "kv_lora_rank": (_off, "multi-head latent attention"),
    "q_lora_rank": (_off, "multi-head latent attention"),
    "index_n_heads": (_off, "a sparse-attention indexer"),
    "keep_window_size": (_off, "a dynamic mask"),
    "lambda_std_dev": (_off, "differential attention"),
    "layer_rope_theta": (_off, "per-layer rotary bases"),
    "use_prompt": (_off, "prompt keys and values prepended to the attention (MVP)"),
}


def _full_nope(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Cohere2 / EXAONE 4: the full-attention layers of a sliding model have no rotary."""
    return cfg.get("sliding_window") is not None and lt == "full_attention"


def _unless_sliding(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """AFMoE: rotary on its sliding (local) layers only; the full-attention layers have none."""
    return lt != "sliding_attention"


def _theta_nope(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Granite SWA: a layer whose layer_rope_theta is 0 (or null) has no rotary."""
    thetas = cfg.get("layer_rope_theta")
    return isinstance(thetas, list) and i < len(thetas) and not thetas[i]


def _no_rope_layers(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    nope = cfg.get("no_rope_layers")
    return isinstance(nope, list) and i < len(nope) and not nope[i]


def _rope_layer(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    return not _no_rope_layers(i, cfg, lt)


def _even_layers(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Gemma 2, gpt-oss: the even layers slide."""
    return i % 2 == 0


def _gemma3_pattern(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Gemma 3: every layer slides but each sliding_window_pattern-th (default 6)."""
    return (i + 1) % int(cfg.get("sliding_window_pattern", 6)) != 0


def _max_window_layers(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Qwen 2 / 3: with use_sliding_window and a sliding_window, the layers from max_window_layers on slide (a null
    window: none does, as Qwen2Config derives layer_types)."""
    return bool(cfg.get("use_sliding_window")) and cfg.get("sliding_window") is not None \
        and i >= int(cfg.get("max_window_layers", 0))


def _two_of_three(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """UltraBERT (UltrabertConfig's default layer_types): every third layer is full, the others local."""
    return (i + 1) % 3 != 0


def _llama4_chunked(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Llama 4: layer_types says; without it (as Llama4TextConfig derives it) the layers with rotary are chunked."""
    if lt is not None:
        return lt == "chunked_attention"
    nope = cfg.get("no_rope_layers")
    return isinstance(nope, list) and i < len(nope) and bool(nope[i])


def _every_n_global(i: int, cfg: dict[str, Any] | None) -> str | None:
    """ModernBERT (transformers 4's config, no layer_types): every global_attn_every_n_layers-th layer (default 3)
    is global from layer 0 on, the others local (the value checked with config.json)."""
    every = int((cfg or {}).get("global_attn_every_n_layers") or 3)
    return "sliding_attention" if i % every else "full_attention"


def _first_layer(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """ModernBERT: layer 0's attn_norm is an nn.Identity."""
    return i == 0


def _neo_layer_type(i: int, cfg: dict[str, Any] | None) -> str | None:
    """GPT-Neo: "global" or "local" from attention_layers, else attention_types [[["global", "local"], N], ...]
    expanded (GPTNeoConfig.expand_attention_types_params); bare weights (no config.json): GPTNeoConfig's default
    alternation, global first; None: config.json does not say."""
    if cfg is None:
        return "local" if i % 2 else "global"
    kinds = cfg.get("attention_layers")
    if kinds is None and cfg.get("attention_types") is not None:
        try:
            kinds = [k for group, n in cfg["attention_types"] for _ in range(int(n)) for k in group]
        except (TypeError, ValueError):
            return None
    if not isinstance(kinds, list) or i >= len(kinds) or kinds[i] not in ("global", "local"):
        return None
    return str(kinds[i])


FAMILIES: dict[str, Family] = {}


def declare(*model_types: str, **kw: Any) -> None:
    for mt in model_types:
        FAMILIES[mt] = Family(mt, **kw)


W = WINDOW_KEYS
# Llama-style self_attn.{q,k,v,o}_proj; read from each modeling_*.py's Attention.forward (transformers 5.23)
declare("llama", "mistral", "mixtral", "qwen2_moe", "qwen3_moe", "ministral", "arcee", "aria_text",
        "cwm", "dots1", "glm4_moe", "hy_v3", "internlm3", "iquestcoder", "kolibri1", "mellum",
        "seed_oss", "solar_open", "falcon_h1",
        layout="llama", keys=W)
# Phi3Config renames rope_type su and yarn to longrope (not computed here) and refuses every other scaling type
declare("phi3", layout="llama", keys=W, rope_renamed=(("su", "longrope"), ("yarn", "longrope")),
        rope_types=frozenset({"default", "longrope"}))
declare("qwen2", "qwen3", layout="llama", keys=W, slides=_max_window_layers)
declare("minimax", layout="llama", keys=W, always_slides=True)  # its mask slides on every attention layer
for mt in ("phimoe", "starcoder2", "jais2"):  # nn.LayerNorm with bias before attention
    declare(mt, layout="llama", pre_norm="layernorm", keys=W | {"norm_epsilon", "layer_norm_eps", "use_bias"})
declare("gemma", layout="llama", pre_norm="rms1p", qk_norm="rms1p")
GEMMA2: dict[str, Any] = dict(layout="llama", pre_norm="rms1p", qk_norm="rms1p", scale="query_pre_attn_scalar",
                              keys=W | {"attn_logit_softcapping"})
declare("gemma2", slides=_even_layers, **GEMMA2)
declare("gemma3_text", slides=_gemma3_pattern, **GEMMA2)
declare("vaultgemma", **GEMMA2)
declare("gpt_oss", layout="llama", keys=W, rms_wide=True, slides=_even_layers,
        notes="sinks: one logit per head in the softmax denominator; RMSNorm (w * x.float()).to(dtype)")
MULTIPLIER = (("attention_multiplier", "the score scale"),)
declare("granite", "granitemoe", "granitemoeshared", layout="llama", scale="attention_multiplier", requires=MULTIPLIER)
# Granite SWA: Granite's attention (scale attention_multiplier) with sliding layers, a rotary base per layer
# (layer_rope_theta; 0: NoPE) and a sink per head applied after the weights: output · sigmoid(logsumexp(scores) -
# sink_h) = Σ_j exp(s_j) v_j / (Σ_j exp(s_j) + exp(sink_h)), gpt-oss's sink logit in the softmax's denominator (the
# weights attncli shows are the ones multiplying V; HF's output_attentions returns them before the sink's share)
declare("granite_swa", "granitemoe_swa", layout="llama", scale="attention_multiplier", requires=MULTIPLIER, nope=_theta_nope,
        theta_key="layer_rope_theta", keys=W, layer_types=True, sink_form="scale",
        notes="sinks: sigmoid(lse - sink) scaling = a sink logit in the denominator; layer_rope_theta per layer")
declare("hyperclovax", layout="llama", scale="attention_multiplier", requires=MULTIPLIER,
        keys=frozenset({"use_post_norm"}))  # post_norm1/2: after the attention output, outside the module
declare("helium", layout="llama", rope="interleaved", keys=frozenset({"use_bias"}), rms_wide=True,
        notes="RMSNorm (w.float() * x.float()).to(dtype)")
declare("ernie4_5", "ernie4_5_moe", layout="llama", rope="interleaved", rope_rounding="once-float32",
        keys=frozenset({"use_bias"}))
declare("glm", "glm4", layout="llama", rope="interleaved")
declare("smollm3", layout="llama", nope=_no_rope_layers, keys=W | {"no_rope_layers", "no_rope_layer_interval"})
declare("exaone4", layout="llama", nope=_full_nope, pre_norm=None, keys=W)  # post-norm only
declare("exaone_moe", layout="llama", nope=_full_nope, keys=W)  # unlike exaone4, an input_layernorm
declare("cohere2", "cohere2_moe", layout="llama", rope="interleaved", nope=_full_nope, pre_norm="layernorm",
        rope_rounding="once", keys=W | {"layer_norm_eps", "logit_scale"})
declare("nemotron", layout="llama", pre_norm="layernorm1p", keys=frozenset({"norm_eps"}))
declare("stablelm", layout="llama", pre_norm="layernorm", qk_norm="layernorm", qk_names=("q_layernorm", "k_layernorm"),
        qk_key="qk_layernorm", keys=frozenset({"layer_norm_eps", "use_qkv_bias", "use_parallel_residual"}),
        notes="qk_layernorm: an nn.LayerNorm (no bias) per head, each head its own weight")
declare("cohere", layout="llama", rope="interleaved", pre_norm="layernorm", qk_norm="layernorm", qk_key="use_qk_norm",
        rope_rounding="once", keys=frozenset({"layer_norm_eps", "logit_scale"}),
        notes="use_qk_norm: CohereLayerNorm (H, d); parallel block; logit_scale multiplies the LM logits only")
declare("olmo2", layout="llama", pre_norm=None, qk_norm="rms-full", rms_wide=True, rope_rounding="once-float32",
        notes="q_norm (H·d) / k_norm (G·d): RMSNorm over the full width before the head split; post-norm")
declare("olmo3", layout="llama", pre_norm=None, qk_norm="rms-full", keys=W, rms_wide=True, rope_rounding="once-float32",
        notes="as olmo2, with sliding layers (layer_types)")
# OLMoE, MiniMax-M2: OLMo 2's full-width QK RMSNorm (q_norm (H·d), k_norm (G·d) before the head split) with a pre-norm
# input_layernorm; OLMoE clamps q, k, v (clip_qkv) after that norm, which attncli's clip (right after the projections,
# before the norm) is not, so a non-null clip_qkv is refused (not read). FlexOlmo: OLMo 2's attention (post-norm).
declare("olmoe", "minimax_m2", layout="llama", qk_norm="rms-full",
        notes="q_norm / k_norm: RMSNorm over the full width before the head split; input_layernorm before attention")
declare("flex_olmo", layout="llama", pre_norm=None, qk_norm="rms-full", rms_wide=True, rope_rounding="once-float32",
        notes="as olmo2")
declare("nanochat", layout="llama", rope="half-reversed", pre_norm="rms-weightless", qk_at="after-rope",
        qk_weightless=True, notes="no norm tensors: weightless RMS pre-norm, weightless RMS QK-norm after RoPE")
declare("hunyuan_v1_dense", "hunyuan_v1_moe", layout="llama", qk_at="after-rope", rope_alpha=True,
        qk_names=("query_layernorm", "key_layernorm"), notes="query_layernorm / key_layernorm: RMS per head after RoPE")
declare("olmo", layout="llama", pre_norm="layernorm-weightless", rope_rounding="once-float32", keys=frozenset({"clip_qkv"}),
        notes="clip_qkv: q, k, v clamped right after the projections (the steps q_clip, k_clip, v_clip)")
declare("bitnet", layout="llama", sub_norm="attn_sub_norm",
        notes="attn_sub_norm: an RMSNorm of the concatenated heads before o_proj (the step sub_norm); nn.Linear "
              "projections (BitLinear only under a quantization config)")
# Llama 4 text: interleaved rotary (complex pairs) on its RoPE layers, which are chunked; NoPE layers are full,
# with the temperature tuning of q. use_qk_norm: its L2 norm (x·rsqrt(mean(x²) + eps), weightless RMS) of q and k
# after RoPE, on the RoPE layers only (Llama4TextAttention: `if config.use_qk_norm and self.use_rope`).
declare("llama4_text", layout="llama", rope="interleaved", nope=_no_rope_layers, chunked=_llama4_chunked,
        qk_norm="rms", qk_at="after-rope", qk_weightless=True, qk_key="use_qk_norm", qk_layers=_rope_layer,
        rope_rounding="once-float32",  # view_as_complex(q.float()) · freqs_cis (float32), type_as(q)
        keys=frozenset({"layer_types", "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size",
                        "attn_temperature_tuning", "floor_scale", "attn_scale"}))
declare("apertus", layout="llama", norm_name="attention_layernorm")
# AFMoE: q_norm / k_norm (RMS per head), rotary on the sliding layers only, and an output gate: the concatenated heads
# times sigmoid(gate_proj(x)), feature by feature, before o_proj (AfmoeAttention.forward); post_attention_layernorm is
# after o_proj, outside the module; mup_enabled scales the embeddings only
# (global_attn_every_n_layers only derives layer_types in its config class, which the modeling file reads)
declare("afmoe", layout="llama", nope=_unless_sliding, gate=("gate_proj", "sigmoid"), layer_types=True, rms_wide=True,
        keys=W | {"global_attn_every_n_layers"},
        notes="gate_proj: gated = concat ⊙ sigmoid(x · W_g) before o_proj (the steps gate, gated); NoPE full layers")
# Laguna: as AFMoE with rotary on every layer (rope_parameters per layer type, partial_rotary_factor), query heads per
# layer (num_attention_heads_per_layer), and softplus(g_proj(x)) as the gate: one per head (gating true or per-head,
# g_proj (H, E)) or one per feature (otherwise, (H·d, E)), computed in float32
declare("laguna", layout="llama", gate=("g_proj", "softplus"), heads_key="num_attention_heads_per_layer", layer_types=True,
        keys=W | {"gating"}, notes="g_proj: gated = concat ⊙ softplus(x · W_g), per head or per feature, before o_proj")
# LFM3: a hybrid; its attention layers (layer_types full_attention / sliding_attention, the others conv) as Qwen 3's
# (q_norm / k_norm RMS per head before rotary), pre-norm operator_norm (RMS, norm_eps), and (use_attention_gate) an
# output gate sigmoid(g_proj(x)), one per head, before o_proj (g_proj in memory, saved as gate_proj: transformers'
# conversion mapping); post_operator_norm (use_sandwich_norm) is outside
declare("lfm3", layout="llama", norm_name="operator_norm", rope_rounding="once-float32",
        gate=("gate_proj", "sigmoid"), gate_heads=True,
        layer_types=True, keys=W | {"norm_eps", "use_attention_gate", "use_sandwich_norm"},
        notes="gate_proj: gated = each head ⊙ sigmoid(x · W_g)_h before o_proj; conv layers refused")
# Qwen3-Next, Qwen3.5 (text): hybrids; their full_attention layers are Qwen 3's with (1 + w) RMSNorms (input_layernorm,
# q_norm / k_norm per head) and an output gate from q_proj itself: per head, d query rows then d gate rows, and the
# concatenated heads times sigmoid(gate) before o_proj; the linear_attention layers (Gated DeltaNet) are refused
declare("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", layout="llama", pre_norm="rms1p", qk_norm="rms1p",
        gate=("q_proj", "sigmoid"), layer_types=True, keys=W,
        notes="q_proj = [q_h; gate_h] per head: gated = concat ⊙ sigmoid(x · W_g) before o_proj; linear layers refused")
declare("eurobert", layout="llama", causal=False)
# ModernBERT and UltraBERT: rotary over the whole head whatever partial_rotary_factor says (their own
# compute_default_rope_parameters), theta from rope_parameters per layer type; a top-level rope_theta or
# partial_rotary_factor is not read (refused when set)
MB_ROPE = frozenset({"rope_parameters", "rope_scaling"})
# UltraBERT: EuroBERT's attention with rotary theta per layer type and local layers seeing |j - i| <= sliding_window
# (masking_utils.sliding_window_bidirectional_overlay); which layers are local: layer_types, else (i + 1) % 3 != 0
declare("ultrabert", layout="llama", causal=False, window_kind="both", keys=W, rope_keys=MB_ROPE, full_rotary=True,
        slides=_two_of_three)
# ModernBERT: fused Wqkv = [Q; K; V] by rows, Wo, attention_bias; half rotary with theta per layer type
# (rope_parameters, or global_rope_theta / local_rope_theta); local layers (layer_types, else i % every_n != 0) see
# |j - i| <= local_attention // 2 (config.sliding_window); pre-norm attn_norm (LayerNorm, bias if norm_bias), layer 0's
# an nn.Identity. The decoder: q/k/v_proj and Wo, causal, its local layers the causal window of sliding_window keys.
MODERNBERT: dict[str, Any] = dict(
    layout="modernbert", pre_norm="layernorm", norm_name="attn_norm", qk_norm=None, rope_rounding="once",
    rope_keys=MB_ROPE, full_rotary=True, norm_skip=_first_layer, layer_type=_every_n_global,
    layer_kinds=("full_attention", "sliding_attention"), window_half=("local_attention", 128),
    type_theta=(("full_attention", "global_rope_theta", 160000.0, None),
                ("sliding_attention", "local_rope_theta", 10000.0, "global_rope_theta")))
declare("modernbert", causal=False, window_kind="both", **MODERNBERT)
declare("modernbert-decoder", split_qkv=True, **MODERNBERT)
# BERT-style encoders: attention.self.{query,key,value}, attention.output.dense; post-norm
declare("bert", "bert-generation", "camembert", "data2vec-text", "electra", "ernie", "layoutlm", "luke", "rembert",
        "roberta", "roc_bert", "tapas", "xlm-roberta", layout="bert", rope=None, pre_norm=None, causal=False,
        causal_from="is_decoder")
# RoFormer: BERT's attention with sinusoidal rotary on q and k (RoFormerSinusoidalPositionalEmbedding: θ_i = pos ·
# 10000^(-2i/d), sin and cos of pair i applied to features 2i, 2i + 1 (its apply_rotary_position_embeddings): interleaved
# RoPE, base 10000, positions 0..T-1); rotary_value (the same rotation of v) is refused (ATTENTION_KEYS)
declare("roformer", layout="bert", rope="interleaved", pre_norm=None, causal=False, causal_from="is_decoder",
        rope_table=True, rope_whole=True,
        notes="sinusoidal rotary = interleaved RoPE, base 10000; post-norm")


def _esm_nope(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """ESM: rotary (half, rope_theta) only when position_embedding_type is rotary; absolute adds learned positions to
    the embeddings, outside attention."""
    return cfg.get("position_embedding_type", "absolute") != "rotary"


# ESM: q · d^-0.5 before its half rotary (linear: the same scores as scaling them), an nn.LayerNorm inside the
# attention module (attention.LayerNorm) before the projections
declare("esm", layout="bert", rope="half", nope=_esm_nope, pre_norm="layernorm", norm_name="attention.LayerNorm",
        rope_rounding="once",
        norm_at="inside", causal=False, causal_from="is_decoder", rope_whole=True,
        notes="position_embedding_type rotary: half RoPE (rope_theta); absolute: none inside attention")
# BigBird: exact only with attention_type original_full (block_sparse: sparse from 704 tokens on, refused)
declare("big_bird", layout="bert", rope=None, pre_norm=None, causal=False, causal_from="is_decoder")
declare("roberta-prelayernorm", layout="bert", rope=None, pre_norm="layernorm", norm_name="attention.LayerNorm",
        norm_at="inside", causal=False, causal_from="is_decoder")
declare("xlm-roberta-xl", layout="bert", rope=None, pre_norm="layernorm", norm_name="attention.self_attn_layer_norm",
        norm_at="inside", causal=False, causal_from="is_decoder")
declare("megatron-bert", layout="bert", rope=None, pre_norm="layernorm", norm_name="attention.ln", norm_at="inside",
        causal=False, causal_from="is_decoder")
declare("gpt2", "gpt-sw3", layout="gpt2", rope=None, pre_norm="layernorm", norm_name="ln_1", scale="gpt2")
declare("gpt_bigcode", layout="gpt2", rope=None, pre_norm="layernorm", norm_name="ln_1", keys=frozenset({"multi_query"}),
        fused="linear", scale="gpt2",
        notes="c_attn nn.Linear: multi_query [Q; k; v] by rows, else (H, 3, d) per head")
declare("openai-gpt", layout="gpt2", rope=None, pre_norm=None, norm_name="ln_1", scale="gpt2",
        notes="post-LN: ln_1 after attention")
declare("gptj", layout="gptj", rope="interleaved", pre_norm="layernorm", norm_name="ln_1")
declare("gpt_neox", layout="neox", pre_norm="layernorm", partial_default=0.25)  # GPTNeoXConfig: rotary_pct 0.25
declare("gpt_neox_japanese", layout="neox", pre_norm="layernorm")  # its config's default: 1.0
declare("bloom", layout="bloom", rope=None, pre_norm="layernorm", norm_name="input_layernorm", keys=frozenset({"alibi"}),
        alibi="absolute-f32")
# Falcon: query_key_value rows (G, H/G + 2, d) (new_decoder_architecture: G = num_kv_heads; multi_query: G = 1;
# else G = H); rotary half, or ALiBi scaled with the scores; pre-norm ln_attn or input_layernorm (parallel block)
declare("falcon", layout="bloom", pre_norm="layernorm", fused="groups", alibi="absolute-bf16", alibi_key="alibi",
        alibi_scaled=True,
        keys=frozenset({"alibi", "multi_query", "new_decoder_architecture", "num_kv_heads", "num_ln_in_parallel_attn",
                        "parallel_attn", "bias"}),
        notes="alibi: (q·k + bf16(bf16(slope)·bf16(j)))/sqrt(d) (ALiBi form absolute-bf16, scaled); only `dense` after "
              "attention")
# Phi-1/1.5/2 and Persimmon: partial half rotary (partial_rotary_factor, default 0.5), LayerNorm with bias, parallel
# block; qk_layernorm: q_layernorm / k_layernorm, an nn.LayerNorm over each head's features (one (d,) weight and bias
# shared by the heads), before the rotary
for mt in ("phi", "persimmon"):
    declare(mt, layout=mt, pre_norm="layernorm", qk_norm="layernorm", qk_names=("q_layernorm", "k_layernorm"),
            qk_key="qk_layernorm", keys=frozenset({"layer_norm_eps"}), partial_default=0.5)
# GPT-Neo: no score scaling, local layers (attention_layers / attention_types) with window_size
declare("gpt_neo", layout="gpt_neo", rope=None, pre_norm="layernorm", norm_name="ln_1", scale="none",
        layer_type=_neo_layer_type, window_key="window_size", window_default=256,
        keys=frozenset({"attention_layers", "attention_types", "window_size", "layer_norm_epsilon"}))
declare("t5", "mt5", "umt5", "longt5", layout="t5", rope=None, causal=False, pre_norm="rms",
        norm_name="layer.0.layer_norm", causal_from="decoder-stack", scale="none", relative="t5")
# BART-style self_attn.{q,k,v,out}_proj (nn.Linear, biases; Whisper: k_proj without), q · head_dim^-0.5 before the
# product, no positions inside attention (learned / sinusoidal ones are added to the embeddings, in hidden_states[N]).
# Decoder stacks are causal, encoder stacks (encoder.layers) bidirectional. Pre-norm families apply
# self_attn_layer_norm before attention, post-norm ones after the residual (then nothing comes before attention).
# scale_embedding multiplies the embeddings only (outside attention).
BART: dict[str, Any] = dict(layout="bart", rope=None, qk_norm=None, norm_name="self_attn_layer_norm",
                            causal_from="encoder-stack")
PRE_LN = dict(pre_norm="layernorm", norm_affine="layer_norm_elementwise_affine")
declare("opt", **BART, **PRE_LN, norm_switch="do_layer_norm_before",
        keys=frozenset({"enable_bias"}),
        notes="do_layer_norm_before false (OPT-350m): post-norm, nothing before attention")
declare("biogpt", "xglm", **BART, **PRE_LN)
declare("mbart", "pegasus", "blenderbot", "whisper", **BART, **PRE_LN,
        notes="encoder (bidirectional) and decoder (causal) self-attention; "
        "cross-attention refused")
declare("bigbird_pegasus", **BART, **PRE_LN, keys=frozenset({"attention_type"}),
        notes="the decoder's self-attention (plain softmax); its block-sparse encoder is refused")
declare("bart", "marian", "blenderbot-small", "plbart", "mvp", "trocr", **BART, pre_norm=None,
        notes="post-norm: self_attn_layer_norm after the residual; encoder and decoder self-attention")
# LFM2: a hybrid; its attention layers (layer_types full_attention, the others conv) as Llama's with out_proj and
# q_layernorm / k_layernorm (RMS per head, before rotary); pre-norm operator_norm (RMS, norm_eps)
declare("lfm2", layout="bart", pre_norm="rms", norm_name="operator_norm", qk_norm="rms",
        keys=frozenset({"norm_eps", "layer_types", "full_attn_idxs", "num_key_value_heads", "head_dim"}))
# DistilBERT: attention.{q,k,v,out}_lin, q · d^-0.5 (scaling) in the product, bidirectional, post-norm sa_layer_norm
declare("distilbert", layout="distilbert", rope=None, pre_norm=None, causal=False)
# ALBERT: one attention module per group, shared by the layers of that group (layer N = the Nth call of a shared
# AlbertLayer: group int(r / (num_hidden_layers / num_hidden_groups)) with r = N // inner_group_num, inner N % inner)
declare("albert", layout="albert", rope=None, pre_norm=None, causal=False)

NOT_ROTARY = frozenset({"no_rope_layers", "no_rope_layer_interval", "rope_interleave"})  # which layers, or the pairing


def with_class_defaults(model_type: str, config: dict[str, Any] | None) -> dict[str, Any] | None:
    """config.json as transformers reads it through the family's config class: each attention key it leaves out
    filled with the class's default (attncli.io.class_defaults; a null stays null: config.json said it); the class's
    rope_parameters where config.json has no rotary key at all, of any name, or only the older rope_theta (its base
    then replaces the class's); else the file's keys decide."""
    import copy

    from attncli.io.class_defaults import DEFAULTS

    given = DEFAULTS.get(model_type)
    if config is None or not given:
        return config
    rotary = {k for k in config if ("rope" in k or "rotary" in k) and k not in NOT_ROTARY}  # of any name
    fill = {k: v for k, v in given.items() if k not in config and not (k == "rope_parameters" and rotary)}
    params = given.get("rope_parameters")
    if rotary == {"rope_theta"} and isinstance(params, dict) and "rope_theta" in params:
        # transformers' older key alone: the class's rope_parameters with that base (its scaling, its partial
        # rotary factor: gpt-oss's yarn, GLM's half rotary), as convert_rope_params_to_dict fills them
        fill["rope_parameters"] = {**params, "rope_theta": config["rope_theta"]}
    return {**copy.deepcopy(fill), **config} if fill else config  # (the table's rope_parameters never shared)

# Known, and refused: model_type -> what of its attention attncli does not compute (one line each)
REFUSED: dict[str, str] = {
    "diffllama": "differential attention (two softmaxes, lambda, group norm) is not supported",
    "doge": "its dynamic mask (A · softplus(dt_proj(v)) added to the scores) is not supported",
    "flint": "its per-layer rotary and QK-norm placement is not supported",
    "llama4": "the multimodal Llama 4 checkpoint (text_config inside) is not supported; its text stack saved "
              "alone (llama4_text) is",
    "longformer": "local windowed + global attention (attention_window) is not supported",
    "nystromformer": "the Nystrom approximation of softmax attention is not supported",
    "yoso": "the YOSO (LSH) approximation of softmax attention is not supported",
    "mra": "the MRA approximation of softmax attention is not supported",
    "mpt": "its fused Wqkv with clip_qkv / qk_ln is not supported",
    "ministral3": "its query scaling 1 + beta·log(1 + floor(pos / original_max_position_embeddings)) "
                  "(rope_parameters llama_4_scaling_beta) is not supported",
    "mimo_v2_flash": "its value scale (attention_value_scale), v_head_dim and per-layer heads (sliding layers: twice "
                     "the KV heads, sinks) are not supported",
    "mobilebert": "its bottleneck attention (q and k from the bottleneck input, v from the layer input: "
                  "key_query_shared_bottleneck, use_bottleneck_attention) is not supported",
    "convbert": "its mixed attention (span-based dynamic convolution heads concatenated with the self-attention "
                "heads, head_ratio) is not supported",
    "deberta": "disentangled attention (c2p, p2c) is not supported",
    "deberta-v2": "disentangled attention (c2p, p2c) is not supported",
}
MLA = "multi-head latent attention (kv_a_proj_with_mqa, kv_lora_rank) is not supported"
for mt in ("deepseek_v32", "glm_moe_dsa", "axk2", "hy_v4", "kimi_k2"):  # sparse indexers (DSA), other variants
    REFUSED.setdefault(mt, MLA)
# Multi-head latent attention (DeepSeek-V2/V3 MLA), read by the mla layout: Q from q_a_proj, q_a_layernorm
# (RMS, eps 1e-6), q_b_proj (or q_proj); [c | k_pe] = kv_a_proj_with_mqa, kv_a_layernorm(c) then kv_b_proj per head
# [k_nope | v]; RoPE on qk_rope_head_dim features (k_pe shared by every head); scale qk_head_dim^-0.5 (· mscale² of
# mscale_all_dim under a rope scaling). DeepSeek-V2: complex pairs (interleaved); MiniCPM3: half; DeepSeek-V3, Youtu,
# GLM-4-MoE-Lite, A.X-K1: rope_interleave (true: interleaved pairs, false: half).
MLA_NEEDS = tuple((k, "which multi-head latent attention needs") for k in (
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "num_attention_heads"))
MLA_KEYS = frozenset({"kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                      "attention_bias", "rms_norm_eps", "head_dim", "num_key_value_heads"})
MLA_ROW: dict[str, Any] = dict(layout="mla", qk_norm=None, keys=MLA_KEYS, requires=MLA_NEEDS,
                               rotary_key="qk_rope_head_dim", scale="mscale")
declare("deepseek_v2", rope="interleaved", rope_rounding="once-float32", **MLA_ROW)  # view_as_complex(q.float()) ·
# freqs_cis (float32), type_as(q)
declare("minicpm3", rope="half", **MLA_ROW)
declare("deepseek_v3", "youtu", "glm4_moe_lite", "axk1", rope="interleaved", rope_switch="rope_interleave", **MLA_ROW)


def family(model_type: str) -> Family | None:
    return FAMILIES.get(model_type)


def unsupported_key(fam: Family, cfg: dict[str, Any]) -> str | None:
    """The first attention key of config.json that ``fam`` does not read and that is not neutral."""
    reads = fam.reads()
    for key, (neutral, what) in ATTENTION_KEYS.items():
        if key in cfg and key not in reads and not neutral(cfg[key]):
            return f"{key} ({what})"
    return None


def attention_keys(fam: Family | None, cfg: dict[str, Any]) -> dict[str, str]:
    """Every attention key present in config.json -> 'used', 'neutral' or 'not supported' (for inspect)."""
    reads = (fam.reads() | SHAPE_KEYS) if fam is not None else frozenset()
    out: dict[str, str] = {}
    for key in cfg:
        if key in reads:
            out[key] = "used"
        elif key in ATTENTION_KEYS:
            out[key] = "neutral (ignored)" if ATTENTION_KEYS[key][0](cfg[key]) else "not supported"
    return out
