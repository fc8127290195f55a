"""``check`` for implementers: the mistakes of today's attention, precision-aware verdicts, pairs of mistakes.

Every expected array here is computed IN THIS FILE, independently of attncli: plain numpy float64 loops,
or PyTorch's own functions (``scaled_dot_product_attention``, ``torch.softmax`` in float16), with the
mistake applied. The correct implementation (the same reference without the mistake) must pass.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from halfbounds import assert_rounds_as
from typer.testing import CliRunner

from attncli.check.verdict import Tolerance, check
from attncli.cli import app
from attncli.core.layer import Layer
from attncli.core.problem import Options, Problem
from attncli.core.projections import Projections

torch = pytest.importorskip("torch")
F = torch.nn.functional
runner = CliRunner()
TOL = Tolerance(1e-9, 1e-9, "test")


def softmax(s: np.ndarray) -> np.ndarray:
    out = np.zeros_like(s)
    for idx in np.ndindex(s.shape[:-1]):  # row by row, a row of only -inf gives zeros
        row = s[idx]
        if np.all(np.isneginf(row)):
            continue
        e = np.exp(row - row.max())
        out[idx] = e / e.sum()
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray | None = None, scale: float | None = None,
              fill: float = -np.inf) -> np.ndarray:
    """softmax(q·k / √d) v with the keys keep excludes set to ``fill``, one row at a time."""
    s = np.einsum("...id,...jd->...ij", q, k) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if keep is not None:
        s = np.where(keep, s, fill)
    return softmax(s) @ v


def causal_keep(m: int, n: int, offset: int) -> np.ndarray:
    """Query i sees key j when j <= i + offset (offset n - m: bottom-right, the KV cache)."""
    return np.array([[j <= i + offset for j in range(n)] for i in range(m)])


def sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, **kw: object) -> np.ndarray:
    t = [torch.from_numpy(a) for a in (q, k, v)]
    return F.scaled_dot_product_attention(*t, **kw).numpy()  # type: ignore[arg-type]


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


def names(problem: Problem, expected: np.ndarray, tol: Tolerance = TOL) -> set[frozenset[str]]:
    """Each explanation as the set of its mistakes (a pair 'a + b' is {a, b})."""
    verdict = check(problem, expected, tolerance=tol)
    assert not verdict.match, "the expected numbers must differ from the correct ones"
    return {frozenset(e.name.split(" + ")) for e in verdict.explanations}


def one(name: str) -> set[frozenset[str]]:
    return {frozenset([name])}


def build(q: np.ndarray, k: np.ndarray, v: np.ndarray, **kw: object) -> Problem:
    opts = {key: kw.pop(key) for key in list(kw) if key in Options.field_names()}
    return Problem.build(q, k, v, options=Options().merged(opts), **kw)  # type: ignore[arg-type]


# ---- each new entry of the catalogue: (problem, the mistaken reference, the correct reference) ----------

def case_causal_missing() -> tuple[Problem, np.ndarray, np.ndarray]:
    q, k, v = rand(2, 5, 4), rand(2, 5, 4, seed=1), rand(2, 5, 3, seed=2)
    return build(q, k, v, causal=True), sdpa(q, k, v), sdpa(q, k, v, is_causal=True)


def case_causal_added() -> tuple[Problem, np.ndarray, np.ndarray]:
    q, k, v = rand(5, 4), rand(5, 4, seed=1), rand(5, 3, seed=2)
    return build(q, k, v), sdpa(q, k, v, is_causal=True), sdpa(q, k, v)


def case_causal_added_bottom_right() -> tuple[Problem, np.ndarray, np.ndarray]:
    q, k, v = rand(2, 4), rand(7, 4, seed=1), rand(7, 3, seed=2)  # 2 new queries, 5 cached keys
    return build(q, k, v), attention(q, k, v, causal_keep(2, 7, 5)), sdpa(q, k, v)


def case_q_offset_missing() -> tuple[Problem, np.ndarray, np.ndarray]:
    # the KV-cache bug: 3 new queries after 4 cached keys, computed with SDPA is_causal (top-left)
    q, k, v = rand(3, 4), rand(7, 4, seed=1), rand(7, 3, seed=2)
    return (build(q, k, v, causal=True, causal_align="bottom-right"), sdpa(q, k, v, is_causal=True),
            attention(q, k, v, causal_keep(3, 7, 4)))


def case_causal_bottom_right() -> tuple[Problem, np.ndarray, np.ndarray]:
    q, k, v = rand(3, 4), rand(7, 4, seed=1), rand(7, 3, seed=2)
    return build(q, k, v, causal=True), attention(q, k, v, causal_keep(3, 7, 4)), sdpa(q, k, v, is_causal=True)


def case_valid_lens_ignored() -> tuple[Problem, np.ndarray, np.ndarray]:
    q, k, v = rand(2, 4, 4), rand(2, 6, 4, seed=1), rand(2, 6, 3, seed=2)
    keep = np.array([[j < n for j in range(6)] for n in (2, 5)])[:, None, :]  # (2, 1, 6): d2l valid lengths
    return build(q, k, v, valid_lens=np.array([2, 5])), attention(q, k, v), attention(q, k, v, keep)


def case_mask_ignored() -> tuple[Problem, np.ndarray, np.ndarray]:
    q, k, v = rand(4, 4), rand(6, 4, seed=1), rand(6, 3, seed=2)
    mask = np.random.default_rng(3).random((4, 6)) < 0.6
    mask[:, 0] = True
    return build(q, k, v, mask=mask), sdpa(q, k, v), sdpa(q, k, v, attn_mask=torch.from_numpy(mask))


def case_mask_fill_1e9() -> tuple[Problem, np.ndarray, np.ndarray]:
    # the notes' score + mask·-1e9 (an additive fill): a fully padded row gets uniform weights, not zeros
    q, k, v = rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 3, seed=2)
    keep = np.array([[j < n for j in range(5)] for n in (0, 3)])[:, None, :]
    return (build(q, k, v, valid_lens=np.array([0, 3])), attention(q, k, v, keep, fill=-1e9),
            attention(q, k, v, keep))


def case_mask_fill_finfo_min() -> tuple[Problem, np.ndarray, np.ndarray]:
    # HF's masked_fill(torch.finfo(dtype).min), in torch float32
    q, k, v = rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 3, seed=2)
    keep = np.array([[j < n for j in range(5)] for n in (3, 0)])[:, None, :]
    qt, kt, vt = (torch.from_numpy(a).float() for a in (q, k, v))
    s = (qt @ kt.transpose(-1, -2) / 2.0).masked_fill(~torch.from_numpy(keep), torch.finfo(torch.float32).min)
    expected = (torch.softmax(s, -1) @ vt).double().numpy()
    return build(q, k, v, valid_lens=np.array([3, 0])), expected, attention(q, k, v, keep)


def case_softmax_in_float16() -> tuple[Problem, np.ndarray, np.ndarray]:
    # query 1 scores keys 0 and 1 at 1000 and 1000.3: float16 steps by 0.5 there, so their weights move
    q, k, v = rand(3, 4), rand(5, 4, seed=1), rand(5, 2, seed=2)
    q[1] = [1000.0, 0, 0, 0]
    k[0, 0], k[1, 0] = 2.0, 2.0006
    s = torch.from_numpy(q @ k.T / 2.0)
    expected = torch.softmax(s.half(), -1).double().numpy() @ v
    return build(q, k, v), expected, sdpa(q, k, v)


def case_scale_ignored() -> tuple[Problem, np.ndarray, np.ndarray]:
    # Gemma 2: scale query_pre_attn_scalar^-½ (here 144) although the head width is 4
    q, k, v = rand(4, 4), rand(5, 4, seed=1), rand(5, 3, seed=2)
    return build(q, k, v, scale=144 ** -0.5), sdpa(q, k, v), sdpa(q, k, v, scale=144 ** -0.5)


def mha(x: np.ndarray, w: dict[str, np.ndarray], heads: int, scale: float | None = None,
        padding: np.ndarray | None = None) -> np.ndarray:
    """Multi-head attention written out head by head (float64)."""
    q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]
    dh = q.shape[-1] // heads
    keep = None if padding is None else ~padding[:, None, :]  # (B, 1, S): True = ignore, as PyTorch
    outs = [attention(q[..., h * dh:(h + 1) * dh], k[..., h * dh:(h + 1) * dh], v[..., h * dh:(h + 1) * dh], keep, scale)
            for h in range(heads)]
    return np.concatenate(outs, axis=-1) @ w["W_o"]


def mh_weights(d_model: int, d: int, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"W_q": rng.normal(size=(d_model, d)) / math.sqrt(d_model), "W_k": rng.normal(size=(d_model, d)) / math.sqrt(d_model),
            "W_v": rng.normal(size=(d_model, d)) / math.sqrt(d_model), "W_o": rng.normal(size=(d, d_model)) / math.sqrt(d)}


def case_query_pre_attn_scalar() -> tuple[Problem, np.ndarray, np.ndarray]:
    # model width 12, 2 heads of width 4: Gemma 2's query_pre_attn_scalar = 12 / 2 = 6, not the head width 4
    x, w = rand(2, 5, 12, seed=6), mh_weights(12, 8)
    problem = Layer.build(x, projections=Projections(**w), heads=2)
    return problem, mha(x, w, 2, scale=6 ** -0.5), mha(x, w, 2)


def case_key_padding_ignored() -> tuple[Problem, np.ndarray, np.ndarray]:
    x, w = rand(2, 5, 8, seed=7), mh_weights(8, 8)
    pad = np.zeros((2, 5), bool)
    pad[0, 3:] = pad[1, 1] = True
    problem = Layer.build(x, projections=Projections(**w), heads=2, padding=pad)
    return problem, mha(x, w, 2), mha(x, w, 2, padding=pad)


CASES = {
    "causal-missing": case_causal_missing,
    "causal-added": case_causal_added,
    "causal-added-bottom-right": case_causal_added_bottom_right,
    "q-offset-missing": case_q_offset_missing,
    "causal-bottom-right": case_causal_bottom_right,
    "valid-lens-ignored": case_valid_lens_ignored,
    "mask-ignored": case_mask_ignored,
    "mask-value-1e6": case_mask_fill_1e9,
    "softmax-in-float16": case_softmax_in_float16,
    "scale-ignored": case_scale_ignored,
    "query-pre-attn-scalar": case_query_pre_attn_scalar,
    "key-padding-ignored": case_key_padding_ignored,
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_mistake_is_named_and_the_correct_implementation_passes(name: str) -> None:
    problem, mistaken, correct = CASES[name]()
    tol = Tolerance(2e-3, 0.0, "float16 softmax") if name == "softmax-in-float16" else TOL
    assert check(problem, correct, tolerance=tol).match
    assert names(problem, mistaken, tol) == one(name)


def test_finfo_min_fill_is_named_as_a_finite_fill() -> None:
    problem, mistaken, correct = case_mask_fill_finfo_min()
    tol = Tolerance(1e-6, 1e-6, "float32")
    assert check(problem, correct, tolerance=tol).match
    assert names(problem, mistaken, tol) == one("mask-value-1e6")


# ---- pairs of mistakes -----------------------------------------------------------------------------------

def pair_cases() -> dict[str, tuple[Problem, np.ndarray, set[str]]]:
    q, k, v = rand(5, 4), rand(5, 4, seed=1), rand(5, 3, seed=2)
    qc, kc, vc = rand(3, 4), rand(7, 4, seed=1), rand(7, 3, seed=2)
    lens = np.array([2, 4])
    qb, kb, vb = rand(2, 4, 4, seed=3), rand(2, 6, 4, seed=4), rand(2, 6, 3, seed=5)
    mask = np.random.default_rng(3).random((5, 5)) < 0.5
    mask[:, 0] = mask[:, 1] = True
    mask[:, 2] = False
    x, w = rand(2, 5, 8, seed=7), mh_weights(8, 8)
    h = 2
    dh = 4
    xq, xk, xv = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]
    # causal mask missing and heads merged without the transpose: (B, H, T, dh) read as (B, T, H·dh)
    stacked = np.stack([attention(xq[..., i * dh:(i + 1) * dh], xk[..., i * dh:(i + 1) * dh], xv[..., i * dh:(i + 1) * dh])
                        for i in range(h)], axis=1)
    untransposed = stacked.reshape(2, 5, 8) @ w["W_o"]
    return {
        "no scaling, no causal mask": (build(q, k, v, causal=True), attention(q, k, v, scale=1.0),
                                       {"no-scaling", "causal-missing"}),
        "KV cache top-left, no scaling": (build(qc, kc, vc, causal=True, causal_align="bottom-right"),
                                          sdpa(qc, kc, vc, is_causal=True, scale=1.0), {"q-offset-missing", "no-scaling"}),
        "valid lengths ignored, divided by d": (build(qb, kb, vb, valid_lens=lens), attention(qb, kb, vb, scale=1 / 4),
                                                {"valid-lens-ignored", "scale-by-d"}),
        "mask inverted, no scaling": (build(q, k, v, mask=mask), attention(q, k, v, ~mask, scale=1.0),
                                      {"mask-inverted", "no-scaling"}),
        "causal mask missing, heads not transposed": (
            Layer.build(x, projections=Projections(**w), heads=2, options=Options(causal=True)), untransposed,
            {"causal-missing", "heads-not-transposed"}),
        "causal added, scale after the softmax": (
            build(q, k, v), softmax(np.where(causal_keep(5, 5, 0), q @ k.T, -np.inf)) @ v / 2.0,
            {"causal-added", "scale-after-softmax"}),
    }


PAIRS = pair_cases()


@pytest.mark.parametrize("case", list(PAIRS))
def test_two_mistakes_together_are_named_together(case: str) -> None:
    problem, expected, pair = PAIRS[case]
    found = names(problem, expected)
    assert frozenset(pair) in found, found
    assert all(len(f) == 2 for f in found)  # no single mistake explains them


def test_the_pair_search_is_bounded_and_says_how() -> None:
    problem, expected, _ = PAIRS["no scaling, no causal mask"]
    verdict = check(problem, expected, tolerance=TOL)
    assert "pairs of mistakes:" in verdict.search and "at most 600 pairs" in verdict.search
    assert check(problem, expected, tolerance=TOL, pairs=False).explanations == []


# ---- precision: SDPA's own half-precision output on the CPU -------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sdpa_in_half_precision_is_consistent_and_a_row_shifted_by_2_percent_is_not(dtype: str) -> None:
    rng = np.random.default_rng(11)
    q, k, v = (rng.normal(size=(2, 16, 32)) for _ in range(3))
    tdt = getattr(torch, dtype)
    t = [torch.from_numpy(a).to(tdt) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*t, is_causal=True)
    q, k, v = (a.double().numpy() for a in t)  # the inputs as the kernel had them
    problem = build(q, k, v, causal=True)
    # a float64 loop reference: its error against the exact answer is what the verdict measures
    exact = attention(q, k, v, causal_keep(16, 16, 0))
    verdict = check(problem, out.double().numpy(), precision=dtype)
    assert verdict.match and verdict.precision is not None and verdict.precision.consistent
    assert verdict.precision.max_abs_error == pytest.approx(np.abs(out.double().numpy() - exact).max(), rel=1e-9)
    assert 0.3 < verdict.precision.ratio <= 2.0
    shifted = out.clone()
    shifted[1, 9] *= 1.02
    bad = check(problem, shifted.double().numpy(), precision=dtype)
    assert not bad.match and bad.precision is not None
    assert [r for r, _ in bad.precision.rows_over][:1] == ["[b1][q9]"]
    assert "[b1][q9]" in bad.precision.sentence()
    assert {c.label.split(",")[0] for c in bad.comparison.first} == {"[b1][q9"}


def test_plain_bfloat16_is_as_far_from_the_truth_as_torch_eager_bfloat16() -> None:
    # the emulated plain implementation and PyTorch's eager attention in bfloat16 (matmul, softmax, matmul)
    # land at the same distance from float64, within a factor 2 either way
    from attncli.check.precision import naive_run

    for seed in range(3):
        rng = np.random.default_rng(seed)
        q, k, v = (rng.normal(size=(2, 32, 32)) for _ in range(3))
        exact = attention(q, k, v, causal_keep(32, 32, 0))
        t = [torch.from_numpy(a).bfloat16() for a in (q, k, v)]
        s = (t[0] @ t[1].transpose(-1, -2) * (1 / math.sqrt(32))).masked_fill(~torch.ones(32, 32).tril().bool(), -math.inf)
        eager = (torch.softmax(s, -1) @ t[2]).double().numpy()
        plain = naive_run(build(q, k, v, causal=True), "bfloat16")["output"]
        ratio = np.abs(plain - exact).max() / np.abs(eager - exact).max()
        assert 0.5 <= ratio <= 2.0, ratio


def _llama_half(seed: int, dt: Any = torch.bfloat16, bias: bool = False, norm_cls: str = "LlamaRMSNorm",
                T: int = 12, E: int = 64, H: int = 4, G: int = 2) -> dict[str, np.ndarray]:
    """transformers' own Llama attention (eager) behind an RMSNorm of transformers (``norm_cls``: LlamaRMSNorm, or
    GptOssRMSNorm / HeliumRMSNorm, which apply w in float32), random weights (biases with ``bias``), run in ``dt``
    and in float64 on the same half-precision numbers: the normed input, the rotated queries and the output of
    each, and the arrays."""
    tf = pytest.importorskip("transformers")
    import importlib

    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding, apply_rotary_pos_emb

    family = {"LlamaRMSNorm": "llama", "GptOssRMSNorm": "gpt_oss", "HeliumRMSNorm": "helium"}[norm_cls]
    norm_type = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), norm_cls)
    cfg = tf.LlamaConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=G, head_dim=E // H,
                         rope_theta=10000.0, attention_bias=bias)
    cfg._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    attn, norm, rot = LlamaAttention(cfg, 0), norm_type(E, eps=1e-6), LlamaRotaryEmbedding(cfg)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 1.5 / math.sqrt(p.shape[-1]))
        norm.weight.copy_(1 + 0.5 * (2 * torch.rand(E, generator=g) - 1))
    h = (torch.randn(1, T, E, generator=g) * 3).to(dt)
    mask = torch.full((T, T), -torch.inf).triu(1)[None, None]
    out: dict[str, np.ndarray] = {}
    for d, tag in ((dt, "half"), (torch.float64, "f64")):  # .to(): in place, the half type first
        a, n = attn.to(d), norm.to(d)  # inv_freq stays float32 (from_pretrained(dtype=...) keeps it so)
        with torch.no_grad():
            x = n(h.to(d))
            cos, sin = rot(x, torch.arange(T)[None])  # computed in float32, cast to x's dtype
            q = a.q_proj(x).view(1, T, H, E // H).transpose(1, 2)
            q_rot, _ = apply_rotary_pos_emb(q, q, cos, sin)
            y, _ = a(x, (cos, sin), mask.to(d))
        out |= {f"x_norm_{tag}": x[0].double().numpy(), f"q_rot_{tag}": q_rot[0].double().numpy(),
                f"y_{tag}": y[0].double().numpy()}
    for n, m in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
        out[f"W_{n}"] = getattr(attn, m).weight.detach().double().numpy().T
        if getattr(attn, m).bias is not None:
            out[f"b_{n}"] = getattr(attn, m).bias.detach().double().numpy()
    return out | {"h": h[0].double().numpy(), "norm_w": norm.weight.detach().double().numpy()}


def _plain_llama(a: dict[str, np.ndarray], dtype: str, rms_wide: bool = False) -> Any:
    from attncli.check.precision import naive_run
    from attncli.core.projections import Norm

    proj = Projections(a["W_q"], a["W_k"], a["W_v"], a["W_o"], *(a.get(f"b_{n}") for n in "qkvo"))
    layer = Layer.build(a["h"], projections=proj, heads=4, pre_norm=Norm("rms", a["norm_w"], eps=1e-6),
                        options=Options(causal=True, rope="half", rope_base=10000.0, kv_heads=2, rms_wide=rms_wide))
    return naive_run(layer, dtype)


def _same_output(plain: Any, a: dict[str, np.ndarray], dtype: str = "bfloat16") -> None:
    # the emulation's output is the module's up to float32 sums taken in another order (every cell equal on one
    # CPU, 96% on another: tests/halfbounds.py): each cell within 2 units of its row's largest, and the same
    # error against float64; and not just an error of the same size: the emulation's difference from the module is
    # under a fifth of the module's own error (0 here in bfloat16, 0.12 where 4% of the float16 cells round the other
    # way; the emulations that rounded elsewhere differed by 0.26-0.42)
    assert_rounds_as(plain["output"], a["y_half"], dtype, exact=a["y_f64"], cell_ulps=2, rows=True, what="output")
    module, emulated = a["y_half"] - a["y_f64"], plain["output"] - a["y_f64"]
    assert np.linalg.norm(module - emulated) < 0.2 * np.linalg.norm(module)


def test_plain_bfloat16_rounds_where_transformers_rounds() -> None:
    # the plain bfloat16 emulation of a Llama layer from its residual against transformers' own modules in
    # bfloat16 (LlamaRMSNorm: float32, rounded once; LlamaRotaryEmbedding: cos and sin cast to bfloat16; the
    # softmax in float32, rounded once): the same normed input and rotated queries, and the same output (before,
    # with cos/sin unrounded and every step of the norm rounded, 70-80% of the normed cells were equal: the cause
    # of the false alarms of issue 24; with s - max, exp and the division rounded each, the output differed from
    # the module's by 26-42% of the module's own error)
    for seed in range(4):
        a = _llama_half(seed)
        plain = _plain_llama(a, "bfloat16")
        assert_rounds_as(plain["x_norm"], a["x_norm_half"], "bfloat16", what="x_norm")
        assert_rounds_as(plain["q_rot"], a["q_rot_half"], "bfloat16", cell_ulps=2, what="q_rot")
        _same_output(plain, a)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("norm_cls", ["LlamaRMSNorm", "GptOssRMSNorm", "HeliumRMSNorm"])
def test_plain_half_with_biases_and_each_rms_norm_is_the_modules(dtype: str, norm_cls: str) -> None:
    # the float16 false alarms of seed 3 (gpt_oss, helium; docs/false_alarms.md): F.linear adds the bias in its
    # float32 accumulator and rounds once (the emulation rounded x @ W, then + b), and GPT-OSS's and Helium's
    # RMSNorm apply w in float32 before rounding (the family fact rms_wide; Llama's rounds, then times w)
    wide = norm_cls != "LlamaRMSNorm"
    for seed in range(2):
        a = _llama_half(seed, getattr(torch, dtype), bias=True, norm_cls=norm_cls)
        plain = _plain_llama(a, dtype, rms_wide=wide)
        other = _plain_llama(a, dtype, rms_wide=not wide)["x_norm"]  # the other RMSNorm: not the module's
        assert_rounds_as(plain["x_norm"], a["x_norm_half"], dtype, others=[("the other RMSNorm", other)],
                         what="x_norm")
        # q_rot: q_proj's float32 sum (one unit the other way at most), carried by the rotation's products and sum
        assert_rounds_as(plain["q_rot"], a["q_rot_half"], dtype, cell_ulps=2, what="q_rot")
        _same_output(plain, a, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(("family", "mode", "rounding"), [
    ("llama", "half", "each"), ("olmo2", "half", "once-float32"), ("ernie4_5", "interleaved", "once-float32"),
    ("cohere", "interleaved", "once")])
def test_plain_half_rotates_as_the_familys_rotary(dtype: str, family: str, mode: str, rounding: str) -> None:
    # transformers' own rotary embedding and apply_rotary_pos_emb of the family in float16/bfloat16: Llama casts cos
    # and sin to the dtype and rounds each operation; Cohere casts them but rotates q.float() and rounds once; OLMo 2
    # and Ernie 4.5 keep them in float32, rotate in float32 and round once (the family fact rope_rounding). The
    # emulation's q_rot is the module's, and the other readings are not
    import importlib

    from attncli.check.precision import RoundingNamespace, rounded
    from attncli.core import ops

    pytest.importorskip("transformers")
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cfg_cls = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    name = {"llama": "Llama", "olmo2": "Olmo2", "ernie4_5": "Ernie4_5", "cohere": "Cohere"}[family]
    T, H, d = 40, 2, 16
    cfg = getattr(cfg_cls, f"{name}Config")(hidden_size=H * d, num_attention_heads=H, num_key_value_heads=H,
                                             head_dim=d, rope_theta=10000.0)
    rot = getattr(mod, f"{name}RotaryEmbedding")(cfg)
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(1, H, T, d, generator=g) * 2).to(getattr(torch, dtype))
    cos, sin = rot(q, torch.arange(T)[None])
    want = mod.apply_rotary_pos_emb(q, q, cos, sin)[0][0].double().numpy()  # (H, T, d)
    c32, s32 = (t[0].float().numpy() for t in rot(q.float(), torch.arange(T)[None]))  # the float32 tables
    if family == "ernie4_5":  # attncli's tables for interleaved pairs: each frequency twice, side by side (Ernie's
        # rotary returns them in halves and its apply_rotary_pos_emb interleaves them; Cohere's returns them so)
        c32, s32 = (np.repeat(t[:, : d // 2], 2, axis=-1) for t in (c32, s32))
    xp, x = RoundingNamespace(dtype), rounded(q[0].double().numpy(), dtype)
    def rotated(how: str) -> np.ndarray:
        return np.asarray(ops.rotate(xp, x, c32, s32, mode, rounding=how), dtype=np.float64)

    assert_rounds_as(rotated(rounding), want, dtype, what=f"{family} rotary",
                     others=[(other, rotated(other)) for other in sorted({"each", "once", "once-float32"} - {rounding})])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_plain_half_rotates_and_tunes_as_llama_4(dtype: str) -> None:
    # Llama 4 rotates q as complex pairs in float32 by float32 freqs_cis and rounds once (rope_rounding
    # once-float32, as DeepSeek-V2), and multiplies its NoPE layers' q by float32 temperature factors, rounded once
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding, apply_rotary_emb

    from attncli.check.precision import RoundingNamespace, rounded
    from attncli.core import ops

    T, H, d = 40, 2, 16
    cfg = Llama4TextConfig(hidden_size=H * d, num_attention_heads=H, num_key_value_heads=H, head_dim=d,
                           rope_theta=10000.0, rope_scaling=None)
    g = torch.Generator().manual_seed(4)
    q = (torch.randn(1, T, H, d, generator=g) * 2).to(getattr(torch, dtype))  # (B, T, H, d), as Llama 4 rotates it
    freqs = Llama4TextRotaryEmbedding(cfg)(q, torch.arange(T)[None])  # (1, T, d/2) complex64
    want = apply_rotary_emb(q, q, freqs[:, :, None, :].squeeze(2))[0][0].transpose(0, 1).double().numpy()
    c32 = np.repeat(freqs[0].real.numpy(), 2, axis=-1)  # each frequency twice, side by side: (T, d)
    s32 = np.repeat(freqs[0].imag.numpy(), 2, axis=-1)
    xp, x = RoundingNamespace(dtype), rounded(q[0].transpose(0, 1).double().numpy(), dtype)  # (H, T, d)
    got = {how: np.asarray(ops.rotate(xp, x, c32, s32, "interleaved", rounding=how), dtype=np.float64)
           for how in ("each", "once", "once-float32")}
    assert_rounds_as(got["once-float32"], want, dtype, others=[("each", got["each"])], what="llama4 rotary")
    scales = torch.log1p(torch.floor((torch.arange(T).float() + 1.0) / 4.0)) * 0.3 + 1.0  # attn_scale 0.3, floor 4
    want_t = (q * scales.view(1, T, 1, 1)).to(q.dtype)[0].transpose(0, 1).double().numpy()
    factors = ops.tuning_factors(np.arange(T), 0.3, 4.0)
    twice = np.asarray(x * rounded(factors[:, None], dtype), dtype=np.float64)  # the factors rounded first: not it
    assert_rounds_as(np.asarray(ops.tuned(xp, x, factors), dtype=np.float64), want_t, dtype,
                     others=[("the factors rounded first", twice)], what="llama4 tuning")


def test_plain_bfloat16_layer_norm_rounds_once_as_torch() -> None:
    # torch's LayerNorm on a bfloat16 input computes in float32, w and b included, and rounds once; the emulation's
    # pre-norm does the same (before: its product with w was rounded before adding b: 67% of the cells equal)
    from attncli.check.precision import naive_run
    from attncli.core.projections import Norm

    g = torch.Generator().manual_seed(5)
    h, w, b = (torch.randn(*shape, generator=g).bfloat16() for shape in ((16, 64), (64,), (64,)))
    h = h * 3
    want = F.layer_norm(h, (64,), w, b, 1e-5).double().numpy()
    eye = np.eye(64)
    layer = Layer.build(h.double().numpy(), projections=Projections(eye, eye, eye), heads=4,
                        pre_norm=Norm("layernorm", w.double().numpy(), b.double().numpy(), eps=1e-5))
    got = naive_run(layer, "bfloat16")["x_norm"]
    assert_rounds_as(got, want, "bfloat16", what="layer norm")  # float32 sums in another order: one unit at most


def test_a_bug_in_bfloat16_is_named_against_the_precision() -> None:
    q, k, v = (np.random.default_rng(4).normal(size=(8, 16)) for _ in range(3))
    t = [torch.from_numpy(a).bfloat16() for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*t).double().numpy()  # the causal mask forgotten, in bfloat16
    q, k, v = (a.double().numpy() for a in t)
    verdict = check(build(q, k, v, causal=True), out, precision="bfloat16")
    assert not verdict.match
    assert [e.name for e in verdict.explanations] == ["causal-missing"]


# ---- the command line ------------------------------------------------------------------------------------

def save(tmp: Path, **arrays: np.ndarray) -> list[str]:
    out = []
    for name, a in arrays.items():
        np.save(tmp / f"{name}.npy", a)
        out.append(str(tmp / f"{name}.npy"))
    return out


def test_precision_from_a_bfloat16_file_and_json(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    t = [torch.from_numpy(rng.normal(size=(6, 8))).bfloat16() for _ in range(3)]
    out = F.scaled_dot_product_attention(*t, is_causal=True)
    for name, a in zip(("q", "k", "v", "out"), (*t, out)):
        torch.save(a, tmp_path / f"{name}.pt")
    files = [str(tmp_path / f"{n}.pt") for n in ("out", "q", "k", "v")]
    r = runner.invoke(app, ["check", *files, "--causal"])
    assert r.exit_code == 0, r.output
    said = " ".join(r.stdout.split())
    assert "consistent with bfloat16" in said and "holds bfloat16 numbers" in said
    r = runner.invoke(app, ["check", *files, "-f", "json"])  # without the causal mask: a mismatch, named
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["verdict"] == "mismatch"
    assert doc["precision"]["dtype"] == "bfloat16" and doc["precision"]["naive_max_abs_error"] > 0
    assert [e["name"] for e in doc["explanations"]] == ["causal-added"]
    assert doc["candidates"][0]["name"] == "causal-added" and "max_abs_error" in doc["candidates"][0]
    assert {"rows", "columns", "heads"} <= set(doc["distribution"])
    assert 0 < doc["mismatched_percent"] <= 100


@pytest.mark.parametrize(("shift", "rule"), [(0.01, "row bound"), (0.05, "overall")])
def test_the_mismatching_cells_say_when_the_per_row_rule_decided(tmp_path: Path, shift: float, rule: str) -> None:
    """SDPA's bfloat16 output with row [b1][q9] shifted: by 0.01, every cell's error (against a float64 loop) is within
    the overall bound, and the table says each was held to its row's bound; by 0.05 the overall rule decides."""
    rng = np.random.default_rng(11)
    t = [torch.from_numpy(rng.normal(size=(2, 16, 32))).bfloat16() for _ in range(3)]
    out = F.scaled_dot_product_attention(*t, is_causal=True).double().numpy()
    out[1, 9] += shift
    np.save(tmp_path / "out.npy", out)
    for name, a in zip("qkv", t):
        np.save(tmp_path / f"{name}.npy", a.double().numpy())
    files = [str(tmp_path / f"{n}.npy") for n in ("out", "q", "k", "v")]
    doc = json.loads(runner.invoke(app, ["check", *files, "--causal", "--precision-of", "bfloat16", "-f", "json"]).stdout)
    q, k, v = (a.double().numpy() for a in t)
    err = np.abs(out - attention(q, k, v, causal_keep(16, 16, 0)))
    overall = doc["tolerance"]["atol"]
    assert (err.max() <= overall) == (rule == "row bound")
    assert doc["rule"] == ("per-row" if rule == "row bound" else "overall")
    r = runner.invoke(app, ["check", *files, "--causal", "--precision-of", "bfloat16"], env={"COLUMNS": "200"})
    assert r.exit_code == 1
    table = r.stdout.split("First mismatching cells", 1)[1].split("\n\n")[0]
    rows = [ln for ln in table.splitlines() if "[b1][q9" in ln]
    assert rows and all(ln.split("│")[-2].strip() == rule for ln in rows), table
    assert ("row bound: within the overall bound" in " ".join(r.stdout.split())) == (rule == "row bound")


def test_float64_numbers_rounded_to_3_decimals_in_npy(tmp_path: Path) -> None:
    q, k, v = rand(3, 4), rand(5, 4, seed=1), rand(5, 2, seed=2)
    files = save(tmp_path, q=q, k=k, v=v)
    good = np.round(sdpa(q, k, v), 3)
    (tmp_path / "e").mkdir()
    r = runner.invoke(app, ["check", *save(tmp_path / "e", good=good), *files])
    assert r.exit_code == 0, r.output
    assert "is a float rounded to 3 decimals" in " ".join(r.stdout.split())
    off = good.copy()
    off[1, 0] += 0.002  # two units of the third decimal
    r = runner.invoke(app, ["check", *save(tmp_path / "e", off=off), *files, "-f", "json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["tolerance"]["atol"] == pytest.approx(5e-4, rel=1e-5)


@pytest.mark.parametrize("args,where", [
    (["--atol", "nan"], "--atol"), (["--atol", "inf"], "--atol"), (["--rtol", "nan"], "--rtol"),
    (["--atol", "-1"], "--atol"), (["--precision-of", "float8"], "--precision-of"),
    (["--precision-of", "bfloat16", "--atol", "1e-3"], "--precision-of"),
])
def test_bad_tolerances_and_precisions_exit_2(tmp_path: Path, args: list[str], where: str) -> None:
    import subprocess
    import sys

    q = rand(3, 4)
    files = save(tmp_path, e=sdpa(q, q, q), q=q)
    for fmt in ("rich", "json"):
        r = subprocess.run([sys.executable, "-m", "attncli", "check", *files, *args, "-f", fmt], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        assert r.returncode == 2, r.stderr
        assert where in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert r.stdout == "", (fmt, r.stdout)  # one rule for check's own options: nothing on stdout, any format


def test_expected_of_a_shape_no_step_has_names_the_steps(tmp_path: Path) -> None:
    q, k, v = rand(3, 4), rand(5, 4, seed=1), rand(5, 2, seed=2)
    files = save(tmp_path, q=q, k=k, v=v)
    (tmp_path / "e").mkdir()
    r = runner.invoke(app, ["check", *save(tmp_path / "e", w=softmax(q @ k.T / 2)), *files])
    assert r.exit_code == 2 and "they fit the steps scores, scaled, weights: use --what scores" in r.stderr
    r = runner.invoke(app, ["check", *save(tmp_path / "e", x=np.zeros((7, 7))), *files])
    assert r.exit_code == 2 and "no step has that shape (steps: scores (3, 5)" in r.stderr, r.stderr


# ---- today's models: GQA, RoPE, windows, soft-capping, QK-norm (references: transformers' own functions) ----

def hf_rope(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """transformers' apply_rotary_pos_emb (Llama, "half"), cos/sin from LlamaRotaryEmbedding's float32
    inverse frequencies, taken in float64."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d = x.shape[-1]
    inv = (1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))).double()  # as HF, float32
    freqs = torch.from_numpy(positions).double()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    t = torch.from_numpy(x)[None]  # (1, H, T, d)
    out, _ = apply_rotary_pos_emb(t, t, emb.cos()[None], emb.sin()[None])
    return out[0].numpy()


def gqa_case(tiled: bool) -> tuple[Problem, np.ndarray]:
    """Multi-head GQA (4 query heads, 2 K/V heads of width 2) as HF's eager attention, with ``repeat_kv`` or,
    the mistake, torch's ``.repeat`` (tiling)."""
    from transformers.models.llama.modeling_llama import repeat_kv

    rng = np.random.default_rng(21)
    x = rng.normal(size=(2, 5, 8))
    w = {"W_q": rng.normal(size=(8, 8)) / 3, "W_k": rng.normal(size=(8, 4)) / 3, "W_v": rng.normal(size=(8, 4)) / 3,
         "W_o": rng.normal(size=(8, 8)) / 3}
    q = torch.from_numpy(x @ w["W_q"]).view(2, 5, 4, 2).transpose(1, 2)  # (B, H, T, d)
    k, v = (torch.from_numpy(x @ w[n]).view(2, 5, 2, 2).transpose(1, 2) for n in ("W_k", "W_v"))  # (B, G, T, d)
    k, v = (a.repeat(1, 2, 1, 1) if tiled else repeat_kv(a, 2) for a in (k, v))
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 5, 8).numpy()
    return Layer.build(x, projections=Projections(**w), heads=4), o @ w["W_o"]


def test_gqa_by_tiling_is_named() -> None:
    problem, correct = gqa_case(tiled=False)
    assert check(problem, correct, tolerance=TOL).match
    assert names(problem, gqa_case(tiled=True)[1]) == one("kv-heads-tiled")


def rope_case() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(22)
    return rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 6, 8)), rng.normal(size=(2, 6, 8))


def test_rope_applied_to_q_only_is_named() -> None:
    q, k, v = rope_case()
    qr, kr = hf_rope(q, np.arange(5)), hf_rope(k, np.arange(6))
    problem = build(q, k, v, rope="half")
    assert check(problem, attention(qr, kr, v), tolerance=TOL).match
    assert names(problem, attention(qr, k, v)) == one("rope-q-only")


def test_rope_applied_to_v_is_named() -> None:
    q, k, v = rope_case()
    qr, kr, vr = hf_rope(q, np.arange(5)), hf_rope(k, np.arange(6)), hf_rope(v, np.arange(6))
    assert names(build(q, k, v, rope="half"), attention(qr, kr, vr)) == one("rope-on-v")


def test_rope_with_the_default_base_instead_of_the_models_is_named() -> None:
    q, k, v = rope_case()
    problem = build(q, k, v, rope="half", rope_base=500000.0)  # Llama 3's rope_theta
    good = attention(hf_rope(q, np.arange(5), 500000.0), hf_rope(k, np.arange(6), 500000.0), v)
    assert check(problem, good, tolerance=TOL).match
    assert names(problem, attention(hf_rope(q, np.arange(5)), hf_rope(k, np.arange(6)), v)) == one("rope-base-default")


def test_window_not_combined_with_causal_is_named() -> None:
    q, k, v = rand(7, 4, seed=23), rand(7, 4, seed=24), rand(7, 3, seed=25)
    i, j = np.arange(7)[:, None], np.arange(7)[None, :]
    problem = build(q, k, v, window=3)
    assert check(problem, attention(q, k, v, (j <= i) & (i - j < 3)), tolerance=TOL).match  # HF sliding_window_overlay
    assert names(problem, attention(q, k, v, np.abs(i - j) < 3)) == one("window-not-causal")


def test_softcap_after_the_mask_is_named() -> None:
    q, k, v = rand(6, 4, seed=26), rand(6, 4, seed=27), rand(6, 3, seed=28)
    keep = causal_keep(6, 6, 0)
    s = q @ k.T / 2.0

    def weights(a: np.ndarray) -> np.ndarray:
        return softmax(a) @ v

    cap = 1.5
    problem = build(q, k, v, causal=True, softcap=cap)
    assert check(problem, weights(np.where(keep, cap * np.tanh(s / cap), -np.inf)), tolerance=TOL).match  # Gemma 2
    assert names(problem, weights(cap * np.tanh(np.where(keep, s, -np.inf) / cap))) == one("softcap-after-mask")


def test_qk_norm_over_the_model_width_is_named() -> None:
    q, k, v = rand(3, 5, 4, seed=29), rand(3, 6, 4, seed=30), rand(3, 6, 2, seed=31)

    def rms(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return a / np.sqrt(np.mean(a * a, axis=axes, keepdims=True) + 1e-6)  # Qwen3 RMSNorm, weight 1

    problem = build(q, k, v, qk_norm="rms")
    assert check(problem, attention(rms(q, (-1,)), rms(k, (-1,)), v), tolerance=TOL).match
    assert names(problem, attention(rms(q, (0, 2)), rms(k, (0, 2)), v)) == one("qk-norm-model-width")


def test_qk_norm_placement_and_full_width_mistakes_are_named() -> None:
    q, k, v = rand(3, 5, 4, seed=32), rand(3, 6, 4, seed=33), rand(3, 6, 2, seed=34)

    def rms(a: np.ndarray, axes: tuple[int, ...] = (-1,)) -> np.ndarray:
        return a / np.sqrt(np.mean(a * a, axis=axes, keepdims=True) + 1e-6)

    def rope(a: np.ndarray) -> np.ndarray:  # HF rotate_half at positions 0.. (float64, base 10000)
        d, n = a.shape[-1], a.shape[-2]
        ang = np.arange(n)[:, None] * (1.0 / 10000.0 ** (np.arange(0, d, 2) / d))[None]
        emb = np.concatenate([ang, ang], -1)
        return a * np.cos(emb) + np.concatenate([-a[..., d // 2:], a[..., :d // 2]], -1) * np.sin(emb)

    w = np.array([0.6, 1.3, 0.9, 1.5])  # with a weight the order matters (a weightless RMS commutes with the rotation)
    after = build(q, k, v, qk_norm="rms", qk_norm_at="after-rope", rope="half", q_norm=w, k_norm=w)  # HunYuan
    assert check(after, attention(rms(rope(q)) * w, rms(rope(k)) * w, v), tolerance=TOL).match
    assert names(after, attention(rope(rms(q) * w), rope(rms(k) * w), v)) == one("qk-norm-other-side-of-rope")
    full = build(q, k, v, qk_norm="rms-full")  # OLMo 2, weightless: over the 3 heads' features of a token
    assert check(full, attention(rms(q, (0, 2)), rms(k, (0, 2)), v), tolerance=TOL).match
    assert names(full, attention(rms(q), rms(k), v)) == one("qk-norm-per-head")


def test_modern_pairs_are_named_together() -> None:
    # GQA tiled and the causal mask missing, in one model
    problem, _ = gqa_case(tiled=False)
    causal = Layer.build(problem.x, projections=problem.projections, heads=4, options=Options(causal=True))
    assert frozenset({"causal-missing", "kv-heads-tiled"}) in names(causal, gqa_case(tiled=True)[1])


def test_the_rounding_to_half_types_is_ml_dtypes_and_numpy_own() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from attncli.check.precision import rounded

    x = np.random.default_rng(40).normal(size=1000) * 10.0 ** np.random.default_rng(41).integers(-6, 4, size=1000)
    assert np.array_equal(np.asarray(rounded(x, "bfloat16"), np.float64),
                          x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64))
    half = x.astype(np.float32).astype(np.float16).astype(np.float64)
    assert np.array_equal(np.asarray(rounded(x, "float16"), np.float64), half)


def test_key_padding_inverted_beside_a_mask_is_named() -> None:
    x, w = rand(2, 5, 8, seed=8), mh_weights(8, 8, seed=9)
    pad = np.zeros((2, 5), bool)
    pad[0, 3:] = pad[1, :2] = True
    causal = np.tril(np.ones((5, 5), bool))  # a boolean mask beside it, True = keep

    def by_hand(ignore: np.ndarray) -> np.ndarray:
        q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]
        keep = causal[None] & ~ignore[:, None, :]  # (B, T, S)
        outs = [attention(q[..., h * 4:(h + 1) * 4], k[..., h * 4:(h + 1) * 4], v[..., h * 4:(h + 1) * 4], keep)
                for h in range(2)]
        return np.concatenate(outs, axis=-1) @ w["W_o"]

    problem = Layer.build(x, projections=Projections(**w), heads=2, padding=pad, mask=causal)
    assert check(problem, by_hand(pad), tolerance=TOL).match
    assert names(problem, by_hand(~pad)) == one("key-padding-inverted")
