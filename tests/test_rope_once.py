"""RoPE's tables are built once (attncli.core.ops.rope_of): the engine's rotate stage, check's variants and the
port mistakes rotate with the same tables, bit for bit, for every --rope-freqs, rope_rounding, dtype, scaling
type, partial width and offset; the tables themselves agree with transformers' own rotary classes."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from attncli.check.compare import Tolerance
from attncli.check.mistakes_port import rope_q_positions_not_offset
from attncli.check.variants import VARIANTS, Context
from attncli.core import ops
from attncli.core.engine import run
from attncli.core.options import Options
from attncli.core.problem import Problem

SCALINGS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 4},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4},
}
H, M, N, D = 2, 5, 9, 8


def problem(dtype: str = "float64", freqs: str = "float32", rounding: str = "each", scaling: str = "none",
            width: int | None = None, offset: int = 0, mode: str = "half", seed: int = 0) -> Problem:
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(H, M, D)), rng.normal(size=(H, N, D)), rng.normal(size=(H, N, D))
    if dtype == "float16":  # half inputs: computed in float32, the output rounded back
        q, k, v = (a.astype(np.float16) for a in (q, k, v))
    o = Options(rope=mode, rope_base=100.0, rope_freqs=freqs, rope_rounding=rounding, rope_scaling=SCALINGS[scaling],
                rotary_dim=width, q_offset=offset, causal=True,
                dtype="float32" if dtype == "float16" else dtype)
    return Problem.build(q, k, v, options=o)


CASES = list(itertools.product(("float32", "bfloat16", "float16"), ("each", "once", "once-float32"),
                               ("float32", "float64", "float16"), tuple(SCALINGS), (None, 4), (0, 3)))


@pytest.mark.parametrize("freqs,rounding,dtype,scaling,width,offset", CASES)
def test_the_engine_rotates_with_the_one_table(freqs: str, rounding: str, dtype: str, scaling: str,
                                              width: int | None, offset: int) -> None:
    # the engine's q_rot and k_rot are rope_of(problem)'s rotation of the problem's q and k (in the run's dtype):
    # what check's variants and port mistakes call below
    p = problem(dtype, freqs, rounding, scaling, width, offset, mode="interleaved" if offset else "half")
    t = run(p)
    rope = ops.rope_of(p)
    assert rope.tables == ("float64" if dtype == "float64" else "float32") and rope.dim == (width or D)
    held = "float32" if dtype == "float16" else dtype  # half inputs are computed in float32
    got_q = rope.rotate(np, p.q.astype(held), offset + np.arange(M))
    got_k = rope.rotate(np, p.k.astype(held), np.arange(N))
    assert np.array_equal(np.asarray(t["q_rot"]), got_q) and np.array_equal(np.asarray(t["k_rot"]), got_k)


def _context(p: Problem) -> Context:
    ref = run(p)
    return Context.of(p, np.asarray(ref["output"]), "output", Tolerance(1e-9, 0.0, "test"))


@pytest.mark.parametrize("freqs,scaling,width,mode", list(itertools.product(
    ("float32", "bfloat16", "float16"), tuple(SCALINGS), (None, 4), ("half", "interleaved", "half-reversed"))))
def test_rope_on_v_rotates_v_as_the_engine_rotates_k(freqs: str, scaling: str, width: int | None, mode: str) -> None:
    # rope-on-v's V is the engine's k_rot of a problem whose K is that V: the same tables (before this issue the
    # variant built its own float64 tables without --rope-freqs)
    p = problem("float64", freqs, "each", scaling, width, 0, mode)
    c = _context(p)
    VARIANTS["rope-on-v"].fn(c)
    assert c.changed is not None
    same = run(replace(c.problem, k=p.v))
    assert np.array_equal(np.asarray(c.changed.v), np.asarray(same["k_rot"]))


@pytest.mark.parametrize("freqs,scaling,width,mode", list(itertools.product(
    ("float32", "bfloat16", "float16"), tuple(SCALINGS), (None, 4), ("half", "interleaved"))))
def test_the_port_mistake_rotates_as_the_engine_at_offset_zero(freqs: str, scaling: str, width: int | None,
                                                               mode: str) -> None:
    # rope_q_positions_not_offset rotates q at 0..m-1: the engine's q_rot of the same problem at offset 0 (the
    # dynamic scaling's sequence length is the offset problem's, as the mistake's model computed it: scaling 'dynamic'
    # is left out of the comparison where the two lengths differ)
    p = problem("float64", freqs, "each", scaling, width, 3, mode)
    c = _context(p)
    rope_q_positions_not_offset(c)
    assert c.changed is not None
    zero = run(replace(p, options=replace(p.options, q_offset=0)))
    if scaling != "dynamic":
        assert np.array_equal(np.asarray(c.changed.q), np.asarray(zero["q_rot"]))
    assert np.array_equal(np.asarray(c.changed.k), np.asarray(zero["k_rot"]))
    assert np.array_equal(np.asarray(c.changed.k), np.asarray(run(p)["k_rot"]))


@pytest.mark.parametrize("freqs,scaling", list(itertools.product(("float32", "bfloat16", "float16"), tuple(SCALINGS))))
def test_the_tables_are_transformers_rotary_tables(freqs: str, scaling: str) -> None:
    # reference: transformers' LlamaRotaryEmbedding (its rope_parameters for each scaling type), its inv_freq cast as
    # model.to(dtype) leaves it; float32 cos/sin agree to torch's float32 cos/sin (within 2 units in the last place).
    # Dynamic scaling at N = 9 positions > max_position_embeddings 4: transformers recomputes inv_freq in float32
    # (the cast is gone), and so do attncli's tables
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    sc = dict(SCALINGS[scaling] or {"rope_type": "default"})
    mx = sc.pop("max_position_embeddings", 4)
    cfg = transformers.LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H, head_dim=D,
                                   max_position_embeddings=mx,
                                   rope_parameters={"rope_theta": 100.0, **sc})
    rot = LlamaRotaryEmbedding(cfg)
    if freqs != "float32":
        rot.inv_freq = rot.inv_freq.to(getattr(torch, freqs))
    pos = torch.arange(N)[None]
    cos, sin = rot(torch.zeros(1, N, D), pos)
    p = problem("float32", freqs, "each", scaling, None, 0, "half")
    c, s = ops.rope_of(p).cos_sin(np.arange(N))
    assert c.dtype == np.float32
    ulp = np.spacing(np.float32(1.0)) * 2
    assert np.allclose(c, cos[0].numpy(), rtol=0, atol=ulp) and np.allclose(s, sin[0].numpy(), rtol=0, atol=ulp)


@pytest.mark.parametrize("inputs,freqs,rounding,scaling,width,mode", list(itertools.product(
    ("float32", "float16"), ("float32", "bfloat16"), ("each", "once"), ("none", "yarn", "dynamic"), (None, 2),
    ("half", "interleaved"))))
def test_check_rotates_a_float32_or_half_input_as_its_own_computation(inputs: str, freqs: str, rounding: str,
                                                                      scaling: str, width: int | None,
                                                                      mode: str) -> None:
    # check computes in float64 (Context.of): its reference rotates q, k held in float64. rope-on-v's V and the port
    # mistake's q and k are rotated the same way, bit for bit: before, they rotated the float32 or float16 input
    # arrays themselves (the float64 tables cast down to the input's dtype), so a variant differed from the
    # computation it diagnoses by float32's or float16's rounding
    if scaling == "dynamic" and width == 2:
        pytest.skip("refused: see test_dynamic_rope_needs_a_width_above_two")
    rng = np.random.default_rng(7)
    cast = np.float32 if inputs == "float32" else np.float16
    q, k, v = (rng.normal(size=s).astype(cast) for s in ((H, M, D), (H, N, D), (H, N, D)))
    o = Options(rope=mode, rope_base=100.0, rope_freqs=freqs, rope_rounding=rounding, rope_scaling=SCALINGS[scaling],
                rotary_dim=width, q_offset=3, causal=True)
    p = Problem.build(q, k, v, options=o)
    c = _context(p)
    VARIANTS["rope-on-v"].fn(c)
    assert c.changed is not None
    assert np.array_equal(np.asarray(c.changed.v), np.asarray(run(replace(c.problem, k=c.problem.v))["k_rot"]))
    c = _context(p)
    rope_q_positions_not_offset(c)
    assert c.changed is not None
    assert np.array_equal(np.asarray(c.changed.k), np.asarray(c.ref["k_rot"]))
    if scaling != "dynamic":  # dynamic: the offset problem's length sets the tables (see above)
        zero = run(replace(c.problem, options=replace(c.problem.options, q_offset=0)))
        assert np.array_equal(np.asarray(c.changed.q), np.asarray(zero["q_rot"]))


def test_dynamic_rope_needs_a_width_above_two() -> None:
    # dynamic NTK grows the base as ratio^(d / (d - 2)) (transformers' _compute_dynamic_ntk_parameters): a rotary
    # width of 2 divides by zero there; attncli refuses it naming --rope-scaling (before: ZeroDivisionError, exit 70)
    from attncli.errors import InputError

    p = problem("float64", scaling="dynamic", width=2)
    with pytest.raises(InputError, match="dynamic.*width") as e:
        run(p)
    assert "--rope-scaling" in str(e.value)
