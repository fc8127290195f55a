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
    helium, ernie4_5   llama   interleaved             RMS
    glm, glm4          llama   partial interleaved     RMS
    smollm3            llama   half, NoPE layers       RMS                           no_rope_layers
    exaone4            llama   half; full layers NoPE  none (post-norm)              when the model slides
    cohere2            llama   interleaved; full NoPE  LayerNorm without bias
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
    llama4_text        llama   interleaved; NoPE layers RMS                          chunked RoPE layers, q tuning
    bert & co          bert    none                    post-norm (none before)       bidirectional
    roberta-prelayernorm, xlm-roberta-xl, megatron-bert: bert, a LayerNorm inside the attention module
    opt, biogpt, xglm  bart    none                    LayerNorm self_attn_layer_norm (OPT: do_layer_norm_before)
    bart, marian, ...  bart    none                    post-norm (pegasus, mbart, whisper, ...: pre-norm)
    distilbert         distilbert none                 post-norm (none before)       bidirectional
    albert             albert  none                    post-norm (none before)       layers share groups
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Rule = Callable[[int, dict[str, Any], "str | None"], bool]  # (layer, config, layer type) -> yes/no


@dataclass(frozen=True)
class Family:
    """One family's attention, as its HF modeling file computes it."""
    model_type: str
    layout: str  # the reader (attncli.io.layouts.LAYOUTS)
    rope: str | None = "half"  # "half" | "interleaved" | None (learned or no positions)
    nope: Rule | None = None  # the layers without rotary (NoPE)
    pre_norm: str | None = "rms"  # rms | rms1p | layernorm | layernorm1p | layernorm-weightless | None (nothing)
    norm_name: str = "input_layernorm"  # the pre-norm's tensor after the layer's prefix (llama layout)
    norm_inside: bool = False  # the norm is inside the attention module (pre-LN BERTs): applied in plain runs too
    qk_norm: str | None = "rms"  # the kind of q_norm/k_norm when the tensors are there
    scale: str | None = None  # attention_multiplier | query_pre_attn_scalar: the config key setting the scale
    causal: bool = True
    chunked: Rule | None = None  # the layers with chunked attention (Llama 4: attention_chunk_size)
    sub_norm: str | None = None  # an RMSNorm of the concatenated heads before o_proj: its tensor after self_attn.
    keys: frozenset[str] = frozenset()  # further config keys this declaration reads
    notes: str = ""

    def reads(self) -> frozenset[str]:
        """Every attention key of config.json this declaration reads (the rest must be neutral)."""
        keys = set(self.keys) | set(LAYOUT_KEYS.get(self.layout, ()))
        if self.rope:
            keys |= ROPE_KEYS
        if self.scale:
            keys.add(self.scale)
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
    "use_prompt": (_off, "prompt keys and values prepended to the attention (MVP)"),
}


def _sliding(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    return lt == "sliding_attention"


def _full_nope(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Cohere2 / EXAONE 4: the full-attention layers of a sliding model have no rotary."""
    return cfg.get("sliding_window") is not None and lt == "full_attention"


def _no_rope_layers(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    nope = cfg.get("no_rope_layers")
    return isinstance(nope, list) and i < len(nope) and not nope[i]


def _llama4_chunked(i: int, cfg: dict[str, Any], lt: str | None) -> bool:
    """Llama 4: layer_types says; without it (as Llama4TextConfig derives it) the layers with rotary are chunked."""
    if lt is not None:
        return lt == "chunked_attention"
    nope = cfg.get("no_rope_layers")
    return isinstance(nope, list) and i < len(nope) and bool(nope[i])


FAMILIES: dict[str, Family] = {}


def declare(*model_types: str, **kw: Any) -> None:
    for mt in model_types:
        FAMILIES[mt] = Family(mt, **kw)


W = WINDOW_KEYS
# Llama-style self_attn.{q,k,v,o}_proj; read from each modeling_*.py's Attention.forward (transformers 5.23)
declare("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "ministral", "arcee", "aria_text",
        "cwm", "dots1", "glm4_moe", "hy_v3", "internlm3", "iquestcoder", "kolibri1", "mellum",
        "seed_oss", "solar_open", "phi3", "minimax", "falcon_h1",
        layout="llama", keys=W)
for mt in ("phimoe", "starcoder2", "jais2"):  # nn.LayerNorm with bias before attention
    declare(mt, layout="llama", pre_norm="layernorm", keys=W | {"norm_epsilon", "layer_norm_eps", "use_bias"})
declare("gemma", layout="llama", pre_norm="rms1p", qk_norm="rms1p")
declare("gemma2", "gemma3_text", "vaultgemma", layout="llama", pre_norm="rms1p", qk_norm="rms1p",
        scale="query_pre_attn_scalar", keys=W | {"attn_logit_softcapping"})
declare("gpt_oss", layout="llama", keys=W, notes="sinks: one logit per head in the softmax denominator")
declare("granite", "granitemoe", "granitemoeshared", layout="llama", scale="attention_multiplier")
declare("hyperclovax", layout="llama", scale="attention_multiplier",
        keys=frozenset({"use_post_norm"}))  # post_norm1/2: after the attention output, outside the module
declare("helium", "ernie4_5", "ernie4_5_moe", layout="llama", rope="interleaved", keys=frozenset({"use_bias"}))
declare("glm", "glm4", layout="llama", rope="interleaved")
declare("smollm3", layout="llama", nope=_no_rope_layers, keys=W | {"no_rope_layers", "no_rope_layer_interval"})
declare("exaone4", layout="llama", nope=_full_nope, pre_norm=None, keys=W)  # post-norm only
declare("exaone_moe", layout="llama", nope=_full_nope, keys=W)  # unlike exaone4, an input_layernorm
declare("cohere2", "cohere2_moe", layout="llama", rope="interleaved", nope=_full_nope, pre_norm="layernorm",
        keys=W | {"layer_norm_eps", "logit_scale"})
declare("nemotron", layout="llama", pre_norm="layernorm1p", keys=frozenset({"norm_eps"}))
declare("stablelm", layout="llama", pre_norm="layernorm", keys=frozenset({"layer_norm_eps", "use_qkv_bias",
                                                                        "use_parallel_residual"}),
        notes="qk_layernorm (a LayerNorm per head) is refused: core has no such QK-norm kind")
declare("olmo", layout="llama", pre_norm="layernorm-weightless", keys=frozenset({"clip_qkv"}),
        notes="clip_qkv: q, k, v clamped right after the projections (the steps q_clip, k_clip, v_clip)")
declare("bitnet", layout="llama", sub_norm="attn_sub_norm",
        notes="attn_sub_norm: an RMSNorm of the concatenated heads before o_proj (the step sub_norm); nn.Linear "
              "projections (BitLinear only under a quantization config)")
# Llama 4 text: interleaved rotary (complex pairs) on its RoPE layers, which are chunked; NoPE layers are full,
# with the temperature tuning of q. use_qk_norm (an L2 norm of q and k after RoPE) is not read: refused by key.
declare("llama4_text", layout="llama", rope="interleaved", nope=_no_rope_layers, chunked=_llama4_chunked,
        keys=frozenset({"layer_types", "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size",
                        "attn_temperature_tuning", "floor_scale", "attn_scale"}))
declare("apertus", layout="llama", norm_name="attention_layernorm")
declare("eurobert", layout="llama", causal=False)
# BERT-style encoders: attention.self.{query,key,value}, attention.output.dense; post-norm
declare("bert", "bert-generation", "camembert", "data2vec-text", "electra", "ernie", "layoutlm", "luke", "rembert",
        "roberta", "roc_bert", "tapas", "xlm-roberta", layout="bert", rope=None, pre_norm=None, causal=False)
# BigBird: exact only with attention_type original_full (block_sparse: sparse from 704 tokens on, refused)
declare("big_bird", layout="bert", rope=None, pre_norm=None, causal=False)
declare("roberta-prelayernorm", layout="bert", rope=None, pre_norm="layernorm", norm_name="attention.LayerNorm",
        norm_inside=True, causal=False)
declare("xlm-roberta-xl", layout="bert", rope=None, pre_norm="layernorm", norm_name="attention.self_attn_layer_norm",
        norm_inside=True, causal=False)
declare("megatron-bert", layout="bert", rope=None, pre_norm="layernorm", norm_name="attention.ln", norm_inside=True,
        causal=False)
declare("gpt2", "gpt-sw3", layout="gpt2", rope=None, pre_norm="layernorm")
declare("gpt_bigcode", layout="gpt2", rope=None, pre_norm="layernorm", keys=frozenset({"multi_query"}),
        notes="c_attn nn.Linear: multi_query [Q; k; v] by rows, else (H, 3, d) per head")
declare("openai-gpt", layout="gpt2", rope=None, pre_norm=None, notes="post-LN: ln_1 after attention")
declare("gptj", layout="gptj", rope="interleaved", pre_norm="layernorm")
declare("gpt_neox", "gpt_neox_japanese", layout="neox", pre_norm="layernorm")
declare("bloom", layout="bloom", rope=None, pre_norm="layernorm", keys=frozenset({"alibi"}))
# Falcon: query_key_value rows (G, H/G + 2, d) (new_decoder_architecture: G = num_kv_heads; multi_query: G = 1;
# else G = H); rotary half, or ALiBi scaled with the scores; pre-norm ln_attn or input_layernorm (parallel block)
declare("falcon", layout="bloom", pre_norm="layernorm",
        keys=frozenset({"alibi", "multi_query", "new_decoder_architecture", "num_kv_heads", "num_ln_in_parallel_attn",
                        "parallel_attn", "bias"}),
        notes="alibi: (q·k + bf16(bf16(slope)·bf16(j)))/sqrt(d) (ALiBi form absolute-bf16, scaled); only `dense` after "
              "attention")
# Phi-1/1.5/2 and Persimmon: partial half rotary (partial_rotary_factor, default 0.5), LayerNorm with bias, parallel
# block; their qk_layernorm (a LayerNorm per head with bias) is not read, so qk_layernorm true is refused
declare("phi", layout="phi", pre_norm="layernorm", keys=frozenset({"layer_norm_eps"}))
declare("persimmon", layout="persimmon", pre_norm="layernorm", keys=frozenset({"layer_norm_eps"}))
# GPT-Neo: no score scaling, local layers (attention_layers / attention_types) with window_size
declare("gpt_neo", layout="gpt_neo", rope=None, pre_norm="layernorm",
        keys=frozenset({"attention_layers", "attention_types", "window_size", "layer_norm_epsilon"}))
declare("t5", "mt5", "umt5", "longt5", layout="t5", rope=None, causal=False)
# BART-style self_attn.{q,k,v,out}_proj (nn.Linear, biases; Whisper: k_proj without), q · head_dim^-0.5 before the
# product, no positions inside attention (learned / sinusoidal ones are added to the embeddings, in hidden_states[N]).
# Decoder stacks are causal, encoder stacks (encoder.layers) bidirectional. Pre-norm families apply
# self_attn_layer_norm before attention, post-norm ones after the residual (then nothing comes before attention).
# scale_embedding multiplies the embeddings only (outside attention).
declare("opt", layout="bart", rope=None, qk_norm=None, pre_norm="layernorm", norm_name="self_attn_layer_norm",
        keys=frozenset({"do_layer_norm_before", "enable_bias", "layer_norm_elementwise_affine"}),
        notes="do_layer_norm_before false (OPT-350m): post-norm, nothing before attention")
declare("biogpt", "xglm", layout="bart", rope=None, qk_norm=None, pre_norm="layernorm", norm_name="self_attn_layer_norm")
declare("mbart", "pegasus", "blenderbot", "whisper", layout="bart", rope=None, qk_norm=None, pre_norm="layernorm",
        norm_name="self_attn_layer_norm", notes="encoder (bidirectional) and decoder (causal) self-attention; "
        "cross-attention refused")
declare("bigbird_pegasus", layout="bart", rope=None, qk_norm=None, pre_norm="layernorm", norm_name="self_attn_layer_norm",
        keys=frozenset({"attention_type"}),
        notes="the decoder's self-attention (plain softmax); its block-sparse encoder is refused")
declare("bart", "marian", "blenderbot-small", "plbart", "mvp", "trocr", layout="bart", rope=None, qk_norm=None, pre_norm=None,
        norm_name="self_attn_layer_norm",
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

# Known, and refused: model_type -> what of its attention attncli does not compute (one line each)
REFUSED: dict[str, str] = {
    "afmoe": "its output gate (sigmoid(gate_proj(x)) before o_proj) is not supported",
    "laguna": "its output gate (softplus(g_proj(x)) before o_proj) is not supported",
    "diffllama": "differential attention (two softmaxes, lambda, group norm) is not supported",
    "doge": "its dynamic mask (A · softplus(dt_proj(v)) added to the scores) is not supported",
    "flint": "its per-layer rotary and QK-norm placement is not supported",
    "granite_swa": "its sink scaling of the output (sigmoid(logsumexp - sink)) is not supported",
    "granitemoe_swa": "its sink scaling of the output (sigmoid(logsumexp - sink)) is not supported",
    "hunyuan_v1_dense": "query_layernorm / key_layernorm (a QK-norm after RoPE) is not supported",
    "hunyuan_v1_moe": "query_layernorm / key_layernorm (a QK-norm after RoPE) is not supported",
    "llama4": "the multimodal Llama 4 checkpoint (text_config inside) is not supported; its text stack saved "
              "alone (llama4_text) is",
    "nanochat": "its weightless QK-norm and weightless pre-norm are not supported",
    "olmo2": "q_norm / k_norm over the full width (before the head split) is not supported",
    "olmo3": "q_norm / k_norm over the full width (before the head split) is not supported",
    "cohere": "its parallel block with a per-head LayerNorm QK-norm is not supported",
    "ultrabert": "bidirectional sliding-window attention is not supported",
    "esm": "its rotary BERT attention with a LayerNorm inside the module is not supported",
    "roformer": "its sinusoidal rotary BERT attention is not supported",
    "longformer": "local windowed + global attention (attention_window) is not supported",
    "nystromformer": "the Nystrom approximation of softmax attention is not supported",
    "yoso": "the YOSO (LSH) approximation of softmax attention is not supported",
    "mra": "the MRA approximation of softmax attention is not supported",
    "mpt": "its fused Wqkv with clip_qkv / qk_ln is not supported",
    "modernbert": "its fused Wqkv with local and global layers is not supported",
    "deberta": "disentangled attention (c2p, p2c) is not supported",
    "deberta-v2": "disentangled attention (c2p, p2c) is not supported",
}
MLA = "multi-head latent attention (kv_a_proj_with_mqa, kv_lora_rank) is not supported"
for mt in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "minicpm3", "glm4_moe_lite", "glm_moe_dsa", "youtu", "axk1",
           "axk2", "hy_v4", "kimi_k2"):
    REFUSED.setdefault(mt, MLA)


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


@dataclass
class Forced:
    """--layout NAME: a declaration applied to a checkpoint whose model_type is not declared."""
    name: str
    family: Family = field(repr=False)
