"""attncli.core.ops (the stages of today's models) against the implementations users compare with (shared/CONVENTIONS.md).

Every expected value here comes from the reference itself, run beside ours: transformers'
functions and tiny random modules (``attn_implementation="eager"``, ``output_attentions``),
torch SDPA and FlexAttention. Nothing is copied from attncli.

``compose_layer`` below is THE COMPOSITION THE PIPELINE MUST EQUAL: the stages of
attncli.core.ops put together in the order of DESIGN.md (project, split, normalise, rotate,
expand K/V, score, scale, cap, bias, mask, softmax with sinks, sum, merge). The whole-layer
cases (``LAYER_CASES``) give it the weights and inputs captured from each HF module; the
same cases can later be pointed at ``attncli self``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attncli.core import ops as M  # noqa: E402
from attncli.core.heads import alibi_slopes, check_kv_heads, check_positional, check_rope, check_sinks  # noqa: E402
from attncli.core.options import ROPE_MODES, check_q_offset, check_softcap, check_window  # noqa: E402
from attncli.errors import InputError  # noqa: E402

F = torch.nn.functional


def namespace(backend: str) -> Any:
    if backend == "numpy":
        return np
    import array_api_compat.torch as xt

    return xt


def on(backend: str, a: Any, dtype: str) -> Any:
    """A numpy array on the backend in the dtype."""
    a = np.asarray(a, dtype=dtype)
    return a if backend == "numpy" else torch.from_numpy(np.ascontiguousarray(a))


def host(a: Any) -> np.ndarray:
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def err(a: Any, b: Any) -> float:
    return float(np.max(np.abs(host(a).astype(np.float64) - host(b).astype(np.float64))))


BACKENDS = ["numpy", "torch"]
TOL = {"float32": 1e-5, "float64": 1e-12}


# ---- grouped-query heads -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 1), (4, 4), (8, 2)])
def test_expand_kv_equals_repeat_kv_and_sdpa_enable_gqa(backend: str, dtype: str, hq: int, hkv: int) -> None:
    from transformers.models.llama.modeling_llama import repeat_kv

    rng = np.random.default_rng(hq * 10 + hkv)
    q, k, v = rng.normal(size=(2, hq, 5, 4)), rng.normal(size=(2, hkv, 7, 4)), rng.normal(size=(2, hkv, 7, 3))
    xp = namespace(backend)
    ours = M.expand_kv(xp, on(backend, k, dtype), hq // hkv)
    ref = repeat_kv(torch.from_numpy(k.astype(dtype)), hq // hkv)
    assert err(ours, ref) == 0.0
    # SDPA with enable_gqa: the whole attention with our expanded heads
    kk, vv = M.expand_kv(xp, on(backend, k, dtype), hq // hkv), M.expand_kv(xp, on(backend, v, dtype), hq // hkv)
    s = on(backend, q, dtype) @ xp.matrix_transpose(kk) / math.sqrt(4)  # (2, Hq, 5, 4) x (2, Hq, 4, 7) -> (2, Hq, 5, 7)
    w = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    out = (w / xp.sum(w, axis=-1, keepdims=True)) @ vv  # (2, Hq, 5, 7) x (2, Hq, 7, 3) -> (2, Hq, 5, 3)
    t = {n: torch.from_numpy(a.astype(dtype)) for n, a in dict(q=q, k=k, v=v).items()}
    sdpa = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], enable_gqa=True)
    assert err(out, sdpa) < TOL[dtype]
    if hkv not in (1, hq):  # tiling maps head h to h % G: a different answer, so the check above can fail
        tiled = torch.from_numpy(k).repeat(1, hq // hkv, 1, 1).numpy()
        assert err(ours, tiled) > 0.1


# ---- RoPE tables: LlamaRotaryEmbedding for each rope_type ------------------------------------------

SCALINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.707,
                    "mscale_all_dim": 1.0, "beta_fast": 16},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


def llama_rope(head_dim: int, scaling: dict[str, Any] | None, base: float = 10000.0, max_pos: int = 256) -> Any:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rp = {"rope_type": "default", "rope_theta": base} if scaling is None else dict(scaling, rope_theta=base)
    cfg = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                      max_position_embeddings=max_pos, rope_parameters=rp)
    return LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rope_tables_equal_llama_rotary_embedding(name: str, head_dim: int) -> None:
    rope = llama_rope(head_dim, SCALINGS[name], base=500000.0 if head_dim == 128 else 10000.0)
    pos = np.arange(200)
    cos, sin = rope(torch.zeros(1), torch.from_numpy(pos)[None])
    inv, factor = M.rope_inv_freq(head_dim, 500000.0 if head_dim == 128 else 10000.0, SCALINGS[name], max_positions=256)
    assert np.array_equal(inv, rope.inv_freq.numpy())  # bit for bit: the same float32 operations
    assert factor == rope.attention_scaling
    c, s = M.rope_cos_sin(pos, inv, factor, "half")
    assert c.dtype == np.float32
    # torch's float32 cos/sin are within an ulp of the correctly rounded ones that rope_cos_sin gives
    assert err(c, cos[0]) <= 2.5e-7 * max(1.0, factor) and err(s, sin[0]) <= 2.5e-7 * max(1.0, factor)


def test_rope_dynamic_beyond_the_original_length_follows_hf_growth() -> None:
    rope = llama_rope(64, SCALINGS["dynamic"], max_pos=32)
    pos = np.arange(80)  # longer than max_position_embeddings: HF grows the base
    cos, _ = rope(torch.zeros(1), torch.from_numpy(pos)[None])
    inv, _ = M.rope_inv_freq(64, 10000.0, SCALINGS["dynamic"], max_positions=32, seq_len=80)
    assert np.allclose(inv, rope.inv_freq.numpy(), rtol=2.4e-7, atol=0)  # torch's float32 pow: within an ulp
    plain, _ = M.rope_inv_freq(64, 10000.0, None)
    assert not np.allclose(inv, plain)
    assert err(M.rope_cos_sin(pos, inv, 1.0, "half")[0], cos[0]) < 2e-5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["default", "llama3", "yarn"])
def test_rotate_half_equals_apply_rotary_pos_emb(backend: str, dtype: str, name: str) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rope = llama_rope(16, SCALINGS[name])
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 3, 9, 16)), rng.normal(size=(2, 1, 9, 16))
    pos = np.arange(5, 14)  # a query offset: positions past..past+8
    tq, tk = torch.from_numpy(q.astype(dtype)), torch.from_numpy(k.astype(dtype))
    cos, sin = rope(tq, torch.from_numpy(pos)[None])  # HF: float32 tables cast to the input's dtype
    rq, rk = apply_rotary_pos_emb(tq, tk, cos, sin)
    xp = namespace(backend)
    # the same tables: the rotation itself is exact
    oq = M.rotate(xp, on(backend, q, dtype), host(cos[0]), host(sin[0]), "half")
    assert err(oq, rq) < TOL[dtype]
    # our own tables: float32 as HF, within an ulp of torch's cos/sin
    c, s = M.rope_cos_sin(pos, *M.rope_inv_freq(16, 10000.0, SCALINGS[name], max_positions=256), "half")
    ok = M.rotate(xp, on(backend, k, dtype), c, s, "half")
    assert err(ok, rk) < 2e-6


def test_gptj_rotate_every_two_partial() -> None:
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 7, 3, 16))  # GPT-J rotates (B, T, H, d) before the transpose
    rot = 8
    sincos = create_sinusoidal_positions(32, rot)[torch.arange(7)][None]  # (1, T, rot)
    sin, cos = torch.split(sincos, rot // 2, dim=-1)
    t = torch.from_numpy(x)
    ref = torch.cat([apply_rotary_pos_emb(t[..., :rot], sin.double(), cos.double()), t[..., rot:]], dim=-1)
    c, s = M.rope_cos_sin(np.arange(7), *M.rope_inv_freq(rot, 10000.0, None), "interleaved")
    ours = M.rotate(np, np.swapaxes(x, 1, 2), c, s, "interleaved", rotary_dim=rot)  # (B, H, T, d)
    assert err(np.swapaxes(ours, 1, 2), ref) < 1e-6  # tables within an ulp of torch's float32 sin/cos
    assert err(ours[..., rot:], np.swapaxes(x, 1, 2)[..., rot:]) == 0.0


def meta_apply_rotary_emb(xq: Any, freqs_cis: Any) -> Any:
    """facebookresearch/llama model.py ``apply_rotary_emb`` (features as complex pairs), for (B, T, H, d),
    with ``precompute_freqs_cis``'s table given; the .float() casts dropped so it runs in float64."""
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    return torch.view_as_real(xq_ * freqs_cis.view(1, xq_.size(1), 1, xq_.size(-1))).flatten(3)


def hf_permute(w: Any, n_heads: int, dim1: int, dim2: int) -> Any:
    """transformers' convert_llama_weights_to_hf.py ``permute``: Meta's q/k rows to HF's rotate_half order."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def test_interleaved_equals_meta_complex_rope_and_hf_permuted_half() -> None:
    rng = np.random.default_rng(14)
    B, T, H, d, E = 1, 6, 2, 8, 16
    x, wq = rng.normal(size=(B, T, E)), rng.normal(size=(H * d, E))
    inv = M.rope_inv_freq(d, 10000.0, None)[0]
    theta = torch.outer(torch.arange(T, dtype=torch.float64), torch.from_numpy(inv).double())  # precompute_freqs_cis
    freqs_cis = torch.polar(torch.ones_like(theta), theta)
    q = (x @ wq.T).reshape(B, T, H, d)  # (B, T, E) x (E, H·d) -> (B, T, H, d)
    ref = meta_apply_rotary_emb(torch.from_numpy(q), freqs_cis).numpy()
    c, s = M.rope_cos_sin(np.arange(T), inv, 1.0, "interleaved", dtype="float64")
    ours = M.rotate(np, np.swapaxes(q, 1, 2), c, s, "interleaved")  # (B, H, T, d)
    assert err(np.swapaxes(ours, 1, 2), ref) < 1e-12
    # HF's converter permutes the rows of W_q so that rotate_half on its output gives Meta's scores
    wq_hf = hf_permute(torch.from_numpy(wq), H, H * d, E).numpy()
    ch, sh = M.rope_cos_sin(np.arange(T), inv, 1.0, "half", dtype="float64")
    q_hf = M.rotate(np, np.swapaxes((x @ wq_hf.T).reshape(B, T, H, d), 1, 2), ch, sh, "half")
    assert err(q_hf @ np.swapaxes(q_hf, -1, -2), ours @ np.swapaxes(ours, -1, -2)) < 1e-10
    assert err(q_hf, ours) > 1e-3  # the features differ in order; only the scores agree


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpt_neox_partial_rotary(backend: str) -> None:
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    cfg = GPTNeoXConfig(hidden_size=32, num_attention_heads=2, rotary_pct=0.25, max_position_embeddings=64)
    rope = GPTNeoXRotaryEmbedding(cfg)
    rng = np.random.default_rng(3)
    q = rng.normal(size=(1, 2, 6, 16)).astype(np.float32)
    tq = torch.from_numpy(q)
    cos, sin = rope(tq, torch.arange(6)[None])
    assert cos.shape[-1] == 4  # rotary_dim = 0.25 · 16
    rq, _ = apply_rotary_pos_emb(tq, tq, cos, sin)
    c, s = M.rope_cos_sin(np.arange(6), *M.rope_inv_freq(4, 10000.0, None), "half")
    ours = M.rotate(namespace(backend), on(backend, q, "float32"), c, s, "half", rotary_dim=4)
    assert err(ours, rq) < 1e-6


# ---- ALiBi: Bloom's build_alibi_tensor ----------------------------------------------------------


@pytest.mark.parametrize("heads", range(1, 13))
def test_alibi_slopes_equal_bloom(heads: int) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    n = 6
    alibi = build_alibi_tensor(torch.ones(1, n, dtype=torch.long), heads, torch.float32)  # (H, 1, n): slope·j
    ours = alibi_slopes(heads)
    assert ours.shape == (heads,)
    assert np.allclose(ours, alibi[:, 0, 1].numpy(), rtol=3e-7, atol=0)  # Bloom: float32 base and powers
    # Bloom's slope·j and our slope·(j - i) differ by a constant per row: the same softmax
    bias = M.alibi_bias(ours, np.arange(n), np.arange(n))
    s = np.random.default_rng(heads).normal(size=(heads, n, n))
    a = torch.softmax(torch.from_numpy(s) + alibi.double(), -1).numpy()
    assert err(np.exp(s + bias) / np.exp(s + bias).sum(-1, keepdims=True), a) < 1e-6


def test_alibi_slopes_paper_values() -> None:
    # Press et al. 2022, section 3: for 8 heads the slopes are 1/2^1 ... 1/2^8
    assert np.allclose(alibi_slopes(8), 0.5 ** np.arange(1, 9), rtol=1e-15)


# ---- windows: transformers.masking_utils -----------------------------------------------------


@pytest.mark.parametrize("window", [1, 2, 3, 5, 20])
@pytest.mark.parametrize("past", [0, 4])
def test_window_keep_equals_masking_utils(window: int, past: int) -> None:
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

    fn = and_masks(sliding_window_overlay(window), causal_mask_function)
    m, n = 6, 6 + past
    q_pos = past + np.arange(m)  # HF cache_position
    ref = np.array([[bool(fn(0, 0, torch.tensor(int(i)), torch.tensor(int(j)))) for j in range(n)] for i in q_pos])
    assert np.array_equal(M.window_keep(q_pos, np.arange(n), window), ref)
    refc = np.array([[bool(causal_mask_function(0, 0, int(i), int(j))) for j in range(n)] for i in q_pos])
    assert np.array_equal(M.causal_keep(q_pos, np.arange(n)), refc)
    assert M.window_keep(q_pos, np.arange(n), window).sum(-1).max() == min(window, n)  # W keys, itself included


# ---- soft-capping (Gemma 2) and sinks (gpt-oss): their eager_attention_forward ---------------------


@dataclass
class Stub:
    """What eager_attention_forward reads from its module."""

    num_key_value_groups: int
    head_dim: int
    training: bool = False
    sinks: Any = None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softcap_equals_gemma2_eager(backend: str, dtype: str) -> None:
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(1, 4, 5, 8)) * 4, rng.normal(size=(1, 2, 5, 8)) * 4, rng.normal(size=(1, 2, 5, 8))
    t = [torch.from_numpy(a.astype(dtype)) for a in (q, k, v)]
    out, w = eager_attention_forward(Stub(2, 8), *t, None, scaling=24 ** -0.5, softcap=3.0)
    xp = namespace(backend)
    kk = M.expand_kv(xp, on(backend, k, dtype), 2)
    s = M.softcap(xp, (on(backend, q, dtype) @ xp.matrix_transpose(kk)) * 24 ** -0.5, 3.0)  # (1,4,5,8)x(1,4,8,5)
    assert float(xp.max(xp.abs(s))) <= 3.0  # tanh reaches 1 in float32
    e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
    ours = e / xp.sum(e, axis=-1, keepdims=True)
    assert err(ours, w) < (1e-6 if dtype == "float32" else 1e-7)  # HF: softmax in float32 also for float64


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sinks_equal_gpt_oss_eager(backend: str, dtype: str) -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    rng = np.random.default_rng(5)
    h, m, n = 4, 5, 6
    q, k, v = rng.normal(size=(2, h, m, 8)), rng.normal(size=(2, 2, n, 8)), rng.normal(size=(2, 2, n, 3))
    sinks = np.array([0.5, -1.0, 2.0, 0.0])
    keep = M.window_keep(np.arange(1, m + 1), np.arange(n), 3)  # bottom-right, window 3
    keep_b = np.broadcast_to(keep, (2, h, m, n)).copy()
    keep_b[1, 2, 3, :] = False  # one fully masked row
    tdt = getattr(torch, dtype)
    add = torch.zeros(keep_b.shape, dtype=tdt).masked_fill(torch.from_numpy(~keep_b), torch.finfo(tdt).min)  # HF's
    stub = Stub(2, 8, sinks=torch.from_numpy(sinks.astype(dtype)))
    t = [torch.from_numpy(a.astype(dtype)) for a in (q, k, v)]
    out, w = eager_attention_forward(stub, *t, add, scaling=8 ** -0.5)
    xp = namespace(backend)
    kk, vv = (M.expand_kv(xp, on(backend, a, dtype), 2) for a in (k, v))
    s = (on(backend, q, dtype) @ xp.matrix_transpose(kk)) * 8 ** -0.5  # (2,4,5,8) x (2,4,8,6) -> (2,4,5,6)
    s = xp.where(on(backend, keep_b, "bool"), s, xp.asarray(-math.inf, dtype=s.dtype))
    ours = M.softmax_with_sinks(xp, s, on(backend, sinks, dtype))
    assert err(ours, w) < TOL[dtype] and err(ours @ vv, out.transpose(1, 2)) < TOL[dtype]
    assert err(ours[1, 2, 3], np.zeros(n)) == 0.0  # the fully masked row: the sink takes everything
    assert float(xp.max(xp.sum(ours, axis=-1))) < 1.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sink_scaled_weights_equal_granite_swa_eager(backend: str, dtype: str) -> None:
    # Granite SWA applies its sinks as sigmoid(logsumexp(s) - sink) times softmax(s) · V (sink_form scale): our
    # weights times V are its output, and they are the sink-logit weights of gpt-oss's form
    from transformers.models.granite_swa.modeling_granite_swa import eager_attention_forward

    rng = np.random.default_rng(7)
    h, m, n = 4, 5, 6
    q, k, v = rng.normal(size=(2, h, m, 8)) * 2, rng.normal(size=(2, 2, n, 8)), rng.normal(size=(2, 2, n, 3))
    sinks = np.array([0.5, -1.0, 2.0, 0.0])
    keep = np.broadcast_to(M.causal_keep(np.arange(1, m + 1), np.arange(n)), (2, h, m, n))
    tdt = getattr(torch, dtype)
    add = torch.zeros(keep.shape, dtype=tdt).masked_fill(torch.from_numpy(~keep), torch.finfo(tdt).min)
    stub = Stub(2, 8, sinks=torch.from_numpy(sinks.astype(dtype)))
    out, _ = eager_attention_forward(stub, *(torch.from_numpy(a.astype(dtype)) for a in (q, k, v)), add,
                                     scaling=8 ** -0.5)
    xp = namespace(backend)
    kk, vv = (M.expand_kv(xp, on(backend, a, dtype), 2) for a in (k, v))
    s = (on(backend, q, dtype) @ xp.matrix_transpose(kk)) * 8 ** -0.5  # (2,4,5,8) x (2,4,8,6) -> (2,4,5,6)
    s = xp.where(on(backend, keep, "bool"), s, xp.asarray(-math.inf, dtype=s.dtype))
    ours = M.softmax_sink_scaled(xp, s, on(backend, sinks, dtype))
    assert err(ours @ vv, out.transpose(1, 2)) < 1e-6  # HF computes softmax and scale in float32, for float64 too
    assert err(ours, M.softmax_with_sinks(xp, s, on(backend, sinks, dtype))) < TOL[dtype]
    for sink in (0.0, -np.inf):  # a fully masked row: zeros, whatever the sink (as softmax_with_sinks)
        dead = M.softmax_sink_scaled(np, np.full((1, 2, 3), -np.inf), np.full(1, sink))
        assert np.array_equal(dead, np.zeros((1, 2, 3)))
    s0 = np.asarray(s[0]) if backend == "numpy" else s[0].numpy()
    none = M.softmax_sink_scaled(np, s0, np.full(h, -np.inf))  # a sink of -inf is no sink: plain softmax
    assert err(none, torch.softmax(torch.from_numpy(s0), -1)) < TOL[dtype]


def test_sinks_of_minus_inf_are_plain_softmax() -> None:
    s = np.random.default_rng(6).normal(size=(2, 3, 4))
    w = M.softmax_with_sinks(np, s, np.full(2, -np.inf))
    assert err(w, torch.softmax(torch.from_numpy(s), -1)) < 1e-15
    dead = M.softmax_with_sinks(np, np.full((1, 2, 3), -np.inf), np.full(1, -np.inf))
    assert np.array_equal(dead, np.zeros((1, 2, 3)))


# ---- norms -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["qwen3", "gemma"])
def test_rms_norm_equals_hf(backend: str, dtype: str, kind: str) -> None:
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    rng = np.random.default_rng(7)
    x, w = rng.normal(size=(2, 3, 5, 8)) * 3, rng.normal(size=8)
    ref = (Qwen3RMSNorm(8, eps=1e-6) if kind == "qwen3" else GemmaRMSNorm(8, eps=1e-6)).to(getattr(torch, dtype))
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w))
        y = ref(torch.from_numpy(x.astype(dtype)))
    ours = M.rms_norm(namespace(backend), on(backend, x, dtype), on(backend, w, dtype), 1e-6, plus_one=kind == "gemma")
    assert str(ours.dtype).endswith(dtype)
    assert err(ours, y) < (1e-5 if dtype == "float32" else 1e-5)  # HF computes a float64 input's norm in float32


def test_rms_norm_bfloat16_is_computed_in_float32_like_qwen3() -> None:
    import array_api_compat.torch as xt
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    x = torch.from_numpy(np.random.default_rng(8).normal(size=(4, 8))).to(torch.bfloat16)
    ref = Qwen3RMSNorm(8).to(torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(0.5, 2, 8))
        y = ref(x)
    ours = M.rms_norm(xt, x, ref.weight.detach(), 1e-6)
    assert ours.dtype == torch.bfloat16 and err(ours.float(), y.float()) <= 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_equals_torch(backend: str) -> None:
    rng = np.random.default_rng(9)
    x, w, b = rng.normal(size=(3, 4, 10)) + 2, rng.normal(size=10), rng.normal(size=10)
    ln = torch.nn.LayerNorm(10, eps=1e-5).double()
    with torch.no_grad():
        ln.weight.copy_(torch.from_numpy(w))
        ln.bias.copy_(torch.from_numpy(b))
        y = ln(torch.from_numpy(x))
    assert err(M.layer_norm(namespace(backend), on(backend, x, "float64"), w, b, 1e-5), y) < 1e-12


# ---- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("call,option", [
    (lambda: check_kv_heads(6, 4), "--kv-heads"),
    (lambda: check_rope(7, None, "half"), "--rope"),
    (lambda: check_rope(8, 10, "half"), "--rotary-dim"),
    (lambda: check_rope(8, 3, "half"), "--rotary-dim"),
    (lambda: check_rope(8, None, "spiral"), "--rope"),
    (lambda: check_window(0), "--window"),
    (lambda: check_softcap(0.0), "--softcap"),
    (lambda: check_softcap(-1.0), "--softcap"),
    (lambda: check_softcap(math.inf), "--softcap"),
    (lambda: check_sinks(np.zeros(3), 4), "--sinks"),
    (lambda: check_sinks(np.array([0.0, np.nan]), 2), "--sinks"),
    (lambda: check_q_offset(-1), "--q-offset"),
    (lambda: check_positional("additive", "rope"), "--rope"),
    (lambda: check_positional("location", "alibi"), "--alibi"),
    (lambda: M.rope_inv_freq(8, 10000.0, {"rope_type": "longrope"}), "--rope-scaling"),
    (lambda: M.rope_inv_freq(8, 10000.0, {"rope_type": "linear"}), "--rope-scaling"),
])
def test_bad_options_are_one_line_errors_naming_the_option(call: Any, option: str) -> None:
    with pytest.raises(InputError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(option + ":") and "\n" not in msg and len(msg) < 300


def test_good_options_pass() -> None:
    assert check_kv_heads(8, 2) == 4 and check_rope(8, None, "half") == 8 and check_rope(10, 4, "interleaved") == 4
    assert check_window(1) == 1 and check_softcap(50) == 50.0 and check_q_offset(0) == 0
    assert check_sinks([0.0, -np.inf], 2).shape == (2,)
    check_positional("scaled-dot", "rope")
    check_positional("additive", "alibi")


# ---- properties ---------------------------------------------------------------------------------

vectors = st.integers(1, 8).flatmap(lambda h: st.lists(st.floats(-10, 10), min_size=2 * h, max_size=2 * h))


@settings(max_examples=40, deadline=None)
@given(x=vectors, p=st.integers(0, 5000), mode=st.sampled_from(ROPE_MODES))
def test_rope_keeps_norms(x: list[float], p: int, mode: str) -> None:
    v = np.array(x)[None, :]
    c, s = M.rope_cos_sin(np.array([p]), M.rope_inv_freq(len(x), 10000.0, None)[0], 1.0, mode, dtype="float64")
    assert np.linalg.norm(M.rotate(np, v, c, s, mode)) == pytest.approx(np.linalg.norm(v), rel=1e-12, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(q=vectors, seed=st.integers(0, 2**16), i=st.integers(0, 300), j=st.integers(0, 300), shift=st.integers(0, 300),
       mode=st.sampled_from(ROPE_MODES))
def test_rope_scores_depend_on_offset_only(q: list[float], seed: int, i: int, j: int, shift: int, mode: str) -> None:
    qv = np.array(q)[None, :]
    kv = np.random.default_rng(seed).normal(size=qv.shape)
    inv = M.rope_inv_freq(len(q), 10000.0, None)[0]

    def score(a: int, b: int) -> float:
        cq, sq = M.rope_cos_sin(np.array([a]), inv, 1.0, mode, dtype="float64")
        ck, sk = M.rope_cos_sin(np.array([b]), inv, 1.0, mode, dtype="float64")
        return float((M.rotate(np, qv, cq, sq, mode) @ M.rotate(np, kv, ck, sk, mode).T)[0, 0])

    assert score(i + shift, j + shift) == pytest.approx(score(i, j), rel=1e-9, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 12), m=st.integers(1, 6), n=st.integers(1, 6), c=st.integers(-50, 50), seed=st.integers(0, 99))
def test_alibi_weights_shift_invariant_per_row(h: int, m: int, n: int, c: int, seed: int) -> None:
    s = np.random.default_rng(seed).normal(size=(h, m, n))
    sl = alibi_slopes(h)
    a = s + M.alibi_bias(sl, np.arange(m), np.arange(n))
    b = s + M.alibi_bias(sl, np.arange(m) + c, np.arange(n)) + sl[:, None, None] * c  # slope·j + const per row
    ta, tb = torch.softmax(torch.from_numpy(a), -1), torch.softmax(torch.from_numpy(b), -1)
    assert err(ta, tb) < 1e-12


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 8), extra=st.integers(0, 8), past=st.integers(0, 8), more=st.integers(0, 5))
def test_a_window_as_long_as_the_sequence_is_plain_causal(m: int, extra: int, past: int, more: int) -> None:
    n = m + past + extra
    q_pos, k_pos = past + np.arange(m), np.arange(n)
    full = int(q_pos.max()) + 1  # a window reaching back to key 0 from the last query
    assert np.array_equal(M.window_keep(q_pos, k_pos, full + more), M.causal_keep(q_pos, k_pos))
    if full > 1:
        assert not np.array_equal(M.window_keep(q_pos, k_pos, full - 1), M.causal_keep(q_pos, k_pos))


# ---- the composition the pipeline must equal ----------------------------------------------------


@dataclass
class Layer:
    """Weights and settings of one attention layer, in nn.Linear layout (out, in)."""

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    heads: int
    kv_heads: int
    head_dim: int
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    scaling: float | None = None  # default head_dim^-0.5
    rope: str | None = None  # "half" | "interleaved"
    rotary_dim: int | None = None
    rope_base: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_positions: int | None = None
    qk_norm: tuple[np.ndarray, np.ndarray, float, bool] | None = None  # (w_q, w_k, eps, plus_one)
    softcap: float | None = None
    alibi: bool = False
    window: int | None = None
    sinks: np.ndarray | None = None
    residual: bool = False  # Bloom adds the residual inside its attention
    extra: dict[str, Any] = field(default_factory=dict)


def compose_layer(xp: Any, x: Any, p: Layer, q_offset: int = 0, past_kv: tuple[Any, Any] | None = None,
                  tables: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[Any, Any]:
    """(output, weights) of one layer built from attncli.core.ops: THE COMPOSITION THE PIPELINE MUST EQUAL.

    x (B, T, E): T new tokens at positions q_offset..q_offset+T-1; past_kv: the cache's (K, V),
    (B, G, P, d), already rotated (as HF caches them). Causal masking always. ``tables``: (cos, sin)
    to rotate with instead of rope_cos_sin's (only the exact float64 check passes the reference's own,
    to tell the composition from the last-ulp rounding of torch's float32 cos/sin).
    """
    dt, dev = x.dtype, None
    B, T, _ = (int(n) for n in x.shape)
    H, G, d = p.heads, p.kv_heads, p.head_dim

    def lin(a: Any, w: np.ndarray, b: np.ndarray | None) -> Any:
        y = a @ xp.asarray(w.T, dtype=dt, device=dev)  # (B, T, in) x (in, out) -> (B, T, out)
        return y if b is None else y + xp.asarray(b, dtype=dt, device=dev)

    # 1) project and split heads: (B, T, H·d) -> (B, T, H, d)
    q = xp.reshape(lin(x, p.wq, p.bq), (B, T, H, d))
    k = xp.reshape(lin(x, p.wk, p.bk), (B, T, G, d))
    v = xp.reshape(lin(x, p.wv, p.bv), (B, T, G, d))
    # 2) QK-norm over head_dim, per head, before RoPE
    if p.qk_norm is not None:
        wq, wk, eps, plus_one = p.qk_norm
        q, k = M.rms_norm(xp, q, wq, eps, plus_one), M.rms_norm(xp, k, wk, eps, plus_one)
    q, k, v = (xp.permute_dims(a, (0, 2, 1, 3)) for a in (q, k, v))  # (B, T, H, d) -> (B, H, T, d)
    q_pos = q_offset + np.arange(T)
    # 3) rotate q and k at their positions
    if p.rope is not None:
        r = check_rope(d, p.rotary_dim, p.rope)
        inv, factor = M.rope_inv_freq(r, p.rope_base, p.rope_scaling, p.max_positions)
        cos, sin = M.rope_cos_sin(q_pos, inv, factor, p.rope) if tables is None else tables  # float32, as HF
        q, k = M.rotate(xp, q, cos, sin, p.rope, r), M.rotate(xp, k, cos, sin, p.rope, r)
    if past_kv is not None:
        k, v = xp.concat([past_kv[0], k], axis=2), xp.concat([past_kv[1], v], axis=2)  # (B, G, P + T, d)
    cache = (k, v)
    n = int(k.shape[2])
    k_pos = np.arange(n)
    # 4) grouped-query heads
    rep = check_kv_heads(H, G)
    k, v = M.expand_kv(xp, k, rep), M.expand_kv(xp, v, rep)  # (B, G, n, d) -> (B, H, n, d)
    # 5) score and scale
    s = (q @ xp.matrix_transpose(k)) * (d ** -0.5 if p.scaling is None else p.scaling)  # (B,H,T,d)x(B,H,d,n)->(B,H,T,n)
    # 6) cap, 7) bias
    if p.softcap is not None:
        s = M.softcap(xp, s, p.softcap)
    if p.alibi:
        s = s + xp.asarray(M.alibi_bias(alibi_slopes(H), q_pos, k_pos), dtype=dt, device=dev)  # + (H, T, n)
    # 8) mask: causal, or the sliding window
    keep = M.causal_keep(q_pos, k_pos) if p.window is None else M.window_keep(q_pos, k_pos, p.window)
    s = xp.where(xp.asarray(keep, device=dev), s, xp.asarray(-math.inf, dtype=dt, device=dev))
    # 9) softmax (with sinks)
    if p.sinks is not None:
        w = M.softmax_with_sinks(xp, s, xp.asarray(p.sinks, dtype=dt, device=dev))
    else:
        mx = xp.max(s, axis=-1, keepdims=True)
        e = xp.exp(s - mx)
        w = e / xp.sum(e, axis=-1, keepdims=True)
    # 10) sum and 11) merge heads
    o = w @ v  # (B, H, T, n) x (B, H, n, d) -> (B, H, T, d)
    o = xp.reshape(xp.permute_dims(o, (0, 2, 1, 3)), (B, T, H * d))  # (B, H, T, d) -> (B, T, H·d)
    out = lin(o, p.wo, p.bo)
    if p.residual:
        out = out + p.extra["residual"]
    p.extra["cache"] = cache
    return out, w


# ---- tiny HF models: weights, inputs and output_attentions ------------------------------------------


def _np(t: Any) -> np.ndarray | None:
    return None if t is None else t.detach().double().numpy()


def llama_like(a: Any, cfg: Any, **kw: Any) -> Layer:
    """Llama / Mistral / Qwen3 / Gemma2 / gpt-oss attention modules: q/k/v/o_proj."""
    return Layer(_np(a.q_proj.weight), _np(a.k_proj.weight), _np(a.v_proj.weight), _np(a.o_proj.weight),
                 cfg.num_attention_heads, cfg.num_key_value_heads, a.head_dim,
                 bq=_np(a.q_proj.bias), bk=_np(a.k_proj.bias), bv=_np(a.v_proj.bias), bo=_np(a.o_proj.bias),
                 rope="half", rope_base=cfg.rope_parameters["rope_theta"], max_positions=cfg.max_position_embeddings,
                 **kw)


def fused_per_head(a: Any, heads: int, d: int, **kw: Any) -> Layer:
    """GPT-NeoX / Bloom: query_key_value rows (H, 3, d) per head."""
    w = _np(a.query_key_value.weight).reshape(heads, 3, d, -1)  # (H·3·d, E) -> (H, 3, d, E)
    b = _np(a.query_key_value.bias).reshape(heads, 3, d)
    E = w.shape[-1]
    return Layer(w[:, 0].reshape(-1, E), w[:, 1].reshape(-1, E), w[:, 2].reshape(-1, E), _np(a.dense.weight),
                 heads, heads, d, bq=b[:, 0].reshape(-1), bk=b[:, 1].reshape(-1), bv=b[:, 2].reshape(-1),
                 bo=_np(a.dense.bias), **kw)


def build(case: str) -> tuple[Any, Any, Any]:
    """(model, attention module, Layer maker) for one tiny random config."""
    T = transformers
    small = dict(hidden_size=32, intermediate_size=16, num_hidden_layers=1, vocab_size=50, max_position_embeddings=64)
    if case == "llama-gqa-rope":
        cfg = T.LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    elif case == "llama-yarn":
        cfg = T.LlamaConfig(**small, num_attention_heads=4, num_key_value_heads=1, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0})
    elif case == "llama3-rope":
        cfg = T.LlamaConfig(**small, num_attention_heads=2, num_key_value_heads=2, rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 500000.0})
    elif case == "mistral-window":
        cfg = T.MistralConfig(**small, num_attention_heads=4, num_key_value_heads=2, sliding_window=3)
    elif case == "gemma2":
        cfg = T.Gemma2Config(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                             query_pre_attn_scalar=24, attn_logit_softcapping=2.0, layer_types=["sliding_attention"])
    elif case == "qwen3-qknorm":
        cfg = T.Qwen3Config(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    elif case == "gpt-oss":
        cfg = T.GptOssConfig(**small, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=3,
                             layer_types=["sliding_attention"], num_local_experts=2, num_experts_per_tok=1)
    elif case == "bloom-alibi":
        cfg = T.BloomConfig(hidden_size=36, n_layer=1, n_head=6, vocab_size=50)  # 6 heads: not a power of two
    elif case == "gptj-partial":
        cfg = T.GPTJConfig(n_embd=32, n_layer=1, n_head=2, rotary_dim=8, vocab_size=50, n_positions=64)
    elif case == "neox-partial":
        cfg = T.GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                              rotary_pct=0.5, vocab_size=50, max_position_embeddings=64)
    else:
        raise KeyError(case)
    torch.manual_seed(0)
    extra = {"experts_implementation": "eager"} if case == "gpt-oss" else {}  # grouped_mm has no float64
    model = T.AutoModel.from_config(cfg, attn_implementation="eager", **extra).eval()
    with torch.no_grad():  # biases and norm weights are zeros/ones at init: make them count
        for name, prm in model.named_parameters():
            if prm.ndim == 1 or "sinks" in name:
                prm.normal_(0, 0.5)
    if case.startswith("bloom"):
        a = model.h[0].self_attention
        return model, a, lambda: fused_per_head(a, cfg.n_head, cfg.hidden_size // cfg.n_head, alibi=True, residual=True)
    if case.startswith("gptj"):
        a = model.h[0].attn
        return model, a, lambda: Layer(_np(a.q_proj.weight), _np(a.k_proj.weight), _np(a.v_proj.weight),
                                       _np(a.out_proj.weight), cfg.n_head, cfg.n_head, a.head_dim,
                                       rope="interleaved", rotary_dim=cfg.rotary_dim)
    if case.startswith("neox"):
        a = model.layers[0].attention
        d = cfg.hidden_size // cfg.num_attention_heads
        return model, a, lambda: fused_per_head(a, cfg.num_attention_heads, d, rope="half",
                                                rotary_dim=int(d * cfg.rope_parameters["partial_rotary_factor"]))
    a = model.layers[0].self_attn
    kw: dict[str, Any] = {"rope_scaling": cfg.rope_parameters}
    if case == "mistral-window":
        kw["window"] = cfg.sliding_window
    if case == "gemma2":
        kw.update(window=cfg.sliding_window, softcap=cfg.attn_logit_softcapping, scaling=cfg.query_pre_attn_scalar ** -0.5)
    if case == "qwen3-qknorm":
        kw["qk_norm"] = (_np(a.q_norm.weight), _np(a.k_norm.weight), cfg.rms_norm_eps, False)
    if case == "gpt-oss":
        kw.update(window=cfg.sliding_window)
    return model, a, lambda: llama_like(a, cfg, **kw, **({"sinks": _np(a.sinks)} if case == "gpt-oss" else {}))


def run_hf(model: Any, attn: Any, x: np.ndarray, dtype: str) -> tuple[np.ndarray, Any, Any, dict[str, Any]]:
    """Run the model on embeddings x; the attention module's input, output, weights (and Bloom's residual)."""
    seen: dict[str, Any] = {}

    def pre(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen["x"] = args[0] if args else kwargs["hidden_states"]
        seen["residual"] = args[1] if len(args) > 1 else kwargs.get("residual")
        seen["tables"] = kwargs.get("position_embeddings")

    def post(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        seen["out"], seen["w"] = out[0], out[1]

    h1 = attn.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = attn.register_forward_hook(post, with_kwargs=True)
    try:
        with torch.no_grad():
            model.to(getattr(torch, dtype))(inputs_embeds=torch.from_numpy(x.astype(dtype)), output_attentions=True)
    finally:
        h1.remove()
        h2.remove()
    return host(seen["x"]), seen["out"], seen["w"], seen


LAYER_CASES = ["llama-gqa-rope", "llama-yarn", "llama3-rope", "mistral-window", "gemma2", "qwen3-qknorm", "gpt-oss",
               "bloom-alibi", "gptj-partial", "neox-partial"]
# No HF module here runs wholly in float64: cos/sin tables are float32 (cast up), the softmax is float32 in all but
# gpt-oss, RMSNorm and GPT-J's scores are float32, Bloom's slopes too. Measured: weights within 6e-8, outputs 2e-8
# of the float64 composition. Exact float64 agreement (1e-12) is checked where the reference runs in float64:
# gpt-oss's eager sinks, apply_rotary_pos_emb on given tables, repeat_kv, LayerNorm, FlexAttention.
F64_TOL = 1e-7


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {case: build(case) for case in LAYER_CASES}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", LAYER_CASES)
def test_whole_layer_equals_hf_module(models: dict[str, Any], case: str, dtype: str, backend: str) -> None:
    model, attn, make = models[case]
    E = model.config.hidden_size
    x = np.random.default_rng(10).normal(size=(2, 7, E))
    hx, out, w, seen = run_hf(model, attn, x, dtype)
    p = make()
    if p.residual:
        p.extra["residual"] = on(backend, host(seen["residual"]), dtype)
    ours, ow = compose_layer(namespace(backend), on(backend, hx, dtype), p)
    tol = 1e-5 if dtype == "float32" else F64_TOL
    assert err(ow, w) < tol, f"weights differ by {err(ow, w):.2e}"
    assert err(ours, out) < tol, f"output differs by {err(ours, out):.2e}"
    model.float()


EXACT_F64 = ["llama-gqa-rope", "llama-yarn", "llama3-rope", "mistral-window", "gemma2", "gpt-oss", "neox-partial"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", EXACT_F64)
def test_whole_layer_float64_exact(models: dict[str, Any], case: str, backend: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The module made to run wholly in float64: torch's softmax in the input's dtype (HF asks for float32),
    and our composition rotating with the module's own (float32-computed) cos/sin tables."""
    softmax = F.softmax

    def softmax64(x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(F, "softmax", softmax64)
    model, attn, make = models[case]
    x = np.random.default_rng(13).normal(size=(2, 7, model.config.hidden_size))
    hx, out, w, seen = run_hf(model, attn, x, "float64")
    cos, sin = (host(t[0]) for t in seen["tables"])  # (T, r), the same for both batch rows
    if case == "gpt-oss":  # its _apply_rotary_emb takes (T, r/2) tables: first_half·cos - second_half·sin, ...
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)  # = rotate_half with cat(θ, θ)
    ours, ow = compose_layer(namespace(backend), on(backend, hx, "float64"), make(), tables=(cos, sin))
    assert err(ow, w) < 1e-10 and err(ours, out) < 1e-10
    model.float()


@pytest.mark.parametrize("case", ["llama-gqa-rope", "mistral-window", "gpt-oss"])
def test_kv_cache_step_equals_the_full_sequence_rows(models: dict[str, Any], case: str) -> None:
    """HF generation with past_key_values: m new tokens over the cache = the full run's last m rows,
    and our composition with q_offset = past gives the same logits (RoPE + causal, window, sinks)."""
    model, attn, make = models[case]
    rng = np.random.default_rng(11)
    x = rng.normal(size=(1, 9, model.config.hidden_size)).astype(np.float32)
    past, m = 6, 3
    with torch.no_grad():
        full = model.float()(inputs_embeds=torch.from_numpy(x), output_attentions=True)
        first = model(inputs_embeds=torch.from_numpy(x[:, :past]), use_cache=True)
        step = model(inputs_embeds=torch.from_numpy(x[:, past:]), past_key_values=first.past_key_values,
                     output_attentions=True)
    ref = step.attentions[0]  # (1, H, m, kept keys): a sliding layer's cache may keep only the last keys
    kept = int(ref.shape[-1])
    assert err(ref, full.attentions[0][:, :, past:, 9 - kept:]) < 1e-6  # the reference agrees with itself
    p = make()
    _, _, _, seen = run_hf(model, attn, x, "float32")  # the attention input of the full run
    hx = host(seen["x"])
    _, w_full = compose_layer(np, hx, p)
    compose_layer(np, hx[:, :past], p)
    _, w_step = compose_layer(np, hx[:, past:], p, q_offset=past, past_kv=p.extra["cache"])
    assert w_step.shape == (1, p.heads, m, 9)
    assert err(w_step[..., 9 - kept:], ref) < 1e-5 and not w_step[..., :9 - kept].any()
    assert err(w_step, w_full[:, :, past:]) < 1e-6


# ---- FlexAttention score_mod / mask_mod --------------------------------------------------------------


def test_flex_attention_alibi_softcap_window_gqa() -> None:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    rng = np.random.default_rng(12)
    H, G, T, d, W, cap = 4, 2, 8, 4, 3, 1.5
    q, k, v = rng.normal(size=(1, H, T, d)) * 2, rng.normal(size=(1, G, T, d)) * 2, rng.normal(size=(1, G, T, d))
    slopes = torch.from_numpy(alibi_slopes(H))

    def score_mod(score: Any, b: Any, h: Any, i: Any, j: Any) -> Any:
        score = cap * torch.tanh(score / cap)
        return score + slopes[h] * (j - i)

    def mask_mod(b: Any, h: Any, i: Any, j: Any) -> Any:
        return (j <= i) & (j > i - W)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "called without torch.compile": the unfused reference is what we want
        block = flex.create_block_mask(mask_mod, 1, H, T, T, device="cpu")
        ref = flex.flex_attention(*(torch.from_numpy(a) for a in (q, k, v)), score_mod=score_mod, block_mask=block,
                                  enable_gqa=True)
    kk, vv = M.expand_kv(np, k, H // G), M.expand_kv(np, v, H // G)
    s = M.softcap(np, q @ np.swapaxes(kk, -1, -2) * d ** -0.5, cap)  # (1,H,T,d) x (1,H,d,T) -> (1,H,T,T)
    pos = np.arange(T)
    s = np.where(M.window_keep(pos, pos, W), s + M.alibi_bias(alibi_slopes(H), pos, pos), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True)) @ vv
    assert err(out, ref) < 1e-10
