"""Real checkpoints, read layer by layer, against the models that wrote them.

Each case builds a tiny transformers model from a random config (no downloads), randomises
every parameter, saves it with ``save_pretrained`` and runs it once (eager attention) with
hooks on the attention module's input and its output projection, and ``output_attentions``.
Then :func:`attncli.io.layouts.load_layer` reads one layer back, and the attention is recomputed
here in plain numpy float64 from the loaded arrays, following each model's own modeling file
(projections, per-head QK-norm, RoPE, scale, soft-cap, biases, masks, sinks, the output
projection). Per-head weights and the output must match the module within 1e-5 (float32).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attncli.errors import InputError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attncli.io.layouts import (  # noqa: E402
    AttentionFacts,
    LayerAttention,
    inspect_checkpoint,
    load_layer,
)

T = 9  # tokens: longer than the sliding windows below, so windows matter
TOL = 1e-5
MAX_ERR: dict[str, float] = {}  # the largest error measured per case (printed with -s by the last test)


# ---- the reference, written from the modeling files ----------------------------------------

def rms(x: np.ndarray, w: np.ndarray, eps: float, plus_one: bool) -> np.ndarray:
    """LlamaRMSNorm: w · x / sqrt(mean(x²) + eps); Gemma's: (1 + w) · ..."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * ((1.0 + w) if plus_one else w)


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rope(x: np.ndarray, pos: np.ndarray, inv: np.ndarray, factor: float, kind: str) -> np.ndarray:
    """HF apply_rotary_pos_emb (half: rotate_half over cat(freqs, freqs)) or GPT-J's rotate_every_two,
    on the first rd = 2·len(inv) features; cos and sin multiplied by the scaling's attention factor. (T, d) -> (T, d)"""
    rd = 2 * len(inv)
    ang = pos[:, None] * inv[None, :]  # (T, rd/2)
    r, rest = x[:, :rd], x[:, rd:]
    if kind == "half":
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        rot = np.concatenate([-r[:, rd // 2:], r[:, :rd // 2]], -1)
    else:
        cos, sin = np.repeat(np.cos(ang), 2, -1), np.repeat(np.sin(ang), 2, -1)
        rot = np.stack([-r[:, 1::2], r[:, ::2]], -1).reshape(r.shape)
    return np.concatenate([(r * cos + rot * sin) * factor, rest], -1)


def alibi_slopes(H: int) -> np.ndarray:
    """Press et al. / build_alibi_tensor (H a power of two here): start 2^(-8/H), slope_i = start^(i+1)."""
    start = 2.0 ** (-8.0 / H)
    return start ** np.arange(1, H + 1)


def reference(la: LayerAttention, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The layer's attention on x (T, E) in float64, one head at a time: weights (H, T, T), output (T, E)."""
    a = {k: np.asarray(v, dtype=np.float64) for k, v in la.arrays.items()}
    f = la.facts
    H, G, d = f.heads, f.kv_heads, f.head_dim
    assert H and G and d
    n = x.shape[0]
    pos = np.arange(n, dtype=np.float64)
    q = x @ a["W_q"] + a.get("b_q", 0.0)  # (T, E) x (E, H·d) -> (T, H·d)
    k = x @ a["W_k"] + a.get("b_k", 0.0)  # (T, E) x (E, G·d) -> (T, G·d)
    v = x @ a["W_v"] + a.get("b_v", 0.0)
    scale = f.scale if f.scale is not None else d ** -0.5
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    weights = np.zeros((H, n, n))
    out = np.zeros((n, H * d))
    bias = None
    if f.relative_bias == "t5":
        bias = hf_t5_bias(a["rel_bias"], n, n, f.rel_bidirectional, f.rel_buckets, f.rel_max_distance)
    for h in range(H):
        g = h // (H // G)  # query head h reads K/V head h // (H / G), as repeat_kv
        qh, kh, vh = q[:, h * d:(h + 1) * d], k[:, g * d:(g + 1) * d], v[:, g * d:(g + 1) * d]
        if f.qk_norm:
            qh = rms(qh, a["q_norm"], f.norm_eps, f.qk_norm == "rms1p")
            kh = rms(kh, a["k_norm"], f.norm_eps, f.qk_norm == "rms1p")
        if f.rope:
            inv, factor = rope_frequencies(f)  # checked against transformers' ROPE_INIT_FUNCTIONS below
            qh = rope(qh, pos, inv, factor, f.rope)
            kh = rope(kh, pos, inv, factor, f.rope)
        s = (qh @ kh.T) * scale  # (T, d) x (d, T) -> (T, T)
        if f.softcap:
            s = np.tanh(s / f.softcap) * f.softcap
        if bias is not None:
            s = s + bias[h]
        if f.alibi:
            s = s + alibi_slopes(H)[h] * j  # slope · key position (a per-row constant away from slope · (j - i))
        keep = np.ones((n, n), bool)
        if f.causal:
            keep &= j <= i
        if f.window:
            keep &= j > i - f.window  # sliding_window_overlay: W keys including the query itself
        s = np.where(keep, s, -np.inf)
        if f.sinks:
            s = np.concatenate([s, np.full((n, 1), a["sinks"][h])], 1)  # one extra logit per row
        p = np.exp(s - s.max(1, keepdims=True))
        p = p / p.sum(1, keepdims=True)
        p = p[:, :n]  # the sink column is dropped after the softmax
        weights[h] = p
        out[:, h * d:(h + 1) * d] = p @ vh  # (T, T) x (T, d) -> (T, d)
    y = out @ a["W_o"] + a.get("b_o", 0.0)  # (T, H·d) x (H·d, E) -> (T, E)
    return weights, y


def rope_frequencies(facts: AttentionFacts) -> tuple[np.ndarray, float]:
    """RoPE's inverse frequencies (rotary_dim / 2,) and the factor that multiplies cos and sin, for the
    rope_scaling of config.json: none, linear, llama3 or yarn, as transformers' ``modeling_rope_utils``
    computes them (``ROPE_INIT_FUNCTIONS``). inv_freq_i = 1 / base^(2i / rotary_dim) before scaling.
    The test's reference (checked against ROPE_INIT_FUNCTIONS below); the package computes these in
    attncli.core.ops."""
    base, dim = facts.rope_base or 10000.0, facts.rotary_dim or facts.head_dim
    if not dim:
        raise InputError("RoPE needs the rotary dimension (head_dim); give --heads or config.json")
    inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)  # (dim/2,)
    rs = facts.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(rs["factor"]), 1.0
    if kind == "llama3":  # wavelengths beyond the old context are divided by factor, short ones kept, a ramp between
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled), 1.0
    if kind == "yarn":
        old = float(rs["original_max_position_embeddings"])
        factor = rs.get("factor") or float(rs["max_position_embeddings"]) / old

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = rs.get("attention_factor")
        if attention is None:
            m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
            attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
        fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def correction_dim(rotations: float) -> float:
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(fast), correction_dim(slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        ramp = np.clip((np.arange(dim // 2) - low) / ((high - low) or 0.001), 0, 1)
        extrapolate = 1 - ramp  # high frequencies keep their value, low ones are interpolated (divided by factor)
        return inv / factor * (1 - extrapolate) + inv * extrapolate, float(attention)
    raise InputError(f"RoPE scaling {kind!r} is not supported (default, linear, llama3 and yarn are)", "config.json")


def pre_norm(la: LayerAttention, h: np.ndarray) -> np.ndarray:
    """The layer's pre-attention norm applied to the residual stream hidden_states[N]."""
    a = {k: np.asarray(v, dtype=np.float64) for k, v in la.arrays.items()}
    f = la.facts
    if f.pre_norm == "layernorm":
        return layernorm(h, a["norm_w"], a.get("norm_b", 0.0), f.pre_norm_eps)
    if f.pre_norm in ("rms", "rms1p"):
        return rms(h, a["norm_w"], f.pre_norm_eps, f.pre_norm == "rms1p")
    return h


# ---- the models ------------------------------------------------------------------------------

SMALL = dict(vocab_size=50)
LLAMA = dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, **SMALL)

# name: (config class, config kwargs, layer, attention module path, output projection, stack prefix)
CASES: dict[str, tuple[str, dict[str, Any], int, str, str]] = {
    "llama": ("LlamaConfig", dict(LLAMA, attention_bias=True, rope_theta=500.0), 1, "model.layers.{n}.self_attn", "o_proj"),
    "mistral": ("MistralConfig", dict(LLAMA, sliding_window=4, head_dim=8), 1, "model.layers.{n}.self_attn", "o_proj"),
    "qwen2": ("Qwen2Config", dict(LLAMA, use_sliding_window=True, sliding_window=3, max_window_layers=1), 1,
              "model.layers.{n}.self_attn", "o_proj"),
    "qwen3": ("Qwen3Config", dict(LLAMA, head_dim=16), 0, "model.layers.{n}.self_attn", "o_proj"),
    "gemma": ("GemmaConfig", dict(LLAMA, head_dim=8), 1, "model.layers.{n}.self_attn", "o_proj"),
    "gemma2": ("Gemma2Config", dict(LLAMA, head_dim=8, sliding_window=4, query_pre_attn_scalar=12,
                                    attn_logit_softcapping=0.7), 0, "model.layers.{n}.self_attn", "o_proj"),
    "gemma3": ("Gemma3TextConfig", dict(LLAMA, head_dim=8, sliding_window=4, query_pre_attn_scalar=12,
                                        layer_types=["sliding_attention", "full_attention"]), 0,
               "model.layers.{n}.self_attn", "o_proj"),
    # gpt-oss keeps its own YaRN scaling (factor 32, truncate False), with a short original context so it matters
    "gpt_oss": ("GptOssConfig", dict(LLAMA, head_dim=16, sliding_window=4, num_local_experts=2, num_experts_per_tok=1,
                                     rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                      "original_max_position_embeddings": 16}), 0,
                "model.layers.{n}.self_attn", "o_proj"),
    "llama3": ("LlamaConfig", dict(LLAMA, rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 16}), 0,
               "model.layers.{n}.self_attn", "o_proj"),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, scale_attn_by_inverse_layer_idx=True,
                                **SMALL), 1, "transformer.h.{n}.attn", "c_proj"),
    "gptj": ("GPTJConfig", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4, **SMALL), 1,
             "transformer.h.{n}.attn", "out_proj"),
    "neox": ("GPTNeoXConfig", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                                   rotary_pct=0.5, max_position_embeddings=64, **SMALL), 1,
             "gpt_neox.layers.{n}.attention", "dense"),
    "bloom": ("BloomConfig", dict(hidden_size=32, n_layer=2, n_head=4, **SMALL), 1,
              "transformer.h.{n}.self_attention", "dense"),
    "bert": ("BertConfig", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                                max_position_embeddings=64, **SMALL), 1, "encoder.layer.{n}.attention.self",
             "../output.dense"),
}
CLASSES = {"bert": "BertModel"}


def _randomise(model: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.35)


def _module(model: Any, path: str) -> Any:
    m = model
    for part in path.split("."):
        m = getattr(m, part)
    return m


def hooks(attn: Any, out_mod: Any, got: dict[str, Any]) -> tuple[Any, Any]:
    """Capture the attention module's input and its output projection's output (first call only)."""

    def pre(m: Any, args: Any, kw: Any) -> None:
        got.setdefault("x", (args[0] if args else kw["hidden_states"]).detach())

    def post(m: Any, args: Any, out: Any) -> None:
        got.setdefault("y", out.detach())

    return attn.register_forward_pre_hook(pre, with_kwargs=True), out_mod.register_forward_hook(post)


def build(name: str, folder: Path, layer: int | None = None, **save: Any) -> tuple[Any, dict[str, Any]]:
    """Make, randomise, save and run one tiny model; the captured input, output, weights, hidden states."""
    cls_name, kwargs, default, attn_path, out_name = CASES[name]
    layer = default if layer is None else layer
    config = getattr(transformers, cls_name)(**kwargs)
    config._attn_implementation = "eager"
    model_cls = getattr(transformers, CLASSES.get(name, "AutoModelForCausalLM"))
    model = (model_cls(config) if model_cls is not transformers.AutoModelForCausalLM
             else transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    model.eval()
    _randomise(model, seed=len(name))
    model.save_pretrained(folder, **save)
    attn = _module(model, attn_path.format(n=layer))
    out_mod = (_module(model, attn_path.format(n=layer).rsplit(".", 1)[0] + "." + out_name[3:])
               if out_name.startswith("../") else getattr(attn, out_name))
    got: dict[str, Any] = {}
    h1, h2 = hooks(attn, out_mod, got)
    ids = torch.arange(T).remainder(50)[None] * 7 % 50
    with torch.no_grad():
        res = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    h1.remove()
    h2.remove()
    got["weights"] = res.attentions[layer][0].double().numpy()  # (H, T, T)
    got["hidden"] = res.hidden_states[layer][0].double().numpy()  # (T, E): the residual entering the layer
    got["x"] = got["x"][0].double().numpy()
    got["y"] = got["y"][0].double().numpy()
    got["layer"] = layer
    got["model"] = model
    return model, got


def _check(name: str, la: LayerAttention, got: dict[str, Any], tol: float = TOL) -> None:
    w, y = reference(la, got["x"])
    err_w = float(np.abs(w - got["weights"]).max())
    err_y = float(np.abs(y - got["y"]).max())
    err_x = 0.0
    if la.facts.pre_norm is not None or la.layout == "bert":
        err_x = float(np.abs(pre_norm(la, got["hidden"]) - got["x"]).max())  # --from-residual
    MAX_ERR[name] = max(err_w, err_y, err_x, MAX_ERR.get(name, 0.0))
    assert err_w < tol, f"{name}: weights differ by {err_w}"
    assert err_y < tol, f"{name}: output differs by {err_y}"
    assert err_x < tol, f"{name}: pre-attention norm differs by {err_x}"


@pytest.mark.parametrize("name", list(CASES))
def test_layer_matches_the_model(name: str, tmp_path: Path) -> None:
    _, got = build(name, tmp_path)
    la = load_layer(tmp_path, got["layer"])
    assert la.layer == got["layer"] and la.layers == 2
    _check(name, la, got)


def test_llama_arrays_are_the_modules_parameters(tmp_path: Path) -> None:
    model, got = build("llama", tmp_path)
    la = load_layer(tmp_path, 1)
    attn = model.model.layers[1].self_attn
    assert la.layout == "llama"
    np.testing.assert_array_equal(la.arrays["W_q"], attn.q_proj.weight.detach().numpy().T)
    np.testing.assert_array_equal(la.arrays["W_k"], attn.k_proj.weight.detach().numpy().T)
    np.testing.assert_array_equal(la.arrays["b_v"], attn.v_proj.bias.detach().numpy())
    np.testing.assert_array_equal(la.arrays["W_o"], attn.o_proj.weight.detach().numpy().T)
    assert la.arrays["W_k"].shape == (32, 16)  # GQA: 2 K/V heads of 8
    assert la.origin["W_q"] == "model.layers.1.self_attn.q_proj.weightᵀ"
    f = la.facts
    assert (f.heads, f.kv_heads, f.head_dim, f.rope, f.rope_base, f.causal) == (4, 2, 8, "half", 500.0, True)
    assert {"heads", "kv_heads", "rope_base"} <= set(f.from_config)


def test_gpt2_conv1d_columns_and_inverse_layer_scale(tmp_path: Path) -> None:
    model, got = build("gpt2", tmp_path)
    la = load_layer(tmp_path, 1)
    c = model.transformer.h[1].attn.c_attn.weight.detach().numpy()  # Conv1D (E, 3E)
    np.testing.assert_array_equal(la.arrays["W_k"], c[:, 32:64])
    assert la.origin["W_k"] == "transformer.h.1.attn.c_attn.weight[:, 32:64]"
    assert la.facts.scale == pytest.approx(8 ** -0.5 / 2)  # 1/sqrt(d) / (layer + 1)


def test_sharded_bfloat16_and_pytorch_bin(tmp_path: Path) -> None:
    """One checkpoint sharded (max_shard_size), one saved in bfloat16, one as pytorch_model.bin."""
    model, got = build("qwen3", tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    _check("qwen3 sharded", load_layer(tmp_path / "sharded", 0), got)
    # transformers 5 always writes safetensors; pytorch_model.bin is what 4.x wrote with safe_serialization=False:
    # torch.save of the state dict, beside config.json
    (tmp_path / "bin").mkdir()
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "sharded" / "config.json").read_text())
    _check("qwen3 .bin", load_layer(tmp_path / "bin", 0), got)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    torch.save(model.state_dict(), tmp_path / "bf16.pt")  # bfloat16 through torch.load(mmap=True) too
    np.testing.assert_array_equal(load_layer(tmp_path / "bf16.pt", 0, heads=4, layout="qwen3").arrays["W_o"].astype(np.float32),
                                  model.model.layers[0].self_attn.o_proj.weight.detach().float().numpy().T)
    la = load_layer(tmp_path / "bf16", 0)
    assert la.arrays["W_q"].dtype.name == "bfloat16"
    # the bf16 weights are the float32 ones rounded: compare with those exactly
    ref = model.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T
    np.testing.assert_array_equal(la.arrays["W_q"].astype(np.float32), ref)


def tiny_t5(folder: Path) -> Any:
    """A tiny T5 (encoder and decoder, 8 relative-position buckets), randomised and saved to ``folder``."""
    config = transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=24, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=8, relative_attention_max_distance=12,
                                   attn_implementation="eager")
    model = transformers.T5Model(config)
    model.eval()
    _randomise(model, 5)
    model.save_pretrained(folder)
    return model


def test_t5_encoder_and_decoder_use_layer_0s_bias(tmp_path: Path) -> None:
    model = tiny_t5(tmp_path)
    with pytest.raises(InputError, match="--prefix"):
        load_layer(tmp_path, 1)
    for stack in ("encoder", "decoder"):
        attn = getattr(model, stack).block[1].layer[0].SelfAttention
        got: dict[str, Any] = {}
        h1, h2 = hooks(attn, attn.o, got)
        ids = (torch.arange(T)[None] * 7) % 50
        with torch.no_grad():
            res = model(input_ids=ids, decoder_input_ids=ids, output_attentions=True, output_hidden_states=True)
        h1.remove()
        h2.remove()
        att = res.encoder_attentions if stack == "encoder" else res.decoder_attentions
        hid = res.encoder_hidden_states if stack == "encoder" else res.decoder_hidden_states
        got.update(weights=att[1][0].double().numpy(), hidden=hid[1][0].double().numpy(),
                   x=got["x"][0].double().numpy(), y=got["y"][0].double().numpy())
        la = load_layer(tmp_path, 1, prefix=stack)
        assert la.origin["rel_bias"] == f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        assert la.facts.causal == (stack == "decoder") and la.facts.scale == 1.0
        _check(f"t5 {stack}", la, got)


ROPE_CONFIGS = {
    "linear": ("LlamaConfig", {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}),
    "llama3": ("LlamaConfig", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64, "rope_theta": 500000.0}),
    "yarn": ("GptOssConfig", None),  # gpt-oss's own: factor 32, beta 32/1, truncate False, theta 150000
    "yarn-truncate": ("Qwen2Config", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                      "rope_theta": 10000.0}),
    "yarn-mscale": ("LlamaConfig", {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                                    "original_max_position_embeddings": 128, "rope_theta": 10000.0}),
}


@pytest.mark.parametrize("kind", list(ROPE_CONFIGS))
def test_rope_frequencies_are_transformers(kind: str, tmp_path: Path) -> None:
    """rope_frequencies from the facts load_layer reads, against ROPE_INIT_FUNCTIONS on the same config."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cls, params = ROPE_CONFIGS[kind]
    kw = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_hidden_layers=1,
              vocab_size=20, intermediate_size=8, max_position_embeddings=512)
    if params is not None:
        kw["rope_parameters"] = params
    config = getattr(transformers, cls)(**kw)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    la = load_layer(tmp_path, 0)
    inv, factor = rope_frequencies(la.facts)
    rp = config.rope_parameters
    ref_inv, ref_factor = ROPE_INIT_FUNCTIONS[rp["rope_type"]](config, "cpu")
    np.testing.assert_allclose(inv, ref_inv.double().numpy(), rtol=1e-6)  # HF computes in float32
    assert factor == pytest.approx(ref_factor, rel=1e-12)


def hf_t5_bias(table: np.ndarray, m: int, n: int, bidirectional: bool, num_buckets: int,
               max_distance: int) -> np.ndarray:
    """T5's bias table[bucket(j - i), h] with transformers' own bucket (T5Attention._relative_position_bucket). (H, m, n)"""
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(n)[None, :] - torch.arange(m)[:, None]  # (m, n): key j - query i
    b = T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                              max_distance=max_distance).numpy()
    return np.moveaxis(np.asarray(table)[b], -1, 0)  # (m, n, H) -> (H, m, n)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_rows_are_compute_bias(bidirectional: bool) -> None:
    """The runtime's T5 bias (attncli.core.chain.relative_rows: the bias stage's rows) against HF
    T5Attention.compute_bias, across the exact and the log buckets (replaces the test of heads.t5_position_bias,
    removed: the runtime never called it)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from attncli.core.chain import relative_rows
    from attncli.core.problem import Problem
    from attncli.core.projections import RelativeBias

    config = transformers.T5Config(num_heads=3, d_model=12, d_kv=4, relative_attention_num_buckets=16,
                                   relative_attention_max_distance=40, is_decoder=not bidirectional)
    attn = T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(attn.relative_attention_bias.weight)
    m, n = 7, 90  # distances beyond max_distance land in the last bucket
    ref = attn.compute_bias(m, n)[0].detach().numpy()  # (1, H, m, n) -> (H, m, n)
    table = attn.relative_attention_bias.weight.detach().numpy().astype(np.float64)
    rng = np.random.default_rng(0)
    p = Problem.build(rng.normal(size=(1, 3, m, 4)), rng.normal(size=(1, 3, n, 4)),  # (B, H, T, d): a head axis
                      relative_bias=RelativeBias(table, bidirectional, 16, 40))
    got = relative_rows(p, np.arange(m))
    np.testing.assert_array_equal(got, ref.astype(np.float64))


def test_inspect_reads_headers_and_facts(tmp_path: Path) -> None:
    build("gemma2", tmp_path)
    info = inspect_checkpoint(tmp_path)
    (stack,) = info["stacks"]
    assert stack["layout"] == "llama" and stack["layers"] == 2 and stack["prefix"] == "model.layers"
    names = {t["name"] for t in stack["layer_tensors"]}
    assert "model.layers.0.self_attn.q_proj.weight" in names
    facts = stack["facts"]
    assert facts["softcap"] == 0.7 and facts["scale"] == pytest.approx(12 ** -0.5) and facts["window"] == 4
    assert facts["qk_norm"] is None and facts["pre_norm"] == "rms1p"


def test_gemma3_layer_types_choose_window_and_rope_base(tmp_path: Path) -> None:
    """Gemma 3: sliding layers use the local rope theta (10000), full ones the global one (1e6), no window."""
    _, got = build("gemma3", tmp_path, layer=1)
    la = load_layer(tmp_path, 1)
    assert (la.facts.window, la.facts.rope_base, la.facts.qk_norm) == (None, 1e6, "rms1p")
    _check("gemma3 full layer", la, got)
    assert (load_layer(tmp_path, 0).facts.window, load_layer(tmp_path, 0).facts.rope_base) == (4, 10000.0)


@pytest.mark.parametrize("layer, message", [(None, "holds 2 attention layers (0..1); choose one with --layer"),
                                            (2, "has no layer 2: its llama layers are 0..1")])
def test_layer_errors(tmp_path: Path, layer: int | None, message: str) -> None:
    build("llama", tmp_path)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_layer(tmp_path, layer)


def test_shape_disagreeing_with_config(tmp_path: Path) -> None:
    import json

    build("llama", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"k_proj.weightᵀ gives 16 features but config.json says 4 heads"):
        load_layer(tmp_path, 0)


@pytest.fixture(scope="module", autouse=True)
def _report_errors() -> Any:
    """After this file's tests, the largest error measured per layout (shown with pytest -s); not a test."""
    yield
    for k, v in sorted(MAX_ERR.items()):
        print(f"max error {k:16s} {v:.2e}")
