"""nanoGPT's ckpt.pt (issue 20): heads from the model_args saved beside the state dict; without them,
refused with a request for --heads, never computed with one head. Reference: causal multi-head attention
written out in float64 with numpy (nanoGPT's CausalSelfAttention: c_attn = [Q; K; V] rows, scale 1/sqrt(d))."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app

torch = pytest.importorskip("torch")
runner = CliRunner()
E, H, T = 16, 4, 6


def _reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, wo: np.ndarray, bo: np.ndarray) -> np.ndarray:
    qkv = x @ w.T + b  # (T, 3E): nn.Linear (3E, E)
    d = E // H
    out = np.zeros((T, E))
    for h in range(H):
        q, k, v = (qkv[:, i * E + h * d: i * E + (h + 1) * d] for i in range(3))
        s = q @ k.T / np.sqrt(d)
        s[np.triu_indices(T, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h * d:(h + 1) * d] = (p / p.sum(1, keepdims=True)) @ v
    return out @ wo.T + bo


def _ckpt(path: Path, with_args: bool) -> tuple[np.ndarray, ...]:
    g = np.random.default_rng(3)
    w, b = g.normal(size=(3 * E, E)) / 4, g.normal(size=3 * E) / 2
    wo, bo = g.normal(size=(E, E)) / 4, g.normal(size=E) / 2
    sd = {"transformer.h.0.attn.c_attn.weight": w, "transformer.h.0.attn.c_attn.bias": b,
          "transformer.h.0.attn.c_proj.weight": wo, "transformer.h.0.attn.c_proj.bias": bo}
    obj: dict[str, object] = {"model": {k: torch.tensor(v, dtype=torch.float32) for k, v in sd.items()},
                              "iter_num": 10}
    if with_args:
        obj["model_args"] = {"n_layer": 1, "n_head": H, "n_embd": E, "block_size": 8, "bias": True, "vocab_size": 5}
    torch.save(obj, path)
    return tuple(np.asarray(torch.tensor(v, dtype=torch.float32), np.float64) for v in (w, b, wo, bo))


def test_nanogpt_heads_from_model_args(tmp_path: Path) -> None:
    w, b, wo, bo = _ckpt(tmp_path / "ckpt.pt", True)
    x = np.random.default_rng(4).normal(size=(T, E)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "ckpt.pt"), "--layer", "0",
                              "--format", "json"])
    assert res.exit_code == 0, res.stderr
    out = np.array(json.loads(res.stdout)["output"])
    np.testing.assert_allclose(out, _reference(x.astype(np.float64), w, b, wo, bo), atol=1e-5)


def test_nanogpt_without_model_args_asks_for_heads(tmp_path: Path) -> None:
    _ckpt(tmp_path / "ckpt.pt", False)
    np.save(tmp_path / "x.npy", np.zeros((T, E), np.float32))
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "ckpt.pt"), "--layer", "0"])
    assert res.exit_code == 2, (res.exit_code, res.stdout[-200:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--heads" in lines[0]
