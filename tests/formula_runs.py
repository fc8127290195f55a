"""A broad set of runs for the formula tests (tests/test_formulas.py): every score, every scaling rule, soft-cap, every
mask kind, ALiBi in each form (scaled, offset, given slopes), sinks, hard attention and dropout, RoPE variants (partial,
offset, scalings, held frequencies), Llama 4's tuning, QK-norm of each kind (per head, with biases, full width, after
RoPE), grouped-query heads, and layers: biases and origins, cross-attention, a batch with key padding, pre-norms,
output gates with sub-norms, DeepSeek's MLA, T5's relative bias, the blocked and fused paths, corner rows; and a view of
one head of each layer. ``python tests/formula_runs.py FILE`` writes their formulas, {run: [[step, formula], ...]}: how
tests/golden/formulas_main.json was made (from main before issue 30's item 7)."""

from __future__ import annotations

import json
import sys

import numpy as np

from attncli.core.engine import attend, multihead, run, select_head
from attncli.core.layer import Layer
from attncli.core.options import Options
from attncli.core.plan import Plan
from attncli.core.projections import Gate, Latent, Norm, Projections, RelativeBias
from attncli.core.trace import Trace


def runs() -> dict[str, Trace]:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4))
    k = rng.standard_normal((2, 5, 4))
    out: dict[str, Trace] = {}
    for score in ("dot", "scaled-dot", "general", "additive", "cosine", "gaussian", "location"):
        out[f"score-{score}"] = attend(q, k, k, score=score, seed=3)
        out[f"score-{score}-b"] = attend(
            q,
            k,
            k,
            score=score,
            seed=3,
            causal=True,
            temperature=2.0,
            activation="relu" if score in ("additive", "location") else None,
        )
    out["gauss-bw"] = attend(q, k, k, score="gaussian", bandwidth=0.5)
    out["gauss-w"] = attend(q, k, k, score="gaussian", score_weights={"w": np.array([1.0, 2, 3, 4])})
    out["general-b"] = attend(q, k, k, score="general", score_weights={"W": np.eye(4), "b": np.ones(4)})
    out["additive-b"] = attend(
        q, k, k, score="additive", params={"W_q": np.eye(4), "W_k": np.eye(4), "w_v": np.ones(4), "b": np.ones(4)}
    )
    out["location-b"] = attend(q, k, k, score="location", score_weights={"W": np.ones(4), "b": np.array(0.5)})
    for sc in ("none", "sqrt-d", "seq", "norm"):
        out[f"scaling-{sc}"] = attend(q, k, k, scaling=sc)
        out[f"scaling-{sc}-T"] = attend(q, k, k, scaling=sc, temperature=0.7)
    out["scale"] = attend(q, k, k, scale=0.3)
    out["scale-T"] = attend(q, k, k, scale=0.3, temperature=3)
    out["T-only"] = attend(q, k, k, temperature=3)
    out["cap"] = attend(q, k, k, softcap=5.0, score="scaled-dot")
    out["mask-value"] = attend(q, k, k, causal=True, mask_value=-1e6)
    out["floatmask"] = attend(q, k, k, mask=rng.standard_normal((3, 5)))
    out["boolmask"] = attend(q, k, k, mask=rng.random((3, 5)) > 0.3)
    out["valid"] = attend(q, k, k, valid_lens=np.array([2, 4]))
    out["window"] = attend(q, k, k, window=2, causal=True)
    out["chunk"] = attend(q, k, k, chunk=2)
    out["local"] = attend(q, k, k, local_window=1)
    qh = rng.standard_normal((1, 4, 6, 8))
    kh = rng.standard_normal((1, 4, 6, 8))
    for form in ("relative", "absolute-f32", "absolute-bf16"):
        out[f"alibi-{form}"] = attend(qh, kh, kh, alibi=True, alibi_form=form, causal=True, score="scaled-dot")
        out[f"alibi-{form}-scaled"] = attend(qh, kh, kh, alibi=True, alibi_form=form, alibi_scaled=True, score="scaled-dot")
        out[f"alibi-{form}-off"] = attend(qh[:, :, :2], kh, kh, alibi=True, alibi_form=form, q_offset=4, score="scaled-dot")
    out["alibi-given"] = attend(qh, kh, kh, alibi=True, alibi_slopes=np.array([0.5, 0.25, 0.1, 0.05]))
    out["sinks"] = attend(qh, kh, kh, sinks=np.array([0.5, -1.0, 0.0, 2.0]), causal=True)
    out["sinks-inf"] = attend(qh, kh, kh, sinks=np.array([0.5, -np.inf, 0.0, 2.0]), hard=True)
    out["hard"] = attend(q, k, k, hard=True)
    out["dropout"] = attend(q, k, k, dropout=0.25, seed=4)
    out["hard-dropout"] = attend(q, k, k, dropout=0.25, hard=True)
    for mode in ("half", "interleaved", "half-reversed"):
        out[f"rope-{mode}"] = attend(qh, kh, kh, rope=mode, causal=True)
    out["rope-partial-off"] = attend(qh[:, :, :3], kh, kh, rope="half", rotary_dim=4, q_offset=3, rope_base=500.0)
    out["rope-scaling"] = attend(
        qh, kh, kh, rope="half", rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4}
    )
    out["rope-linear"] = attend(qh, kh, kh, rope="half", rope_scaling={"rope_type": "linear", "factor": 2.0})
    out["rope-freqs"] = attend(qh, kh, kh, rope="half", rope_freqs="bfloat16")
    out["tuning"] = attend(qh, kh, kh, tuning_scale=0.1, tuning_floor=4.0, q_offset=2)
    out["tuning-rope-norm"] = attend(qh, kh, kh, tuning_scale=0.1, rope="half", qk_norm="rms", qk_norm_at="after-rope")
    for kind in ("rms", "rms1p", "layernorm", "rms-full"):
        out[f"qknorm-{kind}"] = attend(qh, kh, kh, qk_norm=kind, rope="half")
    gq = rng.standard_normal((1, 4, 6, 8))
    gk = rng.standard_normal((1, 2, 6, 8))
    out["gqa"] = attend(gq, gk, gk, rope="half", qk_norm="rms", causal=True)
    # layers
    x = rng.standard_normal((5, 8))
    w = {n: rng.standard_normal((8, 8)) / 3 for n in ("W_q", "W_k", "W_v", "W_o")}
    wb = w | {n: rng.standard_normal(8) / 3 for n in ("b_q", "b_k", "b_v", "b_o")}
    out["layer"] = multihead(x, weights=Projections(**w), heads=2)
    out["layer-b"] = multihead(
        x,
        weights=Projections(**wb, origin={"W_q": "model.layers.0.q_proj.weightᵀ", "b_o": "o.bias"}),
        heads=2,
        sinks=np.array([0.5, -1.0]),
        options=Options(rope="half", qk_norm="rms", softcap=5.0, window=3, causal=True, clip_qkv=2.0, hard=True),
    )
    out["layer-norms"] = multihead(
        x,
        weights=Projections(
            **w,
            q_norm=1 + rng.random((2, 4)),
            k_norm=1 + rng.random((2, 4)),
            q_norm_bias=rng.random((2, 4)),
            k_norm_bias=rng.random((2, 4)),
        ),
        heads=2,
        options=Options(qk_norm="layernorm"),
    )
    out["layer-fullnorm"] = multihead(
        x,
        weights=Projections(**w, q_norm=1 + rng.random(8), k_norm=1 + rng.random(8)),
        heads=2,
        options=Options(qk_norm="rms-full"),
    )
    wk = {"W_q": w["W_q"], "W_k": w["W_k"][:, :4], "W_v": w["W_v"][:, :4], "W_o": w["W_o"]}
    out["layer-gqa"] = multihead(x, weights=Projections(**wk), heads=2, options=Options(rope="interleaved", causal=True))
    y = rng.standard_normal((4, 8))
    z = rng.standard_normal((4, 8))
    out["layer-cross"] = multihead(x, y, z, weights=Projections(**w), heads=2)
    out["layer-batched"] = multihead(
        np.stack([x, x]), weights=Projections(**w), heads=2, key_padding_mask=np.array([[False] * 5, [False] * 3 + [True] * 2])
    )
    for act in ("sigmoid", "softplus"):
        for width in (8, 2):
            L = Layer.build(
                x,
                projections=Projections(**w),
                heads=2,
                pre_norm=Norm("rms", np.ones(8), None, 1e-5, "input_layernorm.weight"),
                gate=Gate(act, rng.standard_normal((8, width)), "gate_proj.weight"),
                sub_norm=Norm("rms", np.ones(8), None, 1e-6, "attn_sub_norm.weight"),
            )
            out[f"layer-gate-{act}-{width}"] = run(L)
    for kind in ("layernorm", "rms1p"):
        L = Layer.build(
            x,
            projections=Projections(**w),
            heads=2,
            pre_norm=Norm(kind, np.ones(8), np.zeros(8) if kind.startswith("layer") else None, 1e-5, ""),
        )
        out[f"layer-prenorm-{kind}"] = run(L)
    lat = Latent(
        W_kva=rng.standard_normal((8, 6 + 2)),
        kv_a_norm=np.ones(6),
        d_nope=2,
        d_rope=2,
        W_qa=rng.standard_normal((8, 5)),
        q_a_norm=np.ones(5),
        origin={"W_kva": "kv_a_proj_with_mqa.weightᵀ"},
    )
    wl = {
        "W_q": rng.standard_normal((5, 8)),
        "W_k": rng.standard_normal((6, 4)),
        "W_v": rng.standard_normal((6, 8)),
        "W_o": w["W_o"],
    }
    out["layer-mla"] = multihead(x, weights=Projections(**wl, latent=lat), heads=2, options=Options(rope="interleaved"))
    for path in ("blocked", "sdpa"):
        L = Layer.build(
            x,
            projections=Projections(**w),
            heads=2,
            options=Options(keep_weights=False, backend="torch" if path == "sdpa" else None),
        )
        out[f"path-{path}"] = run(L, Plan(path))
    big = Layer.build(rng.standard_normal((40, 8)), projections=Projections(**w), heads=2)
    out["corners"] = run(big, Plan("blocked", rows=(0, 1, 38, 39)))
    rb = RelativeBias(rng.standard_normal((8, 2)), True, 8, 16, "rel.weight")
    out["relbias"] = run(Layer.build(x, projections=Projections(**w), heads=2, relative_bias=rb, options=Options(alibi=True)))
    out["relbias2"] = run(Layer.build(x, projections=Projections(**w), heads=2, relative_bias=rb))
    for k in list(out):
        if out[k].meta.heads:
            out[k + "@head1"] = select_head(out[k], 1)
    return out


def formulas(traces: dict[str, Trace]) -> dict[str, list[list[str]]]:
    return {k: [[s.name, s.formula] for s in t.steps] for k, t in traces.items()}


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as fh:
        json.dump(formulas(runs()), fh, indent=0, ensure_ascii=False, sort_keys=True)
