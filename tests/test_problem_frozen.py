"""The problem is frozen and validated once (issue 30, item 6): Problem.build checks and normalises what it is given
without mutating anything, constructs the value once, and holds every array as a read-only view of the caller's (never
a copy: a memory-mapped .npy stays memory-mapped); the derived fields follow from the others under
dataclasses.replace; the grouped-query rule is one function."""

from __future__ import annotations

import mmap
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attncli.core.engine import run
from attncli.core.options import Options
from attncli.core.problem import Problem, grouped_heads
from attncli.errors import InputError


def _mapped(a: Any) -> bool:
    """Whether ``a`` is a view whose memory is a memory map (its chain of bases ends in an mmap)."""
    while a is not None:
        if isinstance(a, (mmap.mmap, np.memmap)):
            return True
        a = getattr(a, "base", None)
    return False


def test_arrays_are_read_only_views_of_the_callers() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    mask = rng.random((2, 3, 5)) > 0.3
    sinks = np.zeros(1)
    p = Problem.build(q, k, v, mask=mask)
    for name, given in (("q", q), ("k", k), ("v", v), ("mask", mask)):
        a = getattr(p, name)
        assert not a.flags.writeable and np.shares_memory(a, given), name
        with pytest.raises(ValueError):
            a[(0,) * a.ndim] = 1
    assert q.flags.writeable and mask.flags.writeable  # the caller's arrays are untouched
    assert sinks.flags.writeable
    with pytest.raises(FrozenInstanceError):
        p.q = q  # type: ignore[misc]


def test_a_memory_mapped_input_stays_memory_mapped(tmp_path: Path) -> None:
    x = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    p = Problem.build(mm, options=Options(score="dot"))
    assert _mapped(p.q) and np.shares_memory(p.q, mm)
    assert p.k is p.q and p.v is p.q and p.self_attention  # one view for the one array
    # the result is attention on those numbers: row sums 1, and the float64 hand computation
    w = run(p).weights
    s = x.astype(np.float64) @ x.T.astype(np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(w, e / e.sum(axis=-1, keepdims=True), atol=1e-5)


def test_build_does_not_mutate_and_replace_rederives() -> None:
    """Derived fields (K/V heads, batch axes) come from the constructor, also under dataclasses.replace."""
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((1, 4, 3, 8)), rng.standard_normal((1, 2, 3, 8))
    p = Problem.build(q, k, k)
    assert p.kv_heads == 2 and p.n_rep == 2 and p.batch_shape == (1, 4) and p.axis_names == ("batch", "head")
    full = replace(p, k=np.repeat(p.k, 2, axis=1), v=np.repeat(p.v, 2, axis=1))
    assert full.kv_heads is None and full.batch_shape == (1, 4)
    with pytest.raises(InputError, match="K and V need the same heads"):
        replace(p, v=np.zeros((1, 4, 3, 8)))


@pytest.mark.parametrize(("qs", "ks", "vs", "want"), [
    ((1, 8, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), 2),  # grouped-query: 4 query heads per K/V head
    ((1, 8, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4), 1),  # multi-query
    ((8, 3, 4), (1, 3, 4), (1, 3, 4), None),  # 3-D: a batch axis of 1 broadcasts, no heads
    ((8, 3, 4), (2, 3, 4), (2, 3, 4), 2),  # 3-D (H, T, d) with G dividing H
    ((1, 4, 3, 4), (1, 4, 3, 4), (1, 4, 3, 4), None),  # as many heads
])
def test_one_grouped_query_rule(qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], want: int | None) -> None:
    """SDPA enable_gqa / HF repeat_kv: query head h reads K/V head h // (H / G); G must divide H."""
    assert grouped_heads(qs, ks, vs) == want


def test_grouped_query_refuses_what_does_not_divide() -> None:
    with pytest.raises(InputError):
        grouped_heads((1, 6, 3, 4), (1, 4, 3, 4), (1, 4, 3, 4))


def test_a_layer_holds_its_heads_problem_once() -> None:
    """Layer keeps the heads' problem (spec), validated once by Layer.build: its masks, labels, options and the
    valid lengths' limit are the spec's (no Problem built per access); dataclasses.replace(layer, options=...)
    replaces the spec's field; problem(q, k, v) is the spec with the computed Q, K, V."""
    from attncli.core.layer import Layer
    from attncli.core.projections import Projections

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 8))
    w = {n: rng.standard_normal((8, 8)) for n in ("W_q", "W_k", "W_v")}
    lay = Layer.build(x, projections=Projections(**w), heads=2, valid_lens=np.array([3]),
                      query_labels=list("abcde"), options=Options(causal=True))
    assert lay.spec.batch_shape == (1, 2) and lay.batch_shape == (1, 2)
    assert lay.query_limit is lay.spec.query_limit and int(np.asarray(lay.query_limit).max()) == 3
    assert lay.query_labels == list("abcde") and lay.options.causal
    wider = replace(lay, options=Options(causal=False))
    assert not wider.options.causal and wider.spec is not lay.spec and lay.options.causal
    q = np.zeros((1, 2, 5, 4))
    core = lay.problem(q, q, q)
    assert core.q is not None and np.shares_memory(core.q, q) and core.query_labels == list("abcde")
    # the weights: causal and 3 valid keys, against the float64 hand computation on the projections
    t = run(lay)
    qh = (x @ w["W_q"]).reshape(5, 2, 4).transpose(1, 0, 2)
    kh = (x @ w["W_k"]).reshape(5, 2, 4).transpose(1, 0, 2)
    s = qh @ kh.transpose(0, 2, 1) / 2.0  # scaled dot: sqrt(4)
    keep = (np.arange(5)[None, :] <= np.arange(5)[:, None]) & (np.arange(5)[None, :] < 3)
    s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(t.weights, e / e.sum(axis=-1, keepdims=True), atol=1e-12)
