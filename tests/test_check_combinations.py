"""`check` names combinations (issue 32, item 5), each case against an independent reference:

- several forgotten options at once: an output computed by hand with HF's rotate_half RoPE and a causal mask,
  checked with neither option: the hint names both;
- a window on both sides with transformers' own ``sliding_window_bidirectional_mask_function(W)`` (|i - j| <= W):
  window-not-causal plus the window's off-by-one, one entry;
- a sliding window whose causal bound was dropped (a plain loop: keys j > i - W kept, every later key visible);
- QK-norm over the width as ports write it (RMS over H·d, the per-head weight tiled): named for a problem given by
  flags (``self X --heads 4 --qk-norm rms --weights W.npz``) and for a Qwen3 checkpoint layer alike, both against
  transformers' Qwen3 modules with their q_norm/k_norm applied over the width;
- no false alarm: where the plain problem matches, nothing is named; where no combination reproduces the numbers,
  no combination is named.

Each CLI case: the arguments, the exit code, the words the output must name and must not name; the child runs
under a memory cap.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
MEMORY_CAP = 3 << 30  # bytes of address space for each child (torch's own start-up needs well under this)


def _cap() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def attncli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "attncli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, preexec_fn=_cap)


def named(r: subprocess.CompletedProcess[str]) -> tuple[list[str], list[str | None]]:
    doc = json.loads(r.stdout)
    return [e["name"] for e in doc["explanations"]], [e["option"] for e in doc["explanations"]]


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """softmax(q·kᵀ/√d, the keys keep drops at -inf)·v, float64."""
    s = q @ k.T / math.sqrt(q.shape[-1])  # (m, d) x (d, n) -> (m, n)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    return softmax(s) @ v


def rope_half(a: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """HF's rotate_half RoPE (LlamaRotaryEmbedding, apply_rotary_pos_emb) at positions 0.., in float64."""
    n, d = a.shape
    ang = np.arange(n)[:, None] * (1.0 / base ** (np.arange(0, d, 2) / d))[None]  # (n, d/2)
    emb = np.concatenate([ang, ang], -1)
    return a * np.cos(emb) + np.concatenate([-a[:, d // 2:], a[:, :d // 2]], -1) * np.sin(emb)


def qkv(tmp: Path, m: int = 7, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    r = np.random.default_rng(seed)
    q, k, v = r.normal(size=(m, d)), r.normal(size=(m, d)), r.normal(size=(m, d))
    for n, a in zip("qkv", (q, k, v)):
        np.save(tmp / f"{n}.npy", a)
    return q, k, v, ["q.npy", "k.npy", "v.npy"]


# ---- several forgotten options at once --------------------------------------------------------------------


def forgotten_cases() -> dict[str, tuple[Any, list[str], set[str], list[str]]]:
    """name: (the output by hand from q, k, v, the options it was computed with, the entries named, words the hint
    must not hold)."""
    T = 7
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    slope = 2.0 ** -8  # ALiBi's one head: 2^(-8/H) (Press et al.; HF build_alibi_tensor)

    def rope_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return attention(rope_half(q), rope_half(k), v, j <= i)

    def causal_unscaled_alibi(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        s = q @ k.T + slope * (j - i)  # no 1/√d; the bias slope·(j - i)
        return softmax(np.where(j <= i, s, -np.inf)) @ v

    return {
        "--rope half --causal": (rope_causal, ["--rope", "half", "--causal"], {"causal-added", "rope-added"},
                                 ["--alibi", "--scaling", "interleaved"]),
        "--causal --scaling none --alibi": (causal_unscaled_alibi, ["--causal", "--scaling", "none", "--alibi"],
                                            {"causal-added", "no-scaling", "alibi-added"}, ["--rope"]),
    }


@pytest.mark.parametrize("case", list(forgotten_cases()))
def test_forgotten_options_are_named_together(case: str, tmp_path: Path) -> None:
    by_hand, flags, entries, not_hinted = forgotten_cases()[case]
    q, k, v, files = qkv(tmp_path)
    np.save(tmp_path / "y.npy", by_hand(q, k, v))
    r = attncli("check", "y.npy", *files, "--format", "json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    names, options = named(r)
    assert [set(n.split(" + ")) for n in names] == [entries], names  # the catalogue entries the set is made of
    hint = options[0] or ""
    for word in case.split("--")[1:]:  # every option named in the hint
        assert f"--{word.strip()}" in hint, (word, hint)
    for word in not_hinted:
        assert word not in hint, (word, hint)
    # the same numbers checked with those options: a match, nothing named
    r = attncli("check", "y.npy", *files, *flags, "--format", "json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["explanations"] == [], r.stdout[-300:]


def test_no_combination_is_named_where_none_reproduces_the_numbers(tmp_path: Path) -> None:
    q, k, v, files = qkv(tmp_path, seed=1)
    y = attention(q, k, v) + np.random.default_rng(9).normal(scale=0.05, size=(7, 8))  # no option makes this
    np.save(tmp_path / "y.npy", y)
    r = attncli("check", "y.npy", *files, "--format", "json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["explanations"] == [], doc["explanations"]
    assert "forgotten options together" in doc["search"]


# ---- the sliding window's combinations --------------------------------------------------------------------


def hf_bidirectional_keep(T: int, W: int) -> np.ndarray:
    """transformers' own sliding_window_bidirectional_mask_function(W), evaluated cell by cell."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    fn = masking_utils.sliding_window_bidirectional_mask_function(W)
    return np.array([[bool(fn(0, 0, torch.tensor(i), torch.tensor(j))) for j in range(T)] for i in range(T)])


def lower_bound_only_keep(T: int, W: int) -> np.ndarray:
    """A sliding window whose causal bound was dropped: a plain loop, key j kept when j > i - W."""
    keep = np.zeros((T, T), bool)
    for i in range(T):
        for j in range(T):
            keep[i, j] = j > i - W
    return keep


WINDOW_CASES = [  # (the keep-mask the expected numbers were computed with, the entry that must be named)
    ("bidirectional", "window-not-causal-off-by-one"),
    ("lower-bound-only", "window-causal-bound-dropped"),
]


@pytest.mark.parametrize(("kind", "entry"), WINDOW_CASES)
@pytest.mark.parametrize("extra", [[], ["--causal"]], ids=["window", "window-causal"])
def test_window_combinations_are_named(kind: str, entry: str, extra: list[str], tmp_path: Path) -> None:
    T, W = 9, 3
    q, k, v, files = qkv(tmp_path, m=T, d=4, seed=2)
    keep = hf_bidirectional_keep(T, W) if kind == "bidirectional" else lower_bound_only_keep(T, W)
    np.save(tmp_path / "y.npy", attention(q, k, v, keep))
    r = attncli("check", "y.npy", *files, "--window", str(W), *extra, "--format", "json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    names, _ = named(r)
    assert names == [entry], names
    # the window as HF means it (causal, j > i - W) matches: nothing named
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    np.save(tmp_path / "ok.npy", attention(q, k, v, (j <= i) & (j > i - W)))
    r = attncli("check", "ok.npy", *files, "--window", str(W), "--format", "json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["explanations"] == []


@pytest.mark.parametrize(("kind", "entry"), WINDOW_CASES)
def test_window_combinations_are_named_for_a_multi_head_layer(kind: str, entry: str) -> None:
    from attncli.check.verdict import Tolerance, check
    from attncli.core.layer import Layer
    from attncli.core.options import Options
    from attncli.core.projections import Projections

    r = np.random.default_rng(4)
    T, E, H, W = 9, 8, 2, 3
    x = r.normal(size=(1, T, E))
    w = {n: r.normal(size=(E, E)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}

    def by_hand(keep: np.ndarray) -> np.ndarray:  # each head's attention, concatenated, through W_o
        q, k, v = x[0] @ w["W_q"], x[0] @ w["W_k"], x[0] @ w["W_v"]  # (T, E) x (E, E) -> (T, E)
        heads = [attention(q[:, h * 4:(h + 1) * 4], k[:, h * 4:(h + 1) * 4], v[:, h * 4:(h + 1) * 4], keep)
                 for h in range(H)]
        return (np.concatenate(heads, -1) @ w["W_o"])[None]

    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    layer = Layer.build(x, projections=Projections(**w), heads=H, options=Options(window=W, causal=True))
    tol = Tolerance(1e-9, 1e-9, "float64 by hand")
    assert check(layer, by_hand((j <= i) & (j > i - W)), tolerance=tol).match  # HF's window: no false alarm
    keep = hf_bidirectional_keep(T, W) if kind == "bidirectional" else lower_bound_only_keep(T, W)
    assert [e.name for e in check(layer, by_hand(keep), tolerance=tol).explanations] == [entry]


# ---- QK-norm over the width, for flags and for checkpoint layers alike ------------------------------------


class WidthNorm(torch.nn.Module):  # type: ignore[misc]
    """A port's QK-norm: Qwen3RMSNorm over the H·d features of a token, its per-head weight tiled over the heads."""

    def __init__(self, per_head: Any, heads: int, eps: float) -> None:
        super().__init__()
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        d = per_head.weight.shape[0]
        self.norm = Qwen3RMSNorm(heads * d, eps=eps)
        with torch.no_grad():
            self.norm.weight.copy_(per_head.weight.repeat(heads))

    def forward(self, x: Any) -> Any:  # (B, T, H, d) -> (B, T, H, d), as Qwen3Attention hands q and k to its norms
        return self.norm(x.reshape(*x.shape[:-2], -1)).reshape(x.shape)


def qwen3(folder: Path) -> tuple[Any, Any]:
    transformers = pytest.importorskip("transformers")
    from hf_random import randomise

    cfg = transformers.Qwen3Config(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=8, max_position_embeddings=64, vocab_size=50,
                                   rms_norm_eps=1e-6)
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    randomise(model, seed=5)
    model.save_pretrained(folder)
    return model, cfg


def run_layer(model: Any, cfg: Any, layer: int, x_ids: Any, width: bool) -> tuple[np.ndarray, np.ndarray]:
    """Layer ``layer``'s attention input and output (``width``: its q_norm/k_norm applied over the width)."""
    attn = model.model.layers[layer].self_attn
    if width:
        attn.q_norm = WidthNorm(attn.q_norm, cfg.num_attention_heads, cfg.rms_norm_eps)
        attn.k_norm = WidthNorm(attn.k_norm, cfg.num_key_value_heads, cfg.rms_norm_eps)
    seen: dict[str, Any] = {}
    def before(module: Any, args: Any, kwargs: Any) -> None:
        seen["x"] = kwargs["hidden_states"]

    def after(module: Any, args: Any, out: Any) -> None:
        seen["y"] = out[0]

    pre = attn.register_forward_pre_hook(before, with_kwargs=True)
    post = attn.register_forward_hook(after)
    with torch.no_grad():
        model(x_ids)
    pre.remove()
    post.remove()
    return seen["x"][0].double().numpy(), seen["y"][0].double().numpy()


def test_qk_norm_over_the_width_is_named_on_a_checkpoint_layer(tmp_path: Path) -> None:
    model, cfg = qwen3(tmp_path / "qwen3")
    ids = torch.tensor([[1, 7, 3, 9, 4, 2]])
    for width in (False, True):  # the model itself (a match: no false alarm), then the port
        x, y = run_layer(model, cfg, 1, ids, width)
        np.save(tmp_path / "x.npy", x.astype(np.float32))
        np.save(tmp_path / "y.npy", y.astype(np.float32))
        r = attncli("check", "y.npy", "x.npy", "--weights", "qwen3", "--layer", "1", "--format", "json", cwd=tmp_path)
        assert r.returncode == (1 if width else 0), r.stdout[-400:] + r.stderr
    names, _ = named(r)
    assert names == ["qk-norm-model-width"], names
    # the same layer given by flags (its weights in textbook form, Q = X @ W_q): the same entries apply, the same one
    # is named (every variant that applies to a checkpoint layer applies to the problem given by flags, and back)
    attn = model.model.layers[1].self_attn
    np.savez(tmp_path / "w.npz", **{f"W_{n}": getattr(attn, f"{n}_proj").weight.detach().double().numpy().T
                                    for n in "qkvo"},
             q_norm=attn.q_norm.norm.weight.detach().double().numpy()[:cfg.head_dim],
             k_norm=attn.k_norm.norm.weight.detach().double().numpy()[:cfg.head_dim])
    flags = attncli("check", "y.npy", "x.npy", "--weights", "w.npz", "--heads", "4", "--kv-heads", "2", "--qk-norm",
                    "rms", "--norm-eps", "1e-6", "--rope", "half", "--causal", "--format", "json", cwd=tmp_path)
    assert flags.returncode == 1, flags.stderr
    assert named(flags)[0] == ["qk-norm-model-width"]
    ours, theirs = json.loads(r.stdout), json.loads(flags.stdout)
    assert ours["variants_tried"] == theirs["variants_tried"]
    assert not [k for k, why in {**ours["variants_skipped"], **theirs["variants_skipped"]}.items()
                if why.startswith("failed")]


def test_qk_norm_over_the_width_is_named_for_flags(tmp_path: Path) -> None:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    H, d, E, T = 4, 4, 16, 5
    g = torch.Generator().manual_seed(3)
    x = torch.randn(T, E, generator=g, dtype=torch.float64)
    w = {n: torch.randn(E, H * d, generator=g, dtype=torch.float64) / 4 for n in ("W_q", "W_k", "W_v")}
    w["W_o"] = torch.randn(H * d, E, generator=g, dtype=torch.float64) / 4
    per_head = {n: 1 + 0.5 * (2 * torch.rand(d, generator=g, dtype=torch.float64) - 1) for n in ("q_norm", "k_norm")}
    np.savez(tmp_path / "w.npz", **{n: a.numpy() for n, a in {**w, **per_head}.items()})
    np.save(tmp_path / "x.npy", x.numpy())

    def out(width: bool) -> np.ndarray:
        a = {"q": x @ w["W_q"], "k": x @ w["W_k"], "v": x @ w["W_v"]}  # (T, E) x (E, H·d) -> (T, H·d)
        for n in ("q", "k"):
            norm = Qwen3RMSNorm(H * d if width else d, eps=1e-6).double()
            with torch.no_grad():
                norm.weight.copy_(per_head[f"{n}_norm"].repeat(H) if width else per_head[f"{n}_norm"])
                # width: RMS over the H·d features, the weight tiled; else Qwen3's own, per head
                a[n] = norm(a[n]) if width else norm(a[n].view(T, H, d)).reshape(T, H * d)
        heads = [torch.nn.functional.scaled_dot_product_attention(  # (1, T, d) each head
            a["q"][None, :, h * d:(h + 1) * d], a["k"][None, :, h * d:(h + 1) * d], a["v"][None, :, h * d:(h + 1) * d])[0]
            for h in range(H)]
        return (torch.cat(heads, -1) @ w["W_o"]).detach().numpy()

    flags = ["x.npy", "--heads", str(H), "--qk-norm", "rms", "--weights", "w.npz", "--format", "json"]
    np.save(tmp_path / "plain.npy", out(False))
    r = attncli("check", "plain.npy", *flags, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-500:] + r.stderr  # the per-head norm is this problem: no false alarm
    np.save(tmp_path / "wide.npy", out(True))
    r = attncli("check", "wide.npy", *flags, cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    names, _ = named(r)
    assert names == ["qk-norm-model-width"], names
