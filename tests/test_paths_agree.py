"""Every path on the same problems: the explicit path (one block, every step), the blocked path (blocks of queries and
chunks of keys, online softmax) and the torch backend (blocked, or PyTorch's fused kernel where the chain says it
applies) give the same output within float64 rounding, and report the same warnings and fully masked rows.

Reference: a plain float64 loop over rows (the textbook softmax of the masked, capped, biased scores, with the sink as
one more logit), written here from the definitions in shared/CONVENTIONS.md, independent of attncli's stages."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from attncli.core import blocked
from attncli.core.engine import run
from attncli.core.options import Options
from attncli.core.plan import Plan
from attncli.core.problem import Problem

torch = pytest.importorskip("torch")


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, sinks: np.ndarray | None,
              cap: float | None, slopes: np.ndarray | None, scale: float, bias: np.ndarray | None = None) -> np.ndarray:
    """Row by row in float64: s = q·k·scale, capped, + slope·(j - i) + a float mask, masked to -inf, softmax over
    [s | sink]."""
    H, m, _ = q.shape
    n, r = k.shape[1], q.shape[0] // k.shape[0]
    out = np.zeros((H, m, v.shape[-1]))
    for h in range(H):
        for i in range(m):
            s = np.array([q[h, i] @ k[h // r, j] * scale for j in range(n)])
            if cap is not None:
                s = cap * np.tanh(s / cap)
            if slopes is not None:
                s = s + slopes[h] * (np.arange(n) - i)
            if bias is not None:
                s = s + bias[h, i]
            s = np.where(keep[h, i], s, -np.inf)
            logits = list(s) + ([sinks[h]] if sinks is not None else [])
            top = max(logits)
            if top == -math.inf:
                continue  # every key masked (and no finite sink): zero weights, zero output
            e = np.exp(np.array(logits) - top)
            out[h, i] = (e[:n] / e.sum()) @ v[h // r]
    return out


@st.composite
def problems(draw: Any) -> dict[str, Any]:
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 9))
    n = draw(st.integers(1, 9))
    d = draw(st.sampled_from([2, 4]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    spread = draw(st.sampled_from([0.5, 3.0, 30.0]))
    q, k, v = rng.normal(size=(H, m, d)) * spread, rng.normal(size=(G, n, d)) * spread, rng.normal(size=(G, n, 3))
    opts: dict[str, Any] = {"dtype": "float64"}  # K/V with G < H heads: grouped-query (G = 1: broadcast)
    pos = draw(st.sampled_from(["none", "causal", "window", "chunk", "local"]))
    if pos == "causal":
        opts["causal"] = True
    elif pos == "window":
        opts["window"] = draw(st.integers(1, 4))
    elif pos == "chunk":
        opts["chunk"] = draw(st.integers(1, 4))
    elif pos == "local":
        opts["local_window"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        opts["softcap"] = draw(st.sampled_from([1.0, 5.0]))
    alibi = draw(st.booleans())
    sinks = None
    if draw(st.booleans()):
        sinks = np.array([draw(st.sampled_from([-np.inf, -1.0, 0.0, 2.0])) for _ in range(H)])
    # a boolean keep-mask (H, m, n) with some rows fully masked
    mask = rng.random((H, m, n)) < draw(st.sampled_from([1.0, 0.7, 0.3]))
    if m > 1 and draw(st.booleans()):
        mask[:, draw(st.integers(0, m - 1))] = False
    return {"q": q, "k": k, "v": v, "mask": mask, "sinks": sinks, "alibi": alibi, "opts": opts}


def keep_of(p: dict[str, Any], m: int, n: int) -> np.ndarray:
    """The keep-mask the options and the boolean mask say, from their definitions (query i at i, key j at j)."""
    o = p["opts"]
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    keep = np.broadcast_to(p["mask"], p["mask"].shape).copy()
    if o.get("causal"):
        keep &= j <= i
    if "window" in o:
        keep &= (j <= i) & (j > i - o["window"])
    if "chunk" in o:
        keep &= (j <= i) & (j // o["chunk"] == i // o["chunk"])
    if "local_window" in o:
        keep &= np.abs(j - i) <= o["local_window"]
    return keep


def build(p: dict[str, Any], backend: str) -> Problem:
    o = Options(**p["opts"], alibi=p["alibi"], backend=backend)
    return Problem.build(p["q"], p["k"], p["v"], mask=p["mask"], sinks=p["sinks"], options=o)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_path_agrees_on_output_warnings_and_dead_rows(p: dict[str, Any]) -> None:
    problem = build(p, "numpy")
    H, m = p["q"].shape[:2]
    n = p["k"].shape[1]
    d = p["q"].shape[-1]
    slopes = problem.slopes()
    want = reference(p["q"], p["k"], p["v"], keep_of(p, m, n), p["sinks"], p["opts"].get("softcap"), slopes,
                     1 / math.sqrt(d))
    explicit = run(problem)
    traces = {"explicit": explicit}
    assert blocked.supported(problem)
    traces["blocked"] = run(problem, Plan("blocked"))
    tp = build(p, "torch")
    path = "sdpa" if blocked.sdpa_applies(tp) else "blocked"
    event(f"torch: {path}; dead rows: {explicit.dead is not None}")
    traces["torch"] = run(tp, Plan(path))
    for name, t in traces.items():
        out = np.asarray(t["output"] if name != "torch" else t["output"].values.cpu().numpy()
                         if hasattr(t["output"], "cpu") else t["output"], dtype=np.float64)
        assert np.allclose(out, want, rtol=1e-9, atol=1e-9), (name, np.abs(out - want).max())
        assert sorted(t.warnings) == sorted(explicit.warnings), name
        dead = None if t.dead is None else np.broadcast_to(t.dead, (H, m))
        want_dead = None if explicit.dead is None else np.broadcast_to(explicit.dead, (H, m))
        assert (dead is None) == (want_dead is None) and (dead is None or np.array_equal(dead, want_dead)), name


def test_rope_and_qk_norm_agree_on_every_path() -> None:
    # the stages on q and k run once, before either path: with RoPE (each convention, partial, an offset) and QK-norm
    # on either side of it, the three paths give the same output
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(4, 6, 8)), rng.normal(size=(2, 9, 8)), rng.normal(size=(2, 9, 3))
    for rope, width, at in (("half", None, "before-rope"), ("interleaved", 4, "after-rope"),
                            ("half-reversed", None, "after-rope")):
        outs = []
        for backend, plan in (("numpy", None), ("numpy", Plan("blocked")), ("torch", Plan("blocked"))):
            o = Options(rope=rope, rotary_dim=width, q_offset=3, causal=True, qk_norm="rms",
                        qk_norm_at=at, dtype="float64", backend=backend)
            t = run(Problem.build(q, k, v, options=o), plan)
            outs.append(np.asarray(t["output"].cpu().numpy() if hasattr(t["output"], "cpu") else t["output"]))
        assert np.allclose(outs[0], outs[1], rtol=1e-12, atol=1e-12)
        assert np.allclose(outs[0], outs[2], rtol=1e-12, atol=1e-12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_many_blocks_and_key_chunks_with_a_float_mask_agree(p: dict[str, Any]) -> None:
    # the blocked path in blocks of one query and chunks of one key (the online softmax across chunks), with the
    # boolean mask given as a float mask (noise where kept, -inf where dropped): rows whose every key is -inf are the
    # dead rows on every path, whatever their sink (before the fix the blocked path read the row max after the sink
    # column was folded in, so a row with a finite sink was not dead there but was on the explicit path)
    H, m = p["q"].shape[:2]
    n, d = p["k"].shape[1], p["q"].shape[-1]
    noise = np.random.default_rng(m * 31 + n).normal(size=p["mask"].shape)
    bias = np.where(p["mask"], noise, -np.inf)
    fp = dict(p, mask=bias)
    keep = keep_of(p, m, n)
    problem = build(fp, "numpy")
    want = reference(p["q"], p["k"], p["v"], keep, p["sinks"], p["opts"].get("softcap"), problem.slopes(),
                     1 / math.sqrt(d), bias=np.where(keep, noise, 0.0))
    want_dead = ~keep.any(axis=-1)  # (H, m): every key masked
    saved = blocked.BLOCK_ELEMENTS, blocked.MIN_BLOCK, blocked.MIN_KEYS
    blocked.BLOCK_ELEMENTS, blocked.MIN_BLOCK, blocked.MIN_KEYS = 1, 1, 1
    try:
        traces = {"explicit": run(problem), "blocked": run(problem, Plan("blocked")),
                  "torch": run(build(fp, "torch"), Plan("blocked"))}
    finally:
        blocked.BLOCK_ELEMENTS, blocked.MIN_BLOCK, blocked.MIN_KEYS = saved
    for name, t in traces.items():
        out = t["output"]
        out = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out, dtype=np.float64)
        assert np.allclose(out, want, rtol=1e-9, atol=1e-9), (name, np.abs(out - want).max())
        dead = np.zeros((H, m), bool) if t.dead is None else np.broadcast_to(t.dead, (H, m))
        assert np.array_equal(dead, want_dead), name
        assert sorted(t.warnings) == sorted(traces["explicit"].warnings), name


def test_a_row_masked_by_a_float_mask_is_dead_whatever_its_sink() -> None:
    # one query whose every key a float mask sets to -inf, a finite sink (gpt-oss): its weights are 0 (the sink takes
    # the whole row) and it is the one fully masked row on every path; hand-checked: the other rows are the softmax of
    # [s | 0.5] over their keys
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 3, 4)), rng.normal(size=(1, 5, 4)), rng.normal(size=(1, 5, 2))
    mask = np.zeros((1, 3, 5))
    mask[0, 1] = -np.inf
    p = {"q": q, "k": k, "v": v, "mask": mask, "sinks": np.array([0.5]), "alibi": False, "opts": {"dtype": "float64"}}
    for backend, plan in (("numpy", None), ("numpy", Plan("blocked")), ("torch", Plan("blocked"))):
        t = run(build(p, backend), plan)
        assert t.dead is not None and np.array_equal(np.broadcast_to(t.dead, (1, 3)), [[False, True, False]]), plan
        assert len(t.warnings) == 1 and "query 1" in t.warnings[0], (backend, plan, t.warnings)


@pytest.mark.parametrize("mask", [{"causal": True}, {"window": 2}, {"chunk": 3, "q_offset": 4}])
def test_a_half_inputs_overflow_warning_counts_every_score_on_every_path(mask: dict[str, Any]) -> None:
    # float16 inputs whose raw scores q·k pass float16's 65504: the warning names the largest (the first of equals)
    # and counts every raw score beyond it, masked keys included, as the explicit path does over its whole score
    # matrix. Reference: the count and the largest of |q·k| over all (head, query, key), in float64 (grouped-query:
    # query head h reads K head h // 2). Before, the blocked path counted only the keys its blocks could see.
    rng = np.random.default_rng(4)
    q = (rng.normal(size=(1, 4, 7, 4)) * 300).astype(np.float16)
    k = (rng.normal(size=(1, 2, 12, 4)) * 300).astype(np.float16)
    v = rng.normal(size=(1, 2, 12, 3)).astype(np.float16)
    raw = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), np.repeat(k, 2, axis=1).astype(np.float64))
    count = int((np.abs(raw) > 65504).sum())
    b, h, i, j = np.unravel_index(int(np.argmax(np.abs(raw))), raw.shape)
    assert 1 < count < raw.size
    want = f"score query {i} · key {j} (batch {b}, {h}) = {raw[b, h, i, j]:.6g}"
    warned = {}
    for backend, plan in (("numpy", None), ("numpy", Plan("blocked")), ("torch", Plan("blocked"))):
        t = run(Problem.build(q, k, v, options=Options(**mask, backend=backend)), plan)
        found = [w for w in t.warnings if "overflows float16" in w]
        assert len(found) == 1 and f"({count} scores in all)" in found[0], (plan, found)
        warned[(backend, plan)] = found[0]
    assert len(set(warned.values())) == 1
    assert next(iter(warned.values())).startswith(want[:30])
