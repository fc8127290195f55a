"""Every mistake of the catalogue that applies to single-head attention applies to several heads too (issue 32, item
5): rope-q-only, rope-on-v, rope-q-positions-not-offset, dropout-at-eval and the √(H·d) scaling are named on a
4-head layer, a grouped-query 4/2 layer (the problem ``self X --heads 4 [--kv-heads 2] --weights W.npz`` builds) and
on 4-D (B, H, T, d) inputs with 4 or 2 K/V heads; the correct output of each of those shapes raises no alarm.

Every expected number here is computed IN THIS FILE in numpy float64 (a loop over the heads: project, split, rotate
with HF's rotate_half convention, mask, softmax, weights · V, concatenate, W_o), never by attncli's engine or its
variants; the rotary tables are HF Llama's (``inv_freq = 1 / base^(arange(0, d, 2) / d)`` in float32, ``cat(freqs,
freqs)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from attncli.check.verdict import Tolerance, check
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.problem import Problem
from attncli.core.projections import Projections

TOL = Tolerance(1e-9, 1e-9, "float64 by hand")
E, D = 32, 8  # model width, head width (H·d = 32 ≠ d², so √(H·d) is not d)
T = 6  # tokens


def softmax(s: np.ndarray) -> np.ndarray:
    mx = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0.0))
    return e / e.sum(axis=-1, keepdims=True)


def rope(a: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """HF's rotate_half RoPE of ``a`` (..., T, d) at ``positions`` (T,): inv_freq in float32 as LlamaRotaryEmbedding
    computes it (``1.0 / base ** (arange(0, d, 2).float() / d)``), the rest in float64."""
    d = a.shape[-1]
    inv = (np.float32(1.0) / np.float32(base) ** (np.arange(0, d, 2).astype(np.float32) / np.float32(d))).astype(np.float64)
    ang = positions[:, None] * inv[None, :]  # (T, d/2)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    half = np.concatenate([-a[..., d // 2:], a[..., :d // 2]], -1)
    return a * cos + half * sin


@dataclass
class Port:
    """How a port computes each head (the defaults: correct, as HF Llama)."""

    rotate_q: bool = True
    rotate_k: bool = True
    rotate_v: bool = False
    q_positions_from_zero: bool = False  # a KV-cache step whose queries were rotated at 0..m-1
    scale: float | None = None  # None: 1/√d
    drop: Callable[[np.ndarray], np.ndarray] | None = None  # weights -> weights after dropout
    keep: np.ndarray | None = None  # (m, n) bool; None: causal bottom-right
    extra: dict[str, Any] = field(default_factory=dict)


def heads_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, port: Port, offset: int) -> np.ndarray:
    """Per-head attention, a loop: q (H, m, d), k and v (G, n, d); query head h reads K/V head h // (H / G)."""
    H, m, d = q.shape
    G, n, _ = k.shape
    qp = np.arange(m) if port.q_positions_from_zero else offset + np.arange(m)
    kp = np.arange(n)
    keep = port.keep if port.keep is not None else (np.arange(n)[None, :] <= offset + np.arange(m)[:, None])
    out = []
    for h in range(H):
        g = h // (H // G)
        qh = rope(q[h], qp) if port.rotate_q else q[h]
        kh = rope(k[g], kp) if port.rotate_k else k[g]
        vh = rope(v[g], kp) if port.rotate_v else v[g]
        s = qh @ kh.T * (1 / math.sqrt(d) if port.scale is None else port.scale)  # (m, d) x (d, n) -> (m, n)
        w = softmax(np.where(keep, s, -np.inf))
        if port.drop is not None:
            w = port.drop(w)
        out.append(w @ vh)  # (m, n) x (n, d) -> (m, d)
    return np.stack(out)


def weights_of(heads: int, kv: int, seed: int) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    return {"W_q": r.normal(size=(E, heads * D)) / 3, "W_k": r.normal(size=(E, kv * D)) / 3,
            "W_v": r.normal(size=(E, kv * D)) / 3, "W_o": r.normal(size=(heads * D, E)) / 3}


def layer_output(x: np.ndarray, memory: np.ndarray, w: dict[str, np.ndarray], heads: int, kv: int, port: Port) -> np.ndarray:
    """A layer by hand: Q = X W_q, K = Y W_k, V = Y W_v, split, each head attended, concatenated, times W_o."""
    q = (x @ w["W_q"]).reshape(len(x), heads, D).transpose(1, 0, 2)  # (T, H·d) -> (H, T, d)
    k = (memory @ w["W_k"]).reshape(len(memory), kv, D).transpose(1, 0, 2)  # (S, G·d) -> (G, S, d)
    v = (memory @ w["W_v"]).reshape(len(memory), kv, D).transpose(1, 0, 2)
    o = heads_attention(q, k, v, port, len(memory) - len(x))  # (H, T, d)
    return o.transpose(1, 0, 2).reshape(len(x), heads * D) @ w["W_o"]  # (T, H·d) x (H·d, E) -> (T, E)


def dropout(seed: int, p: float = 0.25) -> Callable[[np.ndarray], np.ndarray]:
    """nn.Dropout in training mode: each weight zeroed with probability p, the others times 1/(1 - p)."""
    return lambda w: np.where(np.random.default_rng([seed, *w.shape, int(1e6 * w[-1, 0])]).random(w.shape) < p, 0.0,
                              w / (1 - p))  # a mask of its own for each head (seeded by the weights it drops)


# (the port's mistake, the entry check must name); the correct port must match
MISTAKES: dict[str, tuple[Port, str]] = {
    "rope-q-only": (Port(rotate_k=False), "rope-q-only"),
    "rope-on-v": (Port(rotate_v=True), "rope-on-v"),
    "dropout-at-eval": (Port(drop=dropout(7)), "dropout-at-eval"),
    "sqrt-heads-width": (Port(scale=1 / math.sqrt(4 * D)), "sqrt-model-width"),  # a layer's √(H·d) is √d_k
}
SHAPES = [(4, 4), (4, 2)]  # (query heads, K/V heads)


def names(subject: Any, expected: np.ndarray) -> list[str]:
    verdict = check(subject, expected, tolerance=TOL)
    assert not verdict.match
    return sorted(e.name for e in verdict.explanations)


@pytest.mark.parametrize(("heads", "kv"), SHAPES, ids=["4-heads", "gqa-4-2"])
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_named_on_a_multi_head_layer(mistake: str, heads: int, kv: int) -> None:
    r = np.random.default_rng(1)
    x = r.normal(size=(T, E))
    w = weights_of(heads, kv, 2)
    layer = Layer.build(x, projections=Projections(**w), heads=heads,
                        options=Options(rope="half", causal=True, kv_heads=kv if kv != heads else None))
    assert check(layer, layer_output(x, x, w, heads, kv, Port()), tolerance=TOL).match  # no false alarm
    port, entry = MISTAKES[mistake]
    assert names(layer, layer_output(x, x, w, heads, kv, port)) == [entry]


def test_scaling_by_the_kv_heads_width_is_named_with_grouped_query_heads() -> None:
    """√(G·d): K's width before the head split (a port's 1/sqrt(k.size(-1)) taken too early); none with G = H."""
    heads, kv = 4, 2
    r = np.random.default_rng(12)
    x = r.normal(size=(T, E))
    w = weights_of(heads, kv, 13)
    layer = Layer.build(x, projections=Projections(**w), heads=heads, options=Options(rope="half", causal=True,
                                                                                     kv_heads=kv))
    assert names(layer, layer_output(x, x, w, heads, kv, Port(scale=1 / math.sqrt(kv * D)))) == ["sqrt-kv-width"]
    q, k, v = four_d(heads, kv)
    problem = Problem.build(q, k, v, options=Options(rope="half", causal=True))
    wrong = heads_attention(q[0], k[0], v[0], Port(scale=1 / math.sqrt(kv * D)), 0)[None]
    assert names(problem, wrong) == ["sqrt-kv-width"]
    mha = Layer.build(x, projections=Projections(**weights_of(heads, heads, 13)), heads=heads, options=Options(rope="half"))
    assert "sqrt-kv-width" in check(mha, np.zeros((T, E)), tolerance=TOL).skipped


@pytest.mark.parametrize(("heads", "kv"), SHAPES, ids=["4-heads", "gqa-4-2"])
def test_queries_rotated_from_zero_in_a_kv_cache_step_of_a_layer(heads: int, kv: int) -> None:
    r = np.random.default_rng(3)
    memory = r.normal(size=(7, E))  # the cache: every token so far
    x = memory[4:]  # the 3 new tokens, at positions 4, 5, 6
    w = weights_of(heads, kv, 4)
    layer = Layer.build(x, memory, projections=Projections(**w), heads=heads,
                        options=Options(rope="half", causal=True, causal_align="bottom-right",
                                        kv_heads=kv if kv != heads else None))
    assert check(layer, layer_output(x, memory, w, heads, kv, Port()), tolerance=TOL).match
    wrong = layer_output(x, memory, w, heads, kv, Port(q_positions_from_zero=True))
    assert names(layer, wrong) == ["rope-q-positions-not-offset"]


def four_d(heads: int, kv: int, m: int = T, n: int = T, seed: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    return r.normal(size=(1, heads, m, D)), r.normal(size=(1, kv, n, D)), r.normal(size=(1, kv, n, D))


@pytest.mark.parametrize(("heads", "kv"), SHAPES, ids=["4-heads", "gqa-4-2"])
@pytest.mark.parametrize("mistake", ["rope-q-only", "rope-on-v", "dropout-at-eval", "sqrt-heads-width",
                                     "rope-q-positions-not-offset"])
def test_each_mistake_is_named_on_4d_inputs(mistake: str, heads: int, kv: int) -> None:
    """4-D (B, H, T, d) inputs, K/V with 4 or 2 heads (`run q.npy k.npy v.npy` with 4-D arrays)."""
    offset = 4 if mistake == "rope-q-positions-not-offset" else 0
    q, k, v = four_d(heads, kv, m=T - offset)
    problem = Problem.build(q, k, v, options=Options(rope="half", causal=True, causal_align="bottom-right"))
    port = {"rope-q-only": Port(rotate_k=False), "rope-on-v": Port(rotate_v=True), "dropout-at-eval": Port(drop=dropout(8)),
            "sqrt-heads-width": Port(scale=1 / math.sqrt(heads * D)),
            "rope-q-positions-not-offset": Port(q_positions_from_zero=True)}[mistake]
    assert check(problem, heads_attention(q[0], k[0], v[0], Port(), offset)[None], tolerance=TOL).match
    assert names(problem, heads_attention(q[0], k[0], v[0], port, offset)[None]) == [mistake]


def test_rope_q_only_with_qk_norm_before_rope() -> None:
    """Qwen3's order (QK-norm, then RoPE): the port that rotates q alone still normalises both."""
    heads, kv = 4, 2
    r = np.random.default_rng(9)
    x = r.normal(size=(T, E))
    w = weights_of(heads, kv, 10)
    gains = {n: 1 + 0.3 * r.normal(size=D) for n in ("q_norm", "k_norm")}
    layer = Layer.build(x, projections=Projections(**w), heads=heads, q_norm=gains["q_norm"], k_norm=gains["k_norm"],
                        options=Options(rope="half", causal=True, kv_heads=kv, qk_norm="rms", norm_eps=1e-6))

    def out(rotate_k: bool) -> np.ndarray:
        q = (x @ w["W_q"]).reshape(T, heads, D).transpose(1, 0, 2)
        k = (x @ w["W_k"]).reshape(T, kv, D).transpose(1, 0, 2)
        v = (x @ w["W_v"]).reshape(T, kv, D).transpose(1, 0, 2)
        q = q / np.sqrt(np.mean(q ** 2, -1, keepdims=True) + 1e-6) * gains["q_norm"]  # Qwen3RMSNorm per head
        k = k / np.sqrt(np.mean(k ** 2, -1, keepdims=True) + 1e-6) * gains["k_norm"]
        o = heads_attention(q, k, v, Port(rotate_k=rotate_k), 0)
        return o.transpose(1, 0, 2).reshape(T, heads * D) @ w["W_o"]

    assert check(layer, out(True), tolerance=TOL).match
    assert names(layer, out(False)) == ["rope-q-only"]


# ---- the same mistakes in transformers' own Llama module (patched in), read as a checkpoint layer and by flags ----

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def llama(folder: Any) -> tuple[Any, Any]:
    """A tiny Llama checkpoint: 4 query heads, 2 K/V heads (grouped-query), head_dim 8, eager attention."""
    from hf_random import randomise

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8, max_position_embeddings=64, vocab_size=50,
                                   rms_norm_eps=1e-6, attention_dropout=0.25)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).eval()
    randomise(model, seed=11)
    model.save_pretrained(folder)
    return model, cfg


def hf_layer(model: Any, mistake: str | None, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, np.ndarray]:
    """Layer 1's attention input and output from transformers' LlamaAttention, with ``mistake`` patched into its
    module: RoPE on q alone, RoPE on v too, dropout left on (the module in training mode), √(H·d) scaling."""
    import transformers.models.llama.modeling_llama as hf

    attn = model.model.layers[1].self_attn
    tables: dict[str, Any] = {}
    rotate = hf.apply_rotary_pos_emb

    def rope_q_only(q: Any, k: Any, cos: Any, sin: Any, *a: Any, **kw: Any) -> Any:
        return rotate(q, k, cos, sin)[0], k

    def keep_tables(q: Any, k: Any, cos: Any, sin: Any, *a: Any, **kw: Any) -> Any:
        tables.update(cos=cos, sin=sin)
        return rotate(q, k, cos, sin)

    eager = hf.eager_attention_forward

    def rope_on_v(module: Any, query: Any, key: Any, value: Any, *a: Any, **kw: Any) -> Any:
        cos, sin = tables["cos"].unsqueeze(1), tables["sin"].unsqueeze(1)  # (B, 1, S, d): every K/V head
        return eager(module, query, key, value * cos + hf.rotate_half(value) * sin, *a, **kw)

    if mistake == "rope-q-only":
        monkeypatch.setattr(hf, "apply_rotary_pos_emb", rope_q_only)
    elif mistake == "rope-on-v":
        monkeypatch.setattr(hf, "apply_rotary_pos_emb", keep_tables)
        monkeypatch.setattr(hf, "eager_attention_forward", rope_on_v)  # LlamaAttention's default interface
    elif mistake == "dropout-at-eval":
        attn.train()  # eager_attention_forward: dropout=self.attention_dropout (0.25) while training
        torch.manual_seed(0)
    elif mistake == "sqrt-heads-width":
        monkeypatch.setattr(attn, "scaling", (4 * 8) ** -0.5)
    seen: dict[str, Any] = {}
    pre = attn.register_forward_pre_hook(lambda m, a, kw: seen.update(x=kw["hidden_states"]), with_kwargs=True)
    post = attn.register_forward_hook(lambda m, a, out: seen.update(y=out[0]))
    with torch.no_grad():
        model(torch.tensor([[1, 7, 3, 9, 4, 2]]))
    pre.remove()
    post.remove()
    attn.eval()
    return seen["x"][0].numpy(), seen["y"][0].numpy()


def cli(*args: str, cwd: Any) -> Any:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    r = subprocess.run([sys.executable, "-m", "attncli", "check", *args, "--format", "json"], capture_output=True,
                       text=True, env=env, cwd=cwd, timeout=300)
    doc = json.loads(r.stdout) if r.stdout else {}
    return r.returncode, sorted(e["name"] for e in doc.get("explanations", [])), r.stderr


@pytest.mark.parametrize("mistake", [None, "rope-q-only", "rope-on-v", "dropout-at-eval", "sqrt-heads-width"])
def test_each_mistake_in_transformers_llama_is_named_on_the_checkpoint_layer_and_by_flags(
        mistake: str | None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cfg = llama(tmp_path / "llama")
    x, y = hf_layer(model, mistake, monkeypatch)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    attn = model.model.layers[1].self_attn
    np.savez(tmp_path / "w.npz", **{f"W_{n}": getattr(attn, f"{n}_proj").weight.detach().numpy().T for n in "qkvo"})
    expected = {"sqrt-heads-width": ["sqrt-model-width"]}.get(str(mistake), [str(mistake)]) if mistake else []
    for args in (["--weights", "llama", "--layer", "1"],  # the checkpoint layer, and the same layer by flags
                 ["--weights", "w.npz", "--heads", "4", "--kv-heads", "2", "--rope", "half", "--causal"]):
        code, names, err = cli("y.npy", "x.npy", *args, cwd=tmp_path)
        assert (code, names) == ((1, expected) if mistake else (0, [])), (args, err[-300:])
