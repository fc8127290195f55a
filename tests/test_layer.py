"""The Layer (attncli.core.layer): projections as their own part that produces the core Problem.

References, independent of our code: X W + b split into heads in float64 numpy written here, the
RMSNorm formula written here, and torch.nn.MultiheadAttention (self and cross attention).
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
import torch
from torch import nn

from attncli.core.engine import produce, run
from attncli.core.layer import Layer
from attncli.core.problem import Options, Problem
from attncli.core.projections import Norm, Projections
from attncli.errors import InputError


def heads_of(a: np.ndarray, h: int) -> np.ndarray:
    """(B, T, h·d) -> (B, h, T, d): head i takes features i·d … (i + 1)·d - 1."""
    B, T, D = a.shape
    return a.reshape(B, T, h, D // h).transpose(0, 2, 1, 3)


def weights(rng: np.random.Generator, E: int, H: int, G: int, d: int) -> dict[str, np.ndarray]:
    return {"W_q": rng.normal(size=(E, H * d)), "W_k": rng.normal(size=(E, G * d)), "W_v": rng.normal(size=(E, G * d)),
            "b_q": rng.normal(size=H * d), "b_k": rng.normal(size=G * d), "b_v": rng.normal(size=G * d),
            "W_o": rng.normal(size=(H * d, E))}


def test_the_produced_problem_holds_q_k_v_split_into_heads() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 6))
    w = weights(rng, 6, 4, 2, 3)  # 4 query heads, 2 K/V heads (grouped-query), width 3
    layer = Layer.build(x, projections=Projections(**w), heads=4, mask=np.tril(np.ones((5, 5), bool)))
    p = produce(layer)
    assert isinstance(p, Problem)
    np.testing.assert_allclose(p.q, heads_of(x @ w["W_q"] + w["b_q"], 4), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p.k, heads_of(x @ w["W_k"] + w["b_k"], 2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p.v, heads_of(x @ w["W_v"] + w["b_v"], 2), rtol=1e-12, atol=1e-12)
    assert (p.head_count, p.kv_heads, p.n_rep, p.d_qk, p.batch_shape) == (4, 2, 2, 3, (2, 4))
    assert p.mask is not None and p.mask.shape == (5, 5)  # handed on as given (broadcast over batch and heads)


def test_the_pre_norm_comes_before_the_projection() -> None:
    rng = np.random.default_rng(1)
    h = rng.normal(size=(1, 4, 6)) * 3 + 1
    w = weights(rng, 6, 2, 2, 3)
    g = rng.normal(size=6)
    layer = Layer.build(h, projections=Projections(**w), heads=2, pre_norm=Norm("rms", g, eps=1e-5))
    xn = h / np.sqrt(np.mean(h ** 2, axis=-1, keepdims=True) + 1e-5) * g  # RMSNorm: w · x / rms
    np.testing.assert_allclose(produce(layer).q, heads_of(xn @ w["W_q"] + w["b_q"], 2), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["layernorm", "rms1p"])
def test_each_pre_norm_kind_is_its_own_formula(kind: str) -> None:
    rng = np.random.default_rng(2)
    h = rng.normal(size=(1, 4, 6)) * 3 + 1
    w = weights(rng, 6, 2, 2, 3)
    g, b = rng.normal(size=6), rng.normal(size=6)
    if kind == "layernorm":  # torch's own LayerNorm as the reference
        ln = nn.LayerNorm(6, eps=1e-5, dtype=torch.float64)
        with torch.no_grad():
            ln.weight.copy_(torch.from_numpy(g))
            ln.bias.copy_(torch.from_numpy(b))
            xn = ln(torch.from_numpy(h)).numpy()
        norm = Norm("layernorm", g, b, eps=1e-5)
    else:  # Gemma's RMSNorm, (1 + w) · x / rms, written here
        xn = h / np.sqrt(np.mean(h ** 2, axis=-1, keepdims=True) + 1e-5) * (1 + g)
        norm = Norm("rms1p", g, eps=1e-5)
    layer = Layer.build(h, projections=Projections(**w), heads=2, pre_norm=norm)
    np.testing.assert_allclose(produce(layer).q, heads_of(xn @ w["W_q"] + w["b_q"], 2), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["layernorm1p", "rmsnorm", "LayerNorm", ""])
def test_a_norm_kind_the_engine_does_not_compute_is_refused(kind: str) -> None:
    # before: any kind but "layernorm" was computed as an RMSNorm, silently (a library caller's Norm("layernorm1p"))
    with pytest.raises(InputError, match="not computed"):
        Norm(kind, np.ones(6))


def test_problem_holds_no_layer_inputs() -> None:
    names = {f.name for f in fields(Problem)}
    assert not names & {"x", "memory", "values", "projections", "pre_norm", "heads", "batch_first"}
    assert {"x", "memory", "values", "projections", "pre_norm", "heads"} <= {f.name for f in fields(Layer)}


def test_a_layer_is_frozen_and_replace_recomputes_derived_fields() -> None:
    rng = np.random.default_rng(2)
    w = weights(rng, 6, 4, 2, 3)
    layer = Layer.build(rng.normal(size=(5, 6)), projections=Projections(**w), heads=4)
    with pytest.raises(AttributeError):
        layer.heads = 2  # type: ignore[misc]
    assert (layer.kv_heads, layer.batched, layer.axis_names) == (2, False, ("", "head"))
    tiled = replace(layer, projections=replace(layer.projections, W_k=np.tile(w["W_k"], (1, 2)),
                                               W_v=np.tile(w["W_v"], (1, 2)), b_k=None, b_v=None))
    assert tiled.kv_heads is None  # derived from W_k's width again


@pytest.mark.parametrize("cross", [False, True])
def test_self_and_cross_attention_match_nn_multiheadattention(cross: bool) -> None:
    torch.manual_seed(0)
    E, H = 8, 2
    mha = nn.MultiheadAttention(E, H, batch_first=True).double().eval()
    sd = {k: v.detach().numpy() for k, v in mha.state_dict().items()}
    W = np.split(sd["in_proj_weight"], 3)
    b = np.split(sd["in_proj_bias"], 3)
    proj = Projections(W_q=W[0].T, W_k=W[1].T, W_v=W[2].T, b_q=b[0], b_k=b[1], b_v=b[2],
                       W_o=sd["out_proj.weight"].T, b_o=sd["out_proj.bias"])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 4, E))
    y = rng.normal(size=(2, 6, E)) if cross else x
    pad = np.zeros((2, y.shape[1]), bool)
    pad[1, -2:] = True
    layer = Layer.build(x, None if not cross else y, projections=proj, heads=H, padding=pad,
                        options=Options(dtype="float64"))
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    out, avg = mha(tx, ty, ty, key_padding_mask=torch.from_numpy(pad))
    trace = run(layer)
    np.testing.assert_allclose(trace["output"], out.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trace["avg_weights"], avg.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_layer_checks_name_the_input() -> None:
    rng = np.random.default_rng(4)
    w = weights(rng, 6, 2, 2, 3)
    with pytest.raises(InputError) as e:
        Layer.build(rng.normal(size=(2, 4, 6)), rng.normal(size=(3, 4, 6)), projections=Projections(**w), heads=2,
                    sources={"k": "memory.npy"})
    assert e.value.source == "memory.npy"
    with pytest.raises(InputError) as e:
        Layer.build(rng.normal(size=(2, 4, 6)), projections=Projections(**w), heads=2, padding=np.zeros((2, 5), bool),
                    sources={"key_padding_mask": "pad.npy"})
    assert e.value.source == "pad.npy"
