"""The one pipeline: the operations of attncli.core.ops composed as attncli.core.chain orders them, returning a Trace.

    1) project   Q = X W_q + b_q, K = Y W_k + b_k, V = Z W_v + b_v    (with projections; OLMo: clamped, q_clip ...;
                 DeepSeek MLA: q_latent, q_latent_norm, kv_latent, kv_latent_norm, k_nope, then q, k, v per head
                 [pe | nope], see _project_latent)
    2) split     (B, T, H·d) -> (B, H, T, d); K/V: G heads              (with projections)
    3)-7)        the stages of attncli.core.chain.STAGES, in its order: on q and k (QK-norm, RoPE, Llama 4's
                 temperature tuning of q),
                 the chain before the softmax (chain.logits), the softmax and its variants
    8) sum       output = weights · V                                  (..., m, n) x (..., n, d_v) -> (..., m, d_v)
    9) merge     concat = the heads side by side; output = concat W_o + b_o   (with projections; BitNet:
                 sub_norm = RMSNorm(concat) before W_o; AFMoE, Laguna: gated = concat ⊙ act(x_norm W_g) before W_o)

Single-head ``run`` and multi-head ``self`` are this one function; :func:`attncli.core.plan.plan`
says whether steps 3-7 run on the whole score matrix (explicit), in blocks of queries, or in
PyTorch's fused kernel (attncli.core.blocked), and which rows a big view computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attncli.core import blocked, chain, ops
from attncli.core.backend import Backend, get_backend, to_numpy
from attncli.core.formula import text
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.params import (
    AlibiFacts,
    Clip,
    Concat,
    Dropout,
    Gated,
    Gating,
    Hard,
    HeadMap,
    HeadMean,
    Initialised,
    Input,
    Normalise,
    Projection,
    Rotation,
    Scaling,
    Scores,
    SharedRopeKey,
    Sink,
    Softmax,
    Tuning,
    Weight,
    WeightedSum,
)
from attncli.core.plan import Plan, plan
from attncli.core.problem import Problem
from attncli.core.projections import LATENT, Gate, Norm, Projections
from attncli.core.scoring import get_score
from attncli.core.trace import FEATURES, KEYS, QUERIES, Trace
from attncli.core.trace import StepName as N
from attncli.core.validate import mapping
from attncli.core.weights import DEFAULT_SEED
from attncli.errors import InputError

Progress = Callable[[int, int], None]
WEIGHT_AXES = ("inputs", "projected")  # rows of W are input features, columns projected features
BIAS_AXES = ("bias", "projected")


def attend(q: Any, k: Any = None, v: Any = None, *, valid_lens: Any = None, mask: Any = None,
           query_labels: list[str] | None = None, key_labels: list[str] | None = None,
           score_weights: dict[str, Any] | None = None, sinks: Any = None, alibi_slopes: Any = None,
           params: dict[str, Any] | None = None, **options: Any) -> Trace:
    """Attention of queries ``q`` over keys ``k`` and values ``v``, returned as a :class:`Trace`.

    ``k`` and ``v`` default to ``q`` (self-attention). Keyword options are the fields of
    :class:`attncli.core.options.Options` (``score``, ``scale``, ``temperature``, ``causal``,
    ``mask_convention``, ``mask_value``, ``dtype``, ``backend``, ``device``, ...).
    ``keep_weights=False`` returns the output alone, computed in blocks of queries (or by torch's
    fused SDPA) without ever holding the ``(..., m, n)`` weights: for long sequences.
    Today's models: K/V with fewer heads than Q on axis -3 (grouped-query), ``rope=``, ``alibi=``,
    ``window=``, ``softcap=``, ``qk_norm=`` (options), ``sinks`` (H,) and ``alibi_slopes`` (H,).
    ``score_weights``: the learned weights of the score (additive's ``W_q``, ``W_k``, ``w_v``; general's ``W``);
    ``params`` is its former name, still accepted.

    >>> import numpy as np
    >>> attend(np.eye(2), score="dot").weights.sum(axis=-1).tolist()
    [1.0, 1.0]
    """
    if params is not None and score_weights is not None:
        raise InputError("give the score's weights once: score_weights= (params= is its former name)",
                         "attend(score_weights=...)")
    weights, given = (score_weights, "score_weights") if score_weights is not None else (params, "params")
    problem = Problem.build(q, k, v, valid_lens=valid_lens, mask=mask, query_labels=query_labels,
                            key_labels=key_labels, score_weights=dict(mapping(weights, f"attend() {given}")),
                            sinks=sinks,
                            alibi_slopes=alibi_slopes,
                            options=Options().merged(options, "attend()"), sources=_api_sources())
    return run(problem)


def multihead(x: Any, memory: Any = None, values: Any = None, *, weights: Projections, heads: int = 1,
              valid_lens: Any = None, key_padding_mask: Any = None, mask: Any = None,
              query_labels: list[str] | None = None, key_labels: list[str] | None = None,
              options: Options | None = None, sources: dict[str, str] | None = None,
              batch_first: bool = True, sinks: Any = None, alibi_slopes: Any = None) -> Trace:
    """Multi-head attention of X over memory Y (values Z; both default to X), step by step: the
    same pipeline as :func:`attend`, on the problem a :class:`Layer` of projections and heads produces."""
    src = {"q": "X", "k": "memory", "v": "values", **_renamed(sources or {})}
    layer = Layer.build(x, memory, values, valid_lens=valid_lens, mask=mask, query_labels=query_labels,
                        key_labels=key_labels, options=options or Options(), sources=src, projections=weights,
                        heads=heads, padding=key_padding_mask, batch_first=batch_first, sinks=sinks,
                        alibi_slopes=alibi_slopes)
    return run(layer)


def _api_sources() -> dict[str, str]:
    return {n: f"attend({n}=...)" for n in ("q", "k", "v", "valid_lens", "mask", "weights", "sinks", "alibi_slopes")} | {
        "query_labels": "attend(query_labels=...)", "key_labels": "attend(key_labels=...)"}


def _renamed(sources: dict[str, str]) -> dict[str, str]:
    """Sources named as the multi-head inputs (x, memory, values) under the problem's names (q, k, v)."""
    names = {"x": "q", "memory": "k", "values": "v"}
    return {names.get(k, k): v for k, v in sources.items()}


def run(problem: Problem | Layer, how: Plan | None = None, backend: Backend | None = None,
        progress: Progress | None = None) -> Trace:
    """Every stage of ``problem`` on its backend, as the plan says (default :func:`attncli.core.plan.plan`
    of what the problem's options ask for), and the Trace (``progress(done, total)`` hears about
    blocks of queries on the output-only path). A :class:`Layer` first projects and splits (steps x,
    x_norm, W_*, q, k, v), its heads' Problem runs the same pipeline, and the heads are merged."""
    how = how or plan(problem)
    p = prepare(problem, backend)
    trace, be = p.trace, p.backend
    out = _attention(p.core, be, p.q, p.k, p.v, p.score_weights, trace, how, progress,
                     "head_output" if p.projected else "output")
    if isinstance(problem, Layer):
        _merge(problem, be, trace, out, p.w)
    if problem.result_dtype:  # half inputs: computed in float32, the output rounded back
        final = trace.step("output")
        final.values = be.cast(final.values, problem.result_dtype)
    return trace


@dataclass
class Prepared:
    """Every stage before the scores (projections, split, QK-norm, RoPE), done once: the per-head
    problem ``core`` and its q, k, v on the backend, the score weights, and the trace so far.
    :func:`run` goes on from here; a viewer computes the weights of some rows at a time from it
    (:func:`attention_weights`)."""

    core: Problem
    backend: Backend
    q: Any
    k: Any
    v: Any
    score_weights: dict[str, Any]  # the score's learned weights, on the backend
    trace: Trace
    projected: bool
    w: dict[str, Any]


def prepare(problem: Problem | Layer, backend: Backend | None = None) -> Prepared:
    """The stages of ``problem`` before its scores (see :class:`Prepared`)."""
    o = problem.options
    be = backend or get_backend(o.backend, o.device)
    dt = problem.dtype
    trace = Trace(query_labels=problem.query_labels, key_labels=problem.key_labels)
    score = get_score(o.score)
    m = trace.meta
    m.score, m.score_formula, m.backend, m.device, m.dtype = score.name, score.formula, be.name, be.device_name(), dt
    projected = isinstance(problem, Layer)
    if isinstance(problem, Layer):
        core, q, k, v, w = _project_inputs(problem, be, trace)
    else:
        core, w = problem, {}
        q, k, v = (be.asarray(a, dt) for a in (problem.q, problem.k, problem.v))
        m.shapes = {"q": list(problem.q.shape), "k": list(problem.k.shape), "v": list(problem.v.shape)}
        if "head" in problem.axis_names:  # 4-D (B, H, T, d): the explanations and views name the head axis
            m.batch_axes, m.head_axis = list(problem.axis_names), len(problem.axis_names) - 1
        trace.inputs.update(q=q, k=k, v=v)
    m.self_attention = problem.self_attention
    core, q, k = _before_scores(core, be, q, k, trace)
    if core.n_rep > 1:
        m.kv_heads, m.n_rep = core.kv_heads, core.n_rep
    weights = {name: be.asarray(a, dt) for name, a in problem.score_weights.items()}
    record_score_weights(problem, weights, trace)
    return Prepared(core, be, q, k, v, weights, trace, projected, w)


def _index(trace: Trace, name: str) -> int:
    return trace.names().index(name)


# ---- 1) project, 2) split ---------------------------------------------------------------------


def produce(layer: Layer, backend: Backend | None = None) -> Problem:
    """The core Problem ``layer`` produces: Q = X W_q + b_q (after its pre-norm), K, V, split into
    heads (B, H, T, d) and (B, G, S, d), every mask, bias and option handed on (steps not kept)."""
    be = backend or get_backend(layer.options.backend, layer.options.device)
    return _project_inputs(layer, be, Trace())[0]


def _project_inputs(layer: Layer, be: Backend, t: Trace) -> tuple[Problem, Any, Any, Any, dict[str, Any]]:
    """Project X, Y, Z and split them into heads: the steps x, W_*, q, k, v; returns the problem the
    layer produces (its Q, K, V the split projections) and the split arrays on the backend."""
    proj = layer.projections
    xp, dt, H = be.xp, layer.dtype, layer.heads
    memory, values = layer.memory is not layer.x, layer.values is not layer.memory
    w = {n: be.asarray(a, dt) for n, a in proj.arrays().items()}
    X = be.asarray(layer.x, dt)
    residual = layer.pre_norm is not None
    lead = _lead(layer)
    t.meta.shapes = {"x": list(np.shape(lead(layer.x)))} | (
        {"memory": list(np.shape(lead(layer.memory)))} if memory else {}) | (
        {"values": list(np.shape(lead(layer.values)))} if values else {})
    t.add("x", X, (QUERIES, FEATURES), params=Input("X", residual, layer.batched))
    if layer.pre_norm is not None:  # --from-residual: the layer's own pre-attention norm
        X = _pre_norm(layer.pre_norm, be, X, dt, t, layer.options.rms_wide)
    Y = X if not memory else be.asarray(layer.memory, dt)
    Z = Y if not values else be.asarray(layer.values, dt)
    if memory:
        t.add("memory", Y, (KEYS, FEATURES), params=Input("Y"))
    if values:
        t.add("values", Z, (KEYS, FEATURES), params=Input("Z"))
    config_note = [f"{proj.source}, {proj.kind} layout; from config.json: "
                   + ", ".join(f"{k} {v}" for k, v in proj.config.items())] if proj.config else None
    if proj.latent is not None:  # DeepSeek's multi-head latent attention: Q, K, V from low-rank latents of X
        q, k, v = _project_latent(layer, be, t, X, w, config_note)
    else:
        for n in ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v"):
            _weight(t, proj, w, n)
        q = ops.project(xp, X, w["W_q"], w.get("b_q"))  # (B, T, D) x (D, d_k) -> (B, T, d_k)
        k = ops.project(xp, Y, w["W_k"], w.get("b_k"))  # (B, S, D_k) x (D_k, d_k) -> (B, S, d_k)
        v = ops.project(xp, Z, w["W_v"], w.get("b_v"))  # (B, S, D_v) x (D_v, d_v) -> (B, S, d_v)
        y_name, z_name = ("Y" if memory else "X"), ("Z" if values else ("Y" if memory else "X"))
        t.add("q", q, (QUERIES, FEATURES), config_note, _projection(proj, w, "X", "q"))
        t.add("k", k, (KEYS, FEATURES), params=_projection(proj, w, y_name, "k"))
        t.add("v", v, (KEYS, FEATURES), params=_projection(proj, w, z_name, "v"))
    clip = layer.options.clip_qkv
    if clip is not None:  # OLMo: q, k, v clamped to [-C, C] right after the projections
        q, k, v = (_clip(t, be, a, name, clip, axes) for a, name, axes in
                   ((q, "q", (QUERIES, FEATURES)), (k, "k", (KEYS, FEATURES)), (v, "v", (KEYS, FEATURES))))
    G = layer.kv_heads or H  # K/V heads: fewer than H with grouped-query attention
    qh = ops.split_heads(xp, q, H)  # (B, T, H·d) -> (B, H, T, d)
    kh, vh = ops.split_heads(xp, k, G), ops.split_heads(xp, v, G)  # (B, S, G·d) -> (B, G, S, d)
    m = t.meta
    m.heads, m.head_width = H, {"q": proj.d_k // H, "k": proj.d_k // H, "v": proj.d_v // H}
    m.self_attention, m.batched, m.weights_format, m.weights_source = (layer.self_attention, layer.batched,
                                                                        proj.kind, proj.source)
    m.config = dict(proj.config) if proj.config else None
    if proj.kind.startswith("init"):
        m.seed = DEFAULT_SEED if layer.options.seed is None else layer.options.seed
    m.batch_axes, m.head_axis = (["batch", "head"], 1) if layer.batched else (["head"], 0)
    core = layer.problem(to_numpy(qh), to_numpy(kh), to_numpy(vh))  # the attention of each head
    return core, qh, kh, vh, w


def _project_latent(layer: Layer, be: Backend, t: Trace, X: Any, w: dict[str, Any],
                    notes: list[str] | None) -> tuple[Any, Any, Any]:
    """DeepSeek's multi-head latent attention (attncli.core.projections.Latent): the steps q_latent, q_latent_norm
    (with W_qa), q, kv_latent, kv_latent_norm, k_nope, k, v. Each head's q and k are put [pe | nope] (HF keeps
    [nope | pe]): the same order in both leaves every q·k unchanged, and RoPE turns each head's first d_rope
    features. Returns Q (B, T, H·(r+n)), K (B, S, H·(r+n)), V (B, S, H·d_v)."""
    L, xp, dt, H = layer.projections.latent, be.xp, layer.dtype, layer.heads
    assert L is not None
    proj, n, r = layer.projections, L.d_nope, L.d_rope
    latent_w = {nm: a for nm, a in w.items() if nm in LATENT}
    for nm in ("W_qa", "b_qa"):
        _weight(t, replace(proj, origin={**proj.origin, **L.origin}), latent_w, nm)

    def norm(name: str, a: Any, wt: Any, of: str, where: str) -> Any:
        y = ops.rms_norm(xp, a, be.asarray(wt, dt), L.eps)
        t.add(name, y, (QUERIES if name.startswith("q") else KEYS, FEATURES),
              params=Normalise("rms", L.eps, True, where, step=name, of=of))
        return y

    src = "X"
    if L.W_qa is not None and L.q_a_norm is not None:  # q_lora_rank: Q through its own latent
        ql = ops.project(xp, X, w["W_qa"], w.get("b_qa"))  # (B, T, D) x (D, r_q) -> (B, T, r_q)
        t.add("q_latent", ql, (QUERIES, FEATURES),
              params=Projection("X", "W_qa", "b_qa" if "b_qa" in w else None, L.origin.get("W_qa")))
        src = "q_latent_norm"
        X_q = norm(src, ql, L.q_a_norm, "q_latent", L.origin.get("q_a_norm", "q_a_norm"))
    else:
        X_q = X
    _weight(t, proj, w, "W_q")
    q = ops.rope_first(xp, ops.project(xp, X_q, w["W_q"]), H, n)  # (B, T, r_q) x (r_q, H·(n+r)) -> (B, T, H·(r+n))
    t.add("q", q, (QUERIES, FEATURES), notes, Projection(src, "W_q", None, proj.origin.get("W_q"), latent=(r, n)))
    for nm in ("W_kva", "b_kva"):
        _weight(t, replace(proj, origin={**proj.origin, **L.origin}), latent_w, nm)
    kv = ops.project(xp, X, w["W_kva"], w.get("b_kva"))  # (B, S, D) x (D, r_kv + r) -> (B, S, r_kv + r)
    r_kv = int(L.kv_a_norm.shape[0])
    t.add("kv_latent", kv, (KEYS, FEATURES),
          params=Projection("X", "W_kva", "b_kva" if "b_kva" in w else None, L.origin.get("W_kva"), latent=(r_kv, r)))
    c = norm("kv_latent_norm", kv[..., :r_kv], L.kv_a_norm, "c", L.origin.get("kv_a_norm", "kv_a_norm"))
    for nm in ("W_k", "W_v"):
        _weight(t, proj, w, nm)
    k_nope = ops.project(xp, c, w["W_k"])  # (B, S, r_kv) x (r_kv, H·n) -> (B, S, H·n)
    t.add("k_nope", k_nope, (KEYS, FEATURES),
          params=Projection("kv_latent_norm", "W_k", None, proj.origin.get("W_k"), out="k_nope"))
    k = ops.shared_rope_keys(xp, k_nope, kv[..., r_kv:], H)  # (B, S, H·n), (B, S, r) -> (B, S, H·(r+n))
    t.add("k", k, (KEYS, FEATURES), params=SharedRopeKey(r))
    v = ops.project(xp, c, w["W_v"])  # (B, S, r_kv) x (r_kv, H·d_v) -> (B, S, H·d_v)
    t.add("v", v, (KEYS, FEATURES), params=Projection("kv_latent_norm", "W_v", None, proj.origin.get("W_v")))
    return q, k, v


def _clip(t: Trace, be: Backend, a: Any, name: str, c: float, axes: tuple[str, str]) -> Any:
    """The step {name}_clip = clamp({name}, -c, c) (OLMo's clip_qkv), returned."""
    y = be.xp.clip(a, -c, c)
    t.add(f"{name}_clip", y, axes, params=Clip(c, name))
    return y


def _pre_norm(norm: Norm, be: Backend, X: Any, dt: str, t: Trace, wide: bool = False) -> Any:
    """X through the layer's pre-attention norm (LayerNorm or RMSNorm over the features): the step x_norm."""
    xp = be.xp
    w = be.asarray(norm.w, dt)
    if norm.kind == "layernorm":
        b = None if norm.b is None else be.asarray(norm.b, dt)
        y = ops.layer_norm(xp, X, w, b, norm.eps)
    else:
        y = ops.rms_norm(xp, X, w, norm.eps, plus_one=norm.kind == "rms1p", wide_weight=wide)
    t.add("x_norm", y, (QUERIES, FEATURES), params=Normalise(norm.kind, norm.eps, True, norm.origin or None))
    return y


def _weight(t: Trace, proj: Projections, w: dict[str, Any], n: str) -> None:
    if n not in w:
        return
    par = Weight(proj.origin.get(n), n)
    if n.startswith("W"):
        t.add(n, w[n], WEIGHT_AXES, params=par)
    else:
        t.add(n, w[n][None, :], BIAS_AXES, params=par)


def _projection(proj: Projections, w: dict[str, Any], source: str, name: str) -> Projection:
    return Projection(source, f"W_{name}", f"b_{name}" if f"b_{name}" in w else None, proj.origin.get(f"W_{name}"))


# ---- normalise, rotate: each head's q and k on their own (once, for every path) ---------------------


def _before_scores(problem: Problem, be: Backend, q: Any, k: Any, t: Trace) -> tuple[Problem, Any, Any]:
    """The chain's stages on q and k (QK-norm of each head's q and k, RoPE at positions P + i and j, Llama 4's tuning
    of q), in the order attncli.core.chain.needed decides for the problem, each recorded as its steps; the problem
    with the transformed q and k. K keeps its own K/V heads; its steps show them per query head (head h: K/V head
    h // r)."""
    stages = [st for st in chain.needed(problem) if st.qk is not None]
    if not stages:
        return problem, q, k
    r = problem.n_rep
    kv_note = [f"grouped-query: query head h reads K/V head h // {r} (the {problem.kv_heads} K/V heads shown per "
               "query head)"] if r > 1 else []
    for st in stages:
        assert st.qk is not None
        q, k = st.qk(problem, be, q, k)
        _RECORD_QK[st.name](problem, be, q, k, t, kv_note)
    return replace(problem, q=to_numpy(q), k=to_numpy(k)), q, k


def _tuning_steps(problem: Problem, be: Backend, q: Any, k: Any, t: Trace, kv_note: list[str]) -> None:
    """Llama 4's temperature tuning (its NoPE layers): q_i multiplied by log(floor((P + i + 1) / F) + 1) · a + 1,
    the factor in float32 as HF computes it: the step q_temp."""
    o, P = problem.options, problem.query_offset
    f = chain.query_factors(problem)
    done = [s for s in ("q_rot", "q_norm") if s in t]  # the later of the two (QK-norm after RoPE: Llama 4)
    before = max(done, key=t.names().index) if done else "q"
    t.add("q_temp", q, (QUERIES, FEATURES),
          params=Tuning(o.tuning_scale or 0.0, o.tuning_floor, P, before, float(f[0]), float(f[-1])))


def _shown(problem: Problem, be: Backend, a: Any) -> Any:
    """K's steps with one entry per query head, as the scores have them."""
    r = problem.n_rep
    return ops.expand_kv(be.xp, a, r) if r > 1 else a


def _qk_norm_steps(problem: Problem, be: Backend, q: Any, k: Any, t: Trace, kv_note: list[str]) -> None:
    """The steps q_norm and k_norm: the QK-norm kind of the options (attncli.core.ops.qk_norm)."""
    o, dt, d = problem.options, problem.dtype, problem.d_qk
    kind = str(o.qk_norm)
    for name, y in (("q", q), ("k", k)):
        given = getattr(problem, f"{name}_norm") is not None
        wt, bias = chain.qk_norm_weights(problem, name)
        per_head = given and np.ndim(wt) == 2 and kind != "rms-full"
        heads = int(y.shape[-3]) if y.ndim >= 3 else 1
        t.add(f"{name}_norm", y if name == "q" else _shown(problem, be, y), (QUERIES if name == "q" else KEYS, FEATURES),
              notes=kv_note if name == "k" else None,
              params=Normalise(kind, o.norm_eps, given, None, per_head, bias is not None, o.qk_norm_at, f"{name}_norm",
                               d=d, heads=heads, bias_per_head=np.ndim(bias) == 2))
        t.inputs[f"{name}_norm_weight"] = be.asarray(wt, dt)
        if bias is not None:
            t.inputs[f"{name}_norm_bias"] = be.asarray(bias, dt)


def _rope_steps(problem: Problem, be: Backend, q: Any, k: Any, t: Trace, kv_note: list[str]) -> None:
    """The steps q_rot and k_rot: RoPE at positions P + i (queries) and j (keys)."""
    o, d = problem.options, problem.d_qk
    rope = ops.rope_of(problem)  # what chain's rotate stage rotated with (check's RoPE uses the same)
    base, rd, factor, P = rope.base, rope.dim, rope.factor, problem.query_offset
    held = [f"inverse frequencies held in {o.rope_freqs} (as model.to({o.rope_freqs}) leaves transformers' inv_freq; "
            "from_pretrained(dtype=...) keeps them in float32)"] if rope.freqs != "float32" else [
        f"inverse frequencies in float32 despite --rope-freqs {o.rope_freqs}: dynamic scaling beyond "
        "max_position_embeddings has transformers recompute them in float32"] if o.rope_freqs != "float32" else []
    normed = o.qk_norm is not None and o.qk_norm_at == "before-rope"
    rotation = Rotation(rope.mode, base, rd, P, factor, rope.scaling, d=d)
    for name, y in (("q", q), ("k", k)):
        t.add(f"{name}_rot", y if name == "q" else _shown(problem, be, y), (QUERIES if name == "q" else KEYS, FEATURES),
              notes=(kv_note if name == "k" else []) + held or None,
              params=rotation._replace(of=name, before=f"{name}_norm" if normed else name))
    t.meta.rope = rotation


_RECORD_QK: dict[N, Callable[[Problem, Backend, Any, Any, Trace, list[str]], None]] = {
    N.Q_NORM: _qk_norm_steps, N.Q_ROT: _rope_steps, N.Q_TEMP: _tuning_steps}


# ---- 3) - 8) the attention of each (batch, head) --------------------------------------------------


def _attention(problem: Problem, be: Backend, q: Any, k: Any, v: Any, params: dict[str, Any], trace: Trace,
               how: Plan, progress: Progress | None, out_name: str) -> Any:
    """Scores to output, on the path the plan names: the output (..., m, d_v)."""
    if how.path == "explicit":
        k, v = _expanded(problem, be, k), _expanded(problem, be, v)
        if how.rows is not None:  # the queries ``rows`` alone, each against every key (check's sampled screen)
            index = np.asarray(how.rows)
            q = be.xp.take(q, be.asarray(index, "int64") if be.name == "torch" else index, axis=-2)  # (..., rows, d)
        w = attention_weights(problem, be, q, k, params, trace, rows=None if how.rows is None else np.asarray(how.rows))
        out = ops.weighted_sum(w, v)  # (..., m, n) x (..., n, d_v) -> (..., m, d_v)
        if problem.result_dtype:
            trace.warnings.extend(m for m in [blocked.score_overflow(problem, trace.step("scores").values)] if m)
        trace.meta.path = "explicit"
        trace.add(out_name, out, (QUERIES, FEATURES), params=WeightedSum(out_name, trace.meta.weights_step or "weights"))
        return out
    out = blocked.output_only(problem, be, q, k, v, params, trace, progress, sdpa=how.path == "sdpa")
    if how.rows is not None:
        _corner_rows(problem, be, q, _expanded(problem, be, k), params, trace, list(how.rows))
    trace.add(out_name, out, (QUERIES, FEATURES), params=WeightedSum(out_name))
    return out


def _expanded(problem: Problem, be: Backend, a: Any) -> Any:
    """K or V with one head per query head (grouped-query: query head h reads K/V head h // r)."""
    return ops.expand_kv(be.xp, a, problem.n_rep) if problem.n_rep > 1 else a


def _corner_rows(problem: Problem, be: Backend, q: Any, k: Any, params: dict[str, Any], trace: Trace,
                 rows: list[int]) -> None:
    """The steps up to the weights for the queries ``rows`` only (the first and last rows a view of a
    big problem shows), each row against every key, so the numbers shown are exact. Steps with a
    table per query (additive's features) are left out."""
    index = np.asarray(rows)
    qr = be.xp.take(q, be.asarray(index, "int64") if be.name == "torch" else index, axis=-2)  # (..., rows, d)
    part = Trace(query_labels=problem.query_labels, key_labels=problem.key_labels)
    attention_weights(problem, be, qr, k, params, part, rows=index)  # its warnings: the output's run has them
    for step in part.steps:
        if step.numpy().ndim > qr.ndim:  # one table per query (additive's features): left out of the summary
            continue
        if step.axes[0] == QUERIES:
            step.rows = list(rows)
        trace.steps.append(step)
    trace.meta.weights_step, trace.meta.scaling = part.meta.weights_step, part.meta.scaling


@np.errstate(over="ignore", invalid="ignore")  # overflow is reported by check_scores, as one line
def attention_weights(problem: Problem, be: Backend, q: Any, k: Any, params: dict[str, Any],
                      trace: Trace, rows: np.ndarray | None = None, keys: int | None = None) -> Any:
    """Scores, scaling, masking, softmax and the softmax's variants for ``q`` against ``k``: adds the
    steps and returns the weights that multiply V. ``rows``: ``q`` holds only these queries of the
    problem (their masks are taken for them). ``keys``: against the first ``keys`` keys only (the steps
    are (..., b, keys)): the caller knows that the mask hides every later key from every row of ``q``
    (see :func:`hidden_after`), so their weights are exactly 0."""
    o, xp = problem.options, be.xp
    score = get_score(o.score)

    def record(st: chain.Stage, s: Any, par: Any) -> None:  # each stage of the chain: a step
        if st.name == N.SCORES:
            trace.add(N.SCORES, s, params=Scores(score.name, score.symbol))
            return
        if isinstance(par, chain.Scale):  # for explanations
            trace.meta.scaling = Scaling(text(par.rule), par.factor if isinstance(par.factor, (int, float)) else None,
                                         par.temperature, par.name, problem.d_qk, problem.n)
        if isinstance(par, chain.Bias) and par.alibi is not None:
            trace.meta.alibi = AlibiFacts(par.alibi.q_offset, par.alibi.slopes, par.alibi.form, par.alibi.r)
        if hasattr(par, "before"):  # the step it follows in this run (the chain's stages that apply)
            prev = trace.steps[-1].name  # a NamedTuple (attncli's) or a dataclass (a stage added elsewhere)
            par = par._replace(before=prev) if hasattr(par, "_replace") else replace(par, before=prev)
        trace.add(st.step(problem), s, notes=_notes(par), params=par)

    # the chain before the softmax: chain.logits, its stages in chain.STAGES's order
    if problem.mask is not None and problem.mask.dtype != bool and \
            bool(np.all((problem.mask == 0) | (problem.mask == 1))):
        trace.warnings.append(f"the mask from {problem.where('mask')} holds only 0s and 1s as floats: it is added to the "
                              "scores, not used to keep or drop keys (save it as booleans or integers for that)")
    if N.SCALED not in [st.name for st in chain.needed(problem)]:  # no scaled step: the rule is still told
        name = chain.scale_name(problem)
        trace.meta.scaling = Scaling(text(chain.scale_rule(name, o.scale, problem.d_qk, problem.n)), None, o.temperature)
    blk = chain.block(problem, be, rows)
    if keys is not None:  # (..., n, d) -> (..., keys, d): the keys after are masked for every row
        blk, k = blk.cols(slice(0, keys)), k[..., :keys, :]
    lg = chain.logits(problem, q, k, params, blk, record, trace)
    raw, s, keep = lg.unmasked, lg.s, lg.keep

    ops.check_scores(problem, xp, raw, s, keep)  # the overflow rule of every path
    w = _softmax_step(problem, be, s, keep, trace, rows)
    w = _weights_steps(problem, be, w, trace)
    trace.meta.weights_step = trace.steps[-1].name
    return w


TRIMMABLE_SCORES = frozenset({"dot", "scaled-dot", "general", "cosine"})  # one score per (query, key), from q and k


def hidden_after(problem: Problem, rows: np.ndarray) -> int | None:
    """The number of leading keys that the queries ``rows`` can see when the mask hides every later key from each
    of them (a causal block's keys after its last query), so that their softmax over those keys alone gives the
    same weights (the later keys' exps are exactly 0); None when that is not so or not known (a --mask-value,
    hard attention or dropout, a score that is not one per (query, key) pair)."""
    o = problem.options
    if o.mask_value is not None or o.hard or o.dropout > 0 or get_score(o.score).name not in TRIMMABLE_SCORES:
        return None
    keep, _ = ops.keep_mask(problem, problem.n, rows)
    if keep is None or keep.shape[-1] != problem.n:
        return None
    seen = np.flatnonzero(np.any(keep.reshape(-1, problem.n), axis=0))  # (n,): keys some row of the block keeps
    hi = int(seen[-1]) + 1 if seen.size else problem.n
    return hi if hi < problem.n else None


def _softmax_step(problem: Problem, be: Backend, s: Any, keep: Any, trace: Trace, rows: np.ndarray | None) -> Any:
    """6) the softmax over keys the problem asks for (ops.softmax_of: stable, with its sinks; a row with every key
    masked gets zero weights): the steps sink and softmax (weights), the dead rows and their warnings."""
    o, xp = problem.options, be.xp
    before = trace.steps[-1].name
    name = "softmax" if o.hard or o.dropout > 0 else "weights"
    top = xp.max(s, axis=-1, keepdims=True)  # each row's max: the softmax's shift and the dead rows' test
    w = ops.softmax_of(problem, xp, s, None if problem.sinks is None else be.asarray(problem.sinks, problem.dtype), top)
    if problem.sinks is not None:  # one more logit per head in the denominator, its column dropped
        trace.meta.sinks = [float(x) for x in problem.sinks]
        trace.add("sink", 1.0 - xp.sum(w, axis=-1, keepdims=True), (QUERIES, "sink"),
                  notes=["sinks per head: " + ", ".join(f"{x:.6g}" for x in problem.sinks[:8])
                         + (", …" if len(problem.sinks) > 8 else "")], params=Sink(tuple(trace.meta.sinks), before))
    dead = ops.dead_rows(xp, s, keep, top)
    trace.dead = dead if rows is None else None
    if dead is not None and rows is None:  # for some rows only: the run of the output names them
        trace.warnings.extend(ops.dead_row_messages(problem, dead))
    trace.add(name, w, params=Softmax(before, problem.sinks is not None, name))
    return w


def _weights_steps(problem: Problem, be: Backend, w: Any, trace: Trace) -> Any:
    """7) the chain's stages on the weights (hard attention, dropout), each its own step: the last one is what the
    output uses."""
    o = problem.options
    seed = o.seed if o.seed is not None else DEFAULT_SEED
    for st in chain.needed(problem):
        if st.weights is None:
            continue
        prev = trace.steps[-1].name
        w = st.weights(problem, be, w)
        if st.name == N.HARD:
            trace.add("hard", w, params=Hard(prev))
        else:
            trace.add("dropout", w, params=Dropout(o.dropout, seed, prev))
    return w


# ---- 9) merge ---------------------------------------------------------------------------------------


def _merge(problem: Layer, be: Backend, t: Trace, heads_out: Any, w: dict[str, Any]) -> None:
    """The heads side by side (concat), W_o and b_o, the head-averaged weights; the per-head steps
    marked as such; an unbatched input's batch axis dropped from every step."""
    xp, H = be.xp, problem.heads
    proj = problem.projections
    concat = ops.merge_heads(xp, heads_out)  # (B, H, T, d_v/H) -> (B, T, d_v)
    start = _index(t, "v_clip" if "v_clip" in t else "v") + 1
    split = _split_note(H, proj.d_k // H, proj.d_v // H)
    per_head = []
    for s in t.steps[start:]:
        per_head.append(s.name)
        s.per_head = True
        if s.name == "scores":
            s.notes = [*s.notes, split]
            if problem.kv_heads:
                r = problem.n_rep
                s.params = s.params._replace(heads=HeadMap(H, problem.kv_heads, r))
                s.notes.append(f"grouped-query: K and V have {problem.kv_heads} heads of {proj.d_k // H} and "
                               f"{proj.d_v // H} features; query head h reads K/V head h // {r} (as SDPA enable_gqa, "
                               "HF repeat_kv)")
    t.meta.per_head_steps = per_head
    has_o = "W_o" in w
    t.add("concat" if has_o else "output", concat, (QUERIES, FEATURES), params=Concat("concat" if has_o else "output", H))
    out = concat
    if problem.gate is not None:  # AFMoE / Laguna: concat ⊙ act(x_norm · W_g) before W_o
        out = _gate(problem.gate, be, out, problem.dtype, t)
    if problem.sub_norm is not None:  # BitNet: an RMSNorm of the concatenated heads before W_o
        out = _sub_norm(problem.sub_norm, be, out, problem.dtype, t, problem.options.rms_wide)
    if has_o:
        _weight(t, proj, w, "W_o")
        _weight(t, proj, w, "b_o")
        into = t.steps[-3 if "b_o" in w else -2].name  # the step before W_o (b_o): concat, gated or sub_norm
        out = ops.project(xp, out, w["W_o"], w.get("b_o"))  # (B, T, d_v) x (d_v, d_out) -> (B, T, d_out)
        t.add("output", out, (QUERIES, FEATURES),
              params=Projection(into, "W_o", "b_o" if "b_o" in w else None, proj.origin.get("W_o")))
    if "weights" in t:
        ws = t.step(t.meta.weights_step or "weights")
        t.add("avg_weights", xp.mean(ws.values, axis=1), (QUERIES, KEYS), params=HeadMean())  # (B, H, T, S) -> (B, T, S)
        t.steps[-1].rows = ws.rows
    if t.dead is not None:
        t.warnings.extend(_output_rows_note(problem, t.dead, "b_o" in w, has_o))
    t.seq_first = problem.batched and not problem.batch_first
    if not problem.batched:
        for s in t.steps:
            if s.name not in {"W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o", *LATENT, "W_g"}:
                s.values = s.values[0]
        t.dead = None if t.dead is None else t.dead[0]



def _sub_norm(norm: Norm, be: Backend, c: Any, dt: str, t: Trace, wide: bool = False) -> Any:
    """The concatenated heads through BitNet's attn_sub_norm (an RMSNorm over the width, as HF's BitNetRMSNorm:
    in float32 for half inputs, cast back, then times w): the step sub_norm."""
    y = ops.rms_norm(be.xp, c, be.asarray(norm.w, dt), norm.eps, wide_weight=wide)
    t.add("sub_norm", y, (QUERIES, FEATURES), params=Normalise("rms", norm.eps, True, norm.origin or None, step="sub_norm"))
    return y


def _gate(gate: Gate, be: Backend, c: Any, dt: str, t: Trace) -> Any:
    """The output gate (AFMoE's gate_proj: sigmoid, Laguna's g_proj: softplus): gate = act(x_norm · W_g), from the
    attention's input after its pre-norm, and gated = concat ⊙ gate (per head: each head's features times its one
    gate). The steps W_g, gate, gated; returns gated."""
    src = "x_norm" if "x_norm" in t else "x"
    x = t.step(src).values  # (B, T, D): the attention's input, as the projections took it
    w = be.asarray(gate.w, dt)
    per_head = int(gate.w.shape[1]) != int(c.shape[-1])
    t.add("W_g", w, WEIGHT_AXES, params=Weight(gate.origin or None, "W_g"))
    z = ops.project(be.xp, x, w)  # (B, T, D) x (D, n) -> (B, T, n)
    g = ops.gate_values(be.xp, z, gate.act)
    t.add("gate", g, (QUERIES, FEATURES), params=Gating(gate.act, src, per_head, gate.origin or None))
    y = ops.gated(be.xp, c, g)
    t.add("gated", y, (QUERIES, FEATURES), params=Gated(per_head))
    return y


def _output_rows_note(problem: Layer, dead: np.ndarray, has_b_o: bool, has_o: bool) -> list[str]:
    """What a query whose every head is fully masked gets as its output row: b_o (or zero)."""
    every = np.asarray(np.broadcast_to(dead, problem.batch_shape + (problem.m,)).all(axis=1))  # (B, T)
    labels, out = problem.query_labels, []
    what = "b_o (the zero concat times W_o, plus b_o)" if has_o and has_b_o else "zero"
    for b in range(every.shape[0]):
        rows = [f"{labels[i]!r}" if labels else str(i) for i in np.flatnonzero(every[b])]
        if rows:
            where = f" (batch {b})" if problem.batched else ""
            shown = ", ".join(rows[:10]) + (f" and {len(rows) - 10} more" if len(rows) > 10 else "")
            out.append(f"query {shown}{where}: every head is fully masked, so the final output row is {what}")
    return out


def _lead(problem: Layer) -> Callable[[Any], Any]:
    def lead(a: Any) -> Any:  # the shape as the user gave it (an unbatched input has no batch axis)
        return a if problem.batched else a[0]

    return lead


def _split_note(H: int, dh: int, dvh: int) -> str:
    """Which features of Q, K (and V) each head takes, e.g. 'head 0: d0…d3, head 1: d4…d7'."""
    def span(h: int, d: int) -> str:
        return f"d{h * d}" if d == 1 else f"d{h * d}…d{(h + 1) * d - 1}"

    shown = ", ".join(f"head {h}: {span(h, dh)}" + (f" (V {span(h, dvh)})" if dvh != dh else "") for h in range(min(H, 8)))
    return f"each head takes its own {dh} feature(s) of Q and K: {shown}{', …' if H > 8 else ''}"


def record_score_weights(problem: Problem | Layer, params: dict[str, Any], trace: Trace) -> None:
    """The score weights used: in ``trace.inputs`` (NPZ) and ``trace.extra["params"]`` (JSON)."""
    if not params:
        return
    prefix = "score_" if isinstance(problem, Layer) else ""
    trace.inputs.update({prefix + n: a for n, a in params.items()})
    trace.extra["params"] = {name: to_numpy(w).tolist() for name, w in params.items()}
    if problem.initialised:
        o = problem.options
        hidden = (problem.d_qk if o.hidden is None else o.hidden) if "hidden" in get_score(o.score).options else None
        trace.meta.params_initialised = Initialised(
            tuple(problem.initialised), DEFAULT_SEED if o.seed is None else o.seed,
            "nn.Linear style: uniform on ±1/sqrt(fan_in), from numpy.random.default_rng(seed)", hidden)


def _notes(par: Any) -> list[str] | None:
    if isinstance(par, chain.Bias) and par.alibi is not None:
        sl = par.alibi.slopes
        return ["slopes per head: " + ", ".join(f"{x:.6g}" for x in sl[:8]) + (", …" if len(sl) > 8 else "")]
    return None


def select_head(trace: Trace, head: int) -> Trace:
    """A view of ``trace`` with only head ``head`` of the per-head steps (for the terminal)."""
    H = trace.meta.heads or 1
    if not 0 <= head < H:
        raise InputError(f"head {head} does not exist: there are {H} heads (0 to {H - 1})", "--head")
    per_head = set(trace.meta.per_head_steps or ())
    axis = trace.meta.head_axis or 0
    steps = [replace(s, values=s.values[(slice(None),) * axis + (head,)], per_head=False, head=head)
             if s.per_head or s.name in per_head else s for s in trace.steps]
    meta = replace(trace.meta, head=head, batch_axes=["batch"] if trace.meta.batched else [], per_head_steps=[])
    dead = None if trace.dead is None else trace.dead[(slice(None),) * axis + (head,)]
    return Trace(steps=steps, query_labels=trace.query_labels, key_labels=trace.key_labels,
                 warnings=trace.warnings, meta=meta, inputs=trace.inputs, extra=trace.extra, dead=dead,
                 seq_first=trace.seq_first)


