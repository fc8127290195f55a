"""Steps as data (issue 25): the explanations, the page and LaTeX read the steps' typed parameters,
never their formula text. Every display formula is replaced by "X" and each output must still
give the numbers of a float64 computation written here by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from attncli import attend
from attncli.core import scoring
from attncli.core.formula import Sym
from attncli.core.trace import Step
from attncli.render import RenderOptions
from attncli.render.explain import attach as explain
from attncli.render.latex import latex_document
from attncli.render.numbers import num
from attncli.render.page import page_data

rng = np.random.default_rng(25)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rotate_half(x: np.ndarray, pos: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """RoPE (rotate_half, as HF Llama) in float64: x (..., T, d) at positions pos (T,)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    ang = np.concatenate([pos[:, None] * inv[None]] * 2, axis=-1)  # (T, d)
    half = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * np.cos(ang) + half * np.sin(ang)


def case_scaled_dot() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    s = q @ k.T  # (3, 4) x (4, 5) -> (3, 5)
    x = s / math.sqrt(4)
    return {"q": q, "k": k, "v": v}, {"scores": s, "scaled": x, "weights": softmax(x)}


def case_softcap() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    q, k, v = 3 * rng.normal(size=(3, 4)), 3 * rng.normal(size=(4, 4)), rng.normal(size=(4, 2))
    s = q @ k.T
    x = s / 2.0
    c = 2.5 * np.tanh(x / 2.5)
    return {"q": q, "k": k, "v": v, "softcap": 2.5}, {"scores": s, "scaled": x, "capped": c, "weights": softmax(c)}


def case_alibi() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    q, k, v = rng.normal(size=(2, 4, 4)), rng.normal(size=(2, 4, 4)), rng.normal(size=(2, 4, 3))  # 2 heads (H, T, d)
    slopes = np.array([2.0 ** -4, 2.0 ** -8])  # Press et al. for 2 heads: (2^(-8/2))^(h+1)
    s = q @ np.swapaxes(k, -1, -2)  # (H, T, d) x (H, d, S) -> (H, T, S)
    x = s / 2.0
    i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    a = x + slopes[:, None, None] * (j - i)
    w = softmax(np.where(j <= i, a, -np.inf))
    return {"q": q, "k": k, "v": v, "alibi": True, "causal": True}, {"scores": s, "scaled": x, "alibi": a, "weights": w}


def case_rope_gqa() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    q, k, v = rng.normal(size=(1, 4, 3, 8)), rng.normal(size=(1, 2, 3, 8)), rng.normal(size=(1, 2, 3, 2))
    pos = np.arange(3.0)
    qr, kr = rotate_half(q, pos), np.repeat(rotate_half(k, pos), 2, axis=1)  # query head h reads K/V head h // 2
    s = qr @ np.swapaxes(kr, -1, -2)  # (1, 4, 3, 8) x (1, 4, 8, 3) -> (1, 4, 3, 3)
    x = s / math.sqrt(8)
    return {"q": q, "k": k, "v": v, "rope": "half"}, {"scores": s, "scaled": x, "weights": softmax(x)}


def case_additive() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    q, k, v = rng.normal(size=(2, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    Wq, Wk, wv = rng.normal(size=(3, 5)), rng.normal(size=(3, 5)), rng.normal(size=5)
    f = np.tanh((q @ Wq)[:, None, :] + (k @ Wk)[None, :, :])  # (2, 1, 5) + (1, 4, 5) -> (2, 4, 5)
    s = f @ wv  # (2, 4, 5) x (5,) -> (2, 4)
    return ({"q": q, "k": k, "v": v, "score": "additive", "score_weights": {"W_q": Wq, "W_k": Wk, "w_v": wv}},
            {"scores": s, "weights": softmax(s)})


CASES = {"scaled-dot": case_scaled_dot, "softcap": case_softcap, "alibi": case_alibi, "rope-gqa": case_rope_gqa,
         "additive": case_additive}


@pytest.fixture
def no_formulas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step's display formula (its text, and the scaling rule's) replaced by "X"."""
    monkeypatch.setattr(Step, "text", property(lambda self: "X"))
    monkeypatch.setattr(Step, "formula", property(lambda self: "X"))
    monkeypatch.setattr(scoring.Scaling, "describe", lambda self, d, n: (Sym("X"),))


def cells(ref: dict[str, np.ndarray]) -> list[tuple[tuple[int, ...], int, int]]:
    lead = ref["weights"].shape[:-2]
    m, n = ref["weights"].shape[-2:]
    b = tuple(x - 1 for x in lead)
    return [(b, m - 1, 0), (b, m - 1, n - 1), ((0,) * len(lead), 0, 0)]


def expected_numbers(ref: dict[str, np.ndarray], b: tuple[int, ...], i: int, j: int) -> list[str]:
    """Each step's value at the cell as the explanations write it (the dot score as 'sim(...)' or 'score(...)')."""
    return [num(float(a[b + (i, j)])) for a in ref.values()]


@pytest.mark.parametrize("name", sorted(CASES))
def test_explanations_page_and_latex_read_parameters_not_formulas(name: str, no_formulas: None) -> None:
    kw, ref = CASES[name]()
    q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
    t = attend(q, k, v, **kw)
    assert all(s.formula.startswith("X") for s in t.steps)  # the patch reached every step
    np.testing.assert_allclose(t.weights, ref["weights"], rtol=1e-7, atol=1e-12)  # RoPE: float32 frequencies, as HF
    specs = [(f"{','.join(map(str, b))}:{i},{j}" if b else f"{i},{j}", b, i, j) for b, i, j in cells(ref)]
    opts = RenderOptions(explain=[s for s, *_ in specs])
    ex = explain(t, opts)
    page = page_data(t)
    doc = latex_document(t, opts)
    for (spec, b, i, j), e in zip(specs, ex):
        text = "\n".join(e["lines"])
        flat = int(np.ravel_multi_index(b, ref["weights"].shape[:-2])) if b else 0
        on_page = "\n".join(page["cells"][flat][i][j]) if page["explained_cells"] else text
        for want in expected_numbers(ref, b, i, j):
            assert f"= {want}" in text, (spec, want, text)
            assert f"= {want}" in on_page, (spec, want, on_page)
            assert want in doc, (spec, want)


def test_scaling_and_cap_arithmetic_come_from_parameters(no_formulas: None) -> None:
    """With the rule's text and the cap's formula gone, the explanation still writes s / √d and c · tanh(s / c)."""
    kw, ref = case_softcap()
    t = attend(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)
    text = "\n".join(explain(t, RenderOptions(explain=["1,2"]))[0]["lines"])
    s, x, c = (num(float(ref[n][1, 2])) for n in ("scores", "scaled", "capped"))
    assert f"scaled: {s} / √4 = {x}" in text
    assert f"capped: 2.5 · tanh({x} / 2.5) = {c}" in text
