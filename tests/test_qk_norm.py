"""QK-norm kinds and placements against the HF modules that define them (transformers' own classes) and
float64 hand computations: per-head LayerNorm (StableLM's one nn.LayerNorm per head, Cohere's
CohereLayerNorm (H, d), a shared LayerNorm with a bias as Persimmon/Phi), RMS over the full width
(OLMo 2's Olmo2RMSNorm(H·d) before the head split), RMS after RoPE (HunYuan), weightless RMS after
RoPE with nanochat's reversed rotate_half; the CLI's --qk-norm / --qk-norm-at values and the one-line
errors of wrong QK-norm weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from halfbounds import assert_rounds_as  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402
from attncli.core.engine import multihead, run  # noqa: E402
from attncli.core.options import Options  # noqa: E402
from attncli.core.problem import Problem  # noqa: E402
from attncli.core.projections import Projections  # noqa: E402

runner = CliRunner()
B, H, G, T, D = 2, 4, 2, 6, 8  # batch, query heads, K/V heads, tokens, head width
RNG = np.random.default_rng(7)


def t(a: np.ndarray) -> Any:
    return torch.tensor(a, dtype=torch.float32)


def qk(scale: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (B, H, T, d), k and v (B, G, T, d) in float32, away from zero mean (so LayerNorm differs from RMS)."""
    q = (RNG.normal(size=(B, H, T, D)) * scale + 0.7).astype(np.float32)
    k = (RNG.normal(size=(B, G, T, D)) * scale - 0.4).astype(np.float32)
    v = RNG.normal(size=(B, G, T, D)).astype(np.float32)
    return q, k, v


def norm_weight(*shape: int) -> np.ndarray:
    return (1.0 + 0.5 * RNG.uniform(-1, 1, size=shape)).astype(np.float32)


def attend(q: Any, k: Any, v: Any, _qk: Any = None, **options: Any) -> Any:
    """attend() with QK-norm weights (q_norm, k_norm, their biases: Problem fields, as --weights hands them on)."""
    wq, wk, bq, bk = _qk or (None, None, None, None)
    return run(Problem.build(q, k, v, q_norm=wq, k_norm=wk, q_norm_bias=bq, k_norm_bias=bk,
                             options=Options().merged(options, "attend()")))


def err(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# ---- each kind's q_norm step against the HF module that defines it ----------------------------------

@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_layernorm_per_head_weights_as_stablelm(backend: str) -> None:
    from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead

    q, k, v = qk()
    wq, wk = norm_weight(H, D), norm_weight(G, D)
    ref_q, ref_k = StableLmLayerNormPerHead(D, H, eps=1e-5), StableLmLayerNormPerHead(D, G, eps=1e-5)
    with torch.no_grad():
        for mod, w in ((ref_q, wq), (ref_k, wk)):
            for h, n in enumerate(mod.norms):
                n.weight.copy_(t(w[h]))
        want_q, want_k = ref_q(t(q)).numpy(), ref_k(t(k)).numpy()
    tr = attend(q, k, v, qk_norm="layernorm", norm_eps=1e-5, backend=backend, _qk=(wq, wk, None, None))
    assert err(tr["q_norm"], want_q) < 1e-5
    k_step = np.asarray(tr["k_norm"])[:, ::H // G]  # shown per query head: K/V head g at query heads g·r
    assert err(k_step, want_k) < 1e-5
    assert tr.step("q_norm").params.per_head and "each head its own weights" in tr.step("q_norm").formula


def test_layernorm_per_head_as_cohere_layernorm() -> None:
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    q, k, v = qk()
    wq, wk = norm_weight(H, D), norm_weight(G, D)
    ln_q, ln_k = CohereLayerNorm((H, D), eps=1e-5), CohereLayerNorm((G, D), eps=1e-5)
    with torch.no_grad():
        ln_q.weight.copy_(t(wq))
        ln_k.weight.copy_(t(wk))
        # Cohere normalises (B, T, H, d) before the transpose to (B, H, T, d)
        want_q = ln_q(t(q).transpose(1, 2)).transpose(1, 2).numpy()
        want_k = ln_k(t(k).transpose(1, 2)).transpose(1, 2).numpy()
    tr = attend(q, k, v, qk_norm="layernorm", norm_eps=1e-5, _qk=(wq, wk, None, None))
    assert err(tr["q_norm"], want_q) < 1e-5
    assert err(np.asarray(tr["k_norm"])[:, ::H // G], want_k) < 1e-5


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_shared_layernorm_with_bias_as_torch(backend: str) -> None:
    """Persimmon / Phi: one nn.LayerNorm(d) with a bias for every head (torch's layer_norm is the reference)."""
    q, k, v = qk()
    wq, wk, bq, bk = norm_weight(D), norm_weight(D), RNG.normal(size=D).astype(np.float32), \
        RNG.normal(size=D).astype(np.float32)
    F = torch.nn.functional
    want_q = F.layer_norm(t(q), (D,), t(wq), t(bq), 1e-5).numpy()
    want_k = F.layer_norm(t(k), (D,), t(wk), t(bk), 1e-5).numpy()
    tr = attend(q, k, v, qk_norm="layernorm", norm_eps=1e-5, backend=backend, _qk=(wq, wk, bq, bk))
    assert err(tr["q_norm"], want_q) < 1e-5
    assert err(np.asarray(tr["k_norm"])[:, ::H // G], want_k) < 1e-5
    assert "+ b_q" in tr.step("q_norm").formula and tr.step("q_norm").params.bias_given


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_rms_full_width_as_olmo2_before_the_split(backend: str) -> None:
    """OLMo 2: Olmo2RMSNorm(H·d) on the projected (B, T, H·d), then the split: the same numbers as attncli's
    norm over every head's features of a token."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    q, k, v = qk()
    wq, wk = norm_weight(H * D), norm_weight(G * D)
    nq, nk = Olmo2RMSNorm(H * D, 1e-6), Olmo2RMSNorm(G * D, 1e-6)
    with torch.no_grad():
        nq.weight.copy_(t(wq))
        nk.weight.copy_(t(wk))

        def full(mod: Any, a: np.ndarray) -> np.ndarray:
            b, h, n, d = a.shape
            flat = t(a).transpose(1, 2).reshape(b, n, h * d)  # (B, H, T, d) -> (B, T, H·d): before the split
            return mod(flat).reshape(b, n, h, d).transpose(1, 2).numpy()

        want_q, want_k = full(nq, q), full(nk, k)
    tr = attend(q, k, v, qk_norm="rms-full", backend=backend, _qk=(wq, wk, None, None))
    assert err(tr["q_norm"], want_q) < 1e-5
    assert err(np.asarray(tr["k_norm"])[:, ::H // G], want_k) < 1e-5
    assert "4·8 features of every head" in tr.step("q_norm").formula


def _hf_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, rotate: Any, norm: Any, after: bool,
                  base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """Scores and output as HF's Attention.forward: HF's own apply_rotary_pos_emb and norm modules, eager
    softmax(q kᵀ / √d) with repeat_kv, causal."""
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[None], emb.sin()[None]
    qt, kt, vt = t(q), t(k), t(v)
    with torch.no_grad():
        if not after:
            qt, kt = norm(qt), norm(kt)
        qt, kt = rotate(qt, kt, cos, sin)
        if after:
            qt, kt = norm(qt), norm(kt)
        kt, vt = kt.repeat_interleave(H // G, 1), vt.repeat_interleave(H // G, 1)
        s = qt @ kt.transpose(-1, -2) / D ** 0.5
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = s.softmax(-1)
        return w.numpy(), (w @ vt).numpy()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_rms_after_rope_as_hunyuan(backend: str) -> None:
    from transformers.models.hunyuan_v1_dense import modeling_hunyuan_v1_dense as hy

    q, k, v = qk()
    w = norm_weight(D)
    mod = hy.HunYuanDenseV1RMSNorm(D, eps=1e-5)
    with torch.no_grad():
        mod.weight.copy_(t(w))
    want_w, want_o = _hf_attention(q, k, v, hy.apply_rotary_pos_emb, mod, after=True)
    tr = attend(q, k, v, rope="half", qk_norm="rms", qk_norm_at="after-rope", norm_eps=1e-5, causal=True,
                backend=backend, _qk=(w, w, None, None))
    assert err(tr.weights, want_w) < 1e-5 and err(tr.output, want_o) < 1e-5
    names = tr.names()
    assert names.index("q_rot") < names.index("q_norm"), names
    assert "q_rot / sqrt(mean(q_rot²)" in tr.step("q_norm").formula
    # before RoPE (Qwen3's order) gives other numbers: the placement matters
    other = attend(q, k, v, rope="half", qk_norm="rms", norm_eps=1e-5, causal=True, _qk=(w, w, None, None))
    assert err(other.weights, want_w) > 1e-3


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_weightless_rms_after_reversed_rope_as_nanochat(backend: str) -> None:
    from transformers.models.nanochat import modeling_nanochat as nc

    q, k, v = qk()
    want_w, want_o = _hf_attention(q, k, v, nc.apply_rotary_pos_emb, nc.NanoChatRMSNorm(eps=1e-6), after=True)
    tr = attend(q, k, v, rope="half-reversed", qk_norm="rms", qk_norm_at="after-rope", causal=True, backend=backend)
    assert err(tr.weights, want_w) < 1e-5 and err(tr.output, want_o) < 1e-5
    assert "weightless" in tr.step("q_norm").formula and not tr.step("q_norm").params.weight_given
    plain = attend(q, k, v, rope="half", qk_norm="rms", qk_norm_at="after-rope", causal=True)
    assert err(plain.weights, want_w) > 1e-3  # the sign of nanochat's rotate_half matters


def test_bfloat16_layernorm_as_cohere_in_bfloat16() -> None:
    """Half inputs: computed in float32 (weight included) and rounded once, as CohereLayerNorm does."""
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    from attncli.core import ops
    from attncli.core.backend import get_backend

    q = qk()[0]
    w = norm_weight(H, D)
    ln = CohereLayerNorm((H, D), eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        ln.weight.copy_(t(w).to(torch.bfloat16))
        xb = t(q).to(torch.bfloat16)
        want = ln(xb.transpose(1, 2)).transpose(1, 2)
    xp = get_backend("torch").xp
    got = ops.qk_norm(xp, xb, "layernorm", ln.weight.detach().reshape(H, 1, D), None, 1e-5)
    assert got.dtype == torch.bfloat16
    # torch's float32 means on this CPU's instruction set, ours and the module's: within a unit (tests/halfbounds.py)
    assert_rounds_as(got.double().numpy(), want.double().numpy(), "bfloat16", what="CohereLayerNorm")


# ---- the command line: --qk-norm kinds, --qk-norm-at, weights from --weights, one-line errors ---------

def _ln64(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w
    return y if b is None else y + b


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _self_files(tmp_path: Path, extra: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray], list[str]]:
    E = H * D
    x = RNG.normal(size=(T, E)).astype(np.float32)
    w = {n: (RNG.normal(size=(E, E)) / np.sqrt(E)).astype(np.float32) for n in ("W_q", "W_k", "W_v", "W_o")}
    w.update(extra)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "w.npz", **w)
    return x, w, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "w.npz"), "--heads", str(H)]


def test_cli_self_layernorm_per_head_with_bias(tmp_path: Path) -> None:
    E = H * D
    wq, wk, bq, bk = norm_weight(H, D), norm_weight(H, D), RNG.normal(size=(H, D)), RNG.normal(size=(H, D))
    x, w, args = _self_files(tmp_path, {"q_norm": wq, "k_norm": wk, "q_norm_bias": bq.astype(np.float32),
                                        "k_norm_bias": bk.astype(np.float32)})
    res = runner.invoke(app, [*args, "--qk-norm", "layernorm", "--norm-eps", "1e-5", "--causal", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    # float64 by hand: project, split, LayerNorm each head with its own row, softmax(q kᵀ/√d), merge, W_o
    X = x.astype(np.float64)
    q = (X @ w["W_q"]).reshape(T, H, D).transpose(1, 0, 2)
    k = (X @ w["W_k"]).reshape(T, H, D).transpose(1, 0, 2)
    vv = (X @ w["W_v"]).reshape(T, H, D).transpose(1, 0, 2)
    q, k = _ln64(q, wq[:, None], bq[:, None], 1e-5), _ln64(k, wk[:, None], bk[:, None], 1e-5)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + np.where(np.tri(T) > 0, 0.0, -np.inf)
    p = _softmax(s)
    out = (p @ vv).transpose(1, 0, 2).reshape(T, E) @ w["W_o"]
    assert err(data["weights"], p) < 1e-5 and err(data["output"], out) < 1e-5
    assert "q_norm" in [s["name"] for s in data["steps"]]


def _rope64(a: np.ndarray) -> np.ndarray:
    """HF rotate_half RoPE in float64 at positions 0..T-1 (axis -2), base 10000."""
    inv = 1.0 / 10000.0 ** (np.arange(0, D, 2) / D)
    ang = np.arange(T)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    a = a.astype(np.float64)
    return a * cos + np.concatenate([-a[..., D // 2:], a[..., :D // 2]], -1) * sin


def _full64(a: np.ndarray, wt: np.ndarray | None, heads: int) -> np.ndarray:
    """RMS over the token's every head (axis -3) and feature, weights (heads·d,) over that width."""
    y = a / np.sqrt(np.mean(a * a, axis=(-3, -1), keepdims=True) + 1e-6)
    return y if wt is None else y * wt.reshape(heads, 1, D)


def test_cli_run_rms_full_after_rope_weightless(tmp_path: Path) -> None:
    """run on 4-D q (1, H, T, d): --qk-norm rms-full (weightless) after RoPE, against float64."""
    q, k, v = (RNG.normal(size=(1, H, T, D)).astype(np.float32) for _ in range(3))
    for n, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{n}.npy", a)
    res = runner.invoke(app, ["run", *(str(tmp_path / f"{n}.npy") for n in "qkv"), "--qk-norm", "rms-full",
                              "--qk-norm-at", "after-rope", "--rope", "half", "--format", "json"])
    assert res.exit_code == 0, res.output
    qn, kn = _full64(_rope64(q), None, H), _full64(_rope64(k), None, H)
    p = _softmax(qn @ kn.transpose(0, 1, 3, 2) / np.sqrt(D))
    assert err(json.loads(res.stdout)["weights"], p) < 1e-5


def test_cli_self_rms_full_with_grouped_heads(tmp_path: Path) -> None:
    """self --weights with OLMo 2's q_norm (H·d,) and k_norm (G·d,) over grouped K/V heads, against float64."""
    E = H * D
    x = RNG.normal(size=(T, E)).astype(np.float32)
    w = {"W_q": RNG.normal(size=(E, E)) / np.sqrt(E), "W_k": RNG.normal(size=(E, G * D)) / np.sqrt(E),
         "W_v": RNG.normal(size=(E, G * D)) / np.sqrt(E), "q_norm": norm_weight(E), "k_norm": norm_weight(G * D)}
    w = {n: a.astype(np.float32) for n, a in w.items()}
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "w.npz", **w)
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "w.npz"), "--heads", str(H),
                              "--qk-norm", "rms-full", "--rope", "half", "--causal", "--format", "json"])
    assert res.exit_code == 0, res.output
    X = x.astype(np.float64)
    q = X @ w["W_q"] / np.sqrt(np.mean((X @ w["W_q"]) ** 2, -1, keepdims=True) + 1e-6) * w["q_norm"]  # (T, H·d)
    k = X @ w["W_k"] / np.sqrt(np.mean((X @ w["W_k"]) ** 2, -1, keepdims=True) + 1e-6) * w["k_norm"]  # (T, G·d)
    qh = _rope64(q.reshape(T, H, D).transpose(1, 0, 2))
    kh = _rope64(k.reshape(T, G, D).transpose(1, 0, 2)).repeat(H // G, axis=0)
    s = qh @ kh.transpose(0, 2, 1) / np.sqrt(D) + np.where(np.tri(T) > 0, 0.0, -np.inf)
    assert err(json.loads(res.stdout)["weights"], _softmax(s)) < 1e-5


def test_cli_weightless_qk_norm_options(tmp_path: Path) -> None:
    """--qk-norm without weights is weightless; --qk-norm-at lists its two values; an unknown kind is one line."""
    q = RNG.normal(size=(T, D)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    res = runner.invoke(app, ["run", str(tmp_path / "q.npy"), "--qk-norm", "layernorm", "--format", "json"])
    assert res.exit_code == 0, res.output
    qn = _ln64(q.astype(np.float64), 1.0, None, 1e-6)
    p = _softmax(qn @ qn.T / np.sqrt(D))
    assert err(json.loads(res.stdout)["weights"], p) < 1e-5
    bad = runner.invoke(app, ["run", str(tmp_path / "q.npy"), "--qk-norm", "l3"])
    assert bad.exit_code == 2 and "--qk-norm" in bad.output
    bad = runner.invoke(app, ["run", str(tmp_path / "q.npy"), "--qk-norm", "rms", "--qk-norm-at", "middle"])
    assert bad.exit_code == 2 and "--qk-norm-at" in bad.output


@pytest.mark.parametrize("extra,flags,words", [
    ({"q_norm": np.ones((3, D)), "k_norm": np.ones(D)}, ["--qk-norm", "layernorm"], "q_norm has shape (3, 8)"),
    ({"q_norm": np.ones(D), "k_norm": np.ones(D)}, ["--qk-norm", "rms-full"], "q_norm has shape (8,)"),
    ({"q_norm": np.ones(D), "k_norm": np.ones(D), "q_norm_bias": np.zeros(D)}, ["--qk-norm", "rms"],
     "q_norm_bias"),
    ({"q_norm": np.ones(D), "k_norm": np.ones(D)}, [], "--qk-norm"),
])
def test_cli_wrong_qk_norm_weights_are_one_line(tmp_path: Path, extra: dict[str, np.ndarray], flags: list[str],
                                                words: str) -> None:
    _, _, args = _self_files(tmp_path, {n: a.astype(np.float32) for n, a in extra.items()})
    res = runner.invoke(app, [*args, *flags])
    assert res.exit_code == 2, res.output
    msg = res.stderr.strip()
    assert "\n" not in msg and len(msg) < 300 and "Traceback" not in res.output, msg
    assert words in msg and "w.npz" in msg, msg


def test_layer_api_takes_per_head_weights() -> None:
    """multihead() with Projections holding (H, d) QK-norm weights: the same numbers as attend() on the split heads."""
    E = H * D
    x = RNG.normal(size=(T, E)).astype(np.float32)
    W = {n: (RNG.normal(size=(E, E)) / np.sqrt(E)).astype(np.float32) for n in ("W_q", "W_k", "W_v")}
    wq, wk = norm_weight(H, D), norm_weight(H, D)
    tr = multihead(x, weights=Projections(**W, q_norm=wq, k_norm=wk), heads=H,
                   options=Options(qk_norm="layernorm", causal=True))
    split = [(x.astype(np.float64) @ W[n]).reshape(T, H, D).transpose(1, 0, 2) for n in ("W_q", "W_k", "W_v")]
    q, k = _ln64(split[0], wq[:, None], None, 1e-6), _ln64(split[1], wk[:, None], None, 1e-6)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + np.where(np.tri(T) > 0, 0.0, -np.inf)
    assert err(tr.weights, _softmax(s)) < 1e-5


# ---- checkpoints: the QK-norm tensors read and checked (one line naming the tensor or key) ------------

def _tiny(kind: str, folder: Path) -> Path:
    import transformers as tf

    common = dict(vocab_size=40, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    if kind == "olmo2":
        model = tf.Olmo2ForCausalLM(tf.Olmo2Config(**common))
    else:
        model = tf.StableLmForCausalLM(tf.StableLmConfig(**common, qk_layernorm=True, partial_rotary_factor=0.5))
    model.save_pretrained(folder)
    return folder


def test_checkpoint_qk_norm_tensors_are_checked(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    from attncli.errors import InputError
    from attncli.io.model import load_layer

    olmo = _tiny("olmo2", tmp_path / "olmo2")
    layer = load_layer(olmo, 1)
    assert layer.options["qk_norm"] == "rms-full" and layer.projections.q_norm.shape == (32,)
    assert layer.projections.k_norm.shape == (16,) and layer.norm is None  # post-norm: nothing before attention
    tensors = load_file(olmo / "model.safetensors")
    tensors["model.layers.1.self_attn.q_norm.weight"] = np.ones(8, np.float32)  # a per-head norm: not OLMo 2's
    save_file(tensors, olmo / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"q_norm\.weight has shape \(8,\); expected \(32,\)"):
        load_layer(olmo, 1)

    st = _tiny("stablelm", tmp_path / "stablelm")
    layer = load_layer(st, 0)
    assert layer.projections.q_norm.shape == (4, 8) and layer.projections.k_norm.shape == (2, 8)
    assert "norms.{0..3}.weight stacked" in layer.projections.origin["q_norm"]
    cfg = json.loads((st / "config.json").read_text())
    (st / "config.json").write_text(json.dumps({**cfg, "qk_layernorm": False}))
    with pytest.raises(InputError, match="config.json says qk_layernorm = false but layer 0 has"):
        load_layer(st, 0)


def test_weightless_qk_norm_on_the_layers_its_declaration_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nanochat: a weightless QK-norm after RoPE on every layer, no norm tensors; ``qk_layers`` (Llama 4's rope
    layers) limits it to the layers its rule names."""
    import dataclasses

    import transformers as tf

    from attncli.io import families
    from attncli.io.model import load_layer

    cfg = tf.NanoChatConfig(vocab_size=40, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
    tf.NanoChatForCausalLM(cfg).save_pretrained(tmp_path / "nc")
    layer = load_layer(tmp_path / "nc", 1)
    assert (layer.options["qk_norm"], layer.options["qk_norm_at"], layer.options["rope"]) == \
        ("rms", "after-rope", "half-reversed")
    assert layer.projections.q_norm is None and layer.norm is not None and np.all(layer.norm.w == 1.0)
    fam = dataclasses.replace(families.FAMILIES["nanochat"], qk_layers=lambda i, c, lt: i == 0)
    monkeypatch.setitem(families.FAMILIES, "nanochat", fam)
    assert load_layer(tmp_path / "nc", 0).options.get("qk_norm") == "rms"
    assert "qk_norm" not in load_layer(tmp_path / "nc", 1).options
