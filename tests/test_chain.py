"""The one chain before the softmax (attncli.core.chain) and the bias stage.

- A stage registered in the chain is computed by every path that says it can, or refuses the
  problem (plan() picks the explicit path): never silently skipped. Reference: float64 by hand.
- T5's relative position bias is its own step; a layer whose implementation forgot it is named
  by check as 'bias-missing'. References: transformers' T5Attention (the correct output) and a
  float64 loop without any bias (the mistaken one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch

from attncli.check.verdict import Tolerance, check
from attncli.core import chain, engine
from attncli.core.formula import Formula, Name, formula
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.plan import Needs, plan
from attncli.core.problem import Problem
from attncli.core.projections import Projections, RelativeBias

TOL = Tolerance(1e-9, 1e-9, "test")


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape)


# ---- a throw-away stage: every path computes it or is refused ---------------------------------------


@dataclass(frozen=True)
class Tilt:
    """The throw-away stage's parameters: they write its formula, as every stage's do."""

    before: str = "scores"

    def formula(self) -> Formula:
        return formula([Name("tilted"), " = ", Name(self.before), " + 0.25 j"])


def _tilt(b: chain.Block, s: Any) -> tuple[Any, Tilt]:
    """s + 0.25 · j: a bias by key position (it changes the weights, unlike a constant)."""
    return s + b.be.asarray(0.25 * b.j, b.p.dtype), Tilt()


def _with_tilt(monkeypatch: pytest.MonkeyPatch, blocked: bool) -> None:
    tilt = chain.Stage("tilted", lambda p: True, _tilt, blocked=blocked, sdpa=False)  # type: ignore[arg-type]
    at = [st.name for st in chain.STAGES].index(chain.N.MASKED)
    monkeypatch.setattr(chain, "STAGES", chain.STAGES[:at] + (tilt,) + chain.STAGES[at:])


@pytest.mark.parametrize("blocked", [True, False])
def test_a_new_stage_is_computed_by_every_path_or_refuses_it(monkeypatch: pytest.MonkeyPatch, blocked: bool) -> None:
    _with_tilt(monkeypatch, blocked)
    q, k, v = rand(2, 40, 8), rand(2, 50, 8, seed=1), rand(2, 50, 3, seed=2)
    keep = np.arange(50)[None, :] <= np.arange(40)[:, None] + 10  # causal, offset 10 (bottom-right)
    s = np.einsum("bid,bjd->bij", q, k) / math.sqrt(8) + 0.25 * np.arange(50)  # float64, by hand
    want = softmax(np.where(keep, s, -np.inf)) @ v
    explicit = engine.attend(q, k, v, causal=True, causal_align="bottom-right", dtype="float64")
    assert "tilted" in explicit.names() and explicit.names().index("tilted") < explicit.names().index("masked")
    assert explicit.step("tilted").formula == "tilted = scaled + 0.25 j"  # its own parameters wrote it, in its place
    np.testing.assert_allclose(explicit.output, want, rtol=0, atol=1e-12)
    for backend in ("numpy", "torch"):
        p = Problem.build(q, k, v, options=Options(causal=True, causal_align="bottom-right", dtype="float64",
                                                   backend=backend, keep_weights=False))
        how = plan(p, Needs(weights=False))
        assert how.path == ("blocked" if blocked else "explicit")  # never the fused kernel: it has no place for it
        out = engine.run(p, how)
        np.testing.assert_allclose(out.output, want, rtol=0, atol=1e-12)


def test_the_fused_path_runs_where_every_stage_allows_it() -> None:
    q, k, v = rand(2, 40, 8), rand(2, 50, 8, seed=1), rand(2, 50, 3, seed=2)
    p = Problem.build(q, k, v, options=Options(causal=True, backend="torch", keep_weights=False))
    assert plan(p, Needs(weights=False)).path == "sdpa"
    assert plan(replace(p, options=replace(p.options, softcap=5.0)), Needs(weights=False)).path == "blocked"
    assert plan(replace(p, options=replace(p.options, hard=True)), Needs(weights=False)).path == "explicit"


# ---- T5's relative position bias: its own step, and a forgotten one named as such -------------------

BUCKETS, DISTANCE, H, D_MODEL, D_KV, T = 8, 12, 2, 12, 4, 7


def _t5_layer(seed: int = 3) -> tuple[Any, dict[str, np.ndarray]]:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(d_model=D_MODEL, d_kv=D_KV, num_heads=H, relative_attention_num_buckets=BUCKETS,
                      relative_attention_max_distance=DISTANCE, dropout_rate=0.0, is_decoder=False)
    attn = T5Attention(config, has_relative_attention_bias=True).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in attn.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g, dtype=torch.float64) * 0.5)
    w = {"W_q": attn.q.weight.detach().T.numpy().copy(), "W_k": attn.k.weight.detach().T.numpy().copy(),
         "W_v": attn.v.weight.detach().T.numpy().copy(), "W_o": attn.o.weight.detach().T.numpy().copy(),
         "table": attn.relative_attention_bias.weight.detach().numpy().copy()}
    return attn, w


def _t5_problem(x: np.ndarray, w: dict[str, np.ndarray]) -> Problem:
    rb = RelativeBias(w["table"], bidirectional=True, num_buckets=BUCKETS, max_distance=DISTANCE)
    proj = Projections(W_q=w["W_q"], W_k=w["W_k"], W_v=w["W_v"], W_o=w["W_o"])
    return Layer.build(x, projections=proj, heads=H, relative_bias=rb, options=Options(scale=1.0))  # T5: no 1/√d


def _without_bias(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """The layer with the bias forgotten, head by head in float64 (T5 does not scale the scores)."""
    q, k, v = x @ w["W_q"], x @ w["W_k"], x @ w["W_v"]
    heads = [softmax(q[..., h * D_KV:(h + 1) * D_KV] @ k[..., h * D_KV:(h + 1) * D_KV].swapaxes(-1, -2))
             @ v[..., h * D_KV:(h + 1) * D_KV] for h in range(H)]
    return np.concatenate(heads, axis=-1) @ w["W_o"]


def test_a_forgotten_relative_bias_is_named_as_a_missing_bias() -> None:
    attn, w = _t5_layer()
    x = rand(1, T, D_MODEL, seed=4)
    with torch.no_grad():
        correct = attn(torch.from_numpy(x))[0].numpy()  # transformers' T5Attention, its bias included
    problem = _t5_problem(x, w)
    trace = engine.run(problem)
    assert "bias" in trace.names() and "masked" not in trace.names() and problem.mask is None
    np.testing.assert_allclose(trace.output, correct, rtol=0, atol=1e-10)
    assert check(problem, correct, tolerance=TOL).match
    verdict = check(problem, _without_bias(x, w), tolerance=TOL)
    assert not verdict.match
    assert [e.name for e in verdict.explanations] == ["bias-missing"]


def test_a_single_head_problem_with_a_relative_bias_keeps_its_shape() -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    q, k, v = rand(5, 4), rand(6, 4, seed=1), rand(6, 3, seed=2)
    table = rand(BUCKETS, 1, seed=3)
    rb = RelativeBias(table, bidirectional=False, num_buckets=BUCKETS, max_distance=DISTANCE)
    trace = engine.run(Problem.build(q, k, v, relative_bias=rb))
    rel = torch.arange(6)[None, :] - torch.arange(5)[:, None]  # j - i
    bucket = T5Attention._relative_position_bucket(rel, bidirectional=False, num_buckets=BUCKETS,
                                                   max_distance=DISTANCE).numpy()
    want = softmax(q @ k.T / 2.0 + table[bucket, 0]) @ v
    assert trace.output.shape == (5, 3) and trace.weights.shape == (5, 6)
    np.testing.assert_allclose(trace.output, want, rtol=0, atol=1e-12)


# ---- steps as data: the explanation reads the step's parameters, not its formula --------------------


def test_the_explanation_of_a_cap_reads_its_parameter_not_its_formula(monkeypatch: pytest.MonkeyPatch) -> None:
    from attncli.render.explain import explain_cell, parse_cell

    q, k, v = rand(3, 4), rand(4, 4, seed=1), rand(4, 2, seed=2)
    s = q @ k.T / 2.0  # float64 by hand: √4 = 2
    want = 1.5 * np.tanh(s[1, 2] / 1.5)
    first = engine.attend(q, k, v, softcap=1.5, dtype="float64")
    before = explain_cell(parse_cell(first, "1,2"))
    monkeypatch.setattr(chain.Cap, "formula", lambda self: formula([Name("capped"), " = something else entirely"]))
    trace = engine.attend(q, k, v, softcap=1.5, dtype="float64")
    assert trace.step("capped").formula == "capped = something else entirely"
    after = explain_cell(parse_cell(trace, "1,2"))
    line = next(x for x in after if x.strip().startswith("capped:"))
    assert "1.5 · tanh(" in line and f"{want:.4f}"[:5] in line
    assert after == before
