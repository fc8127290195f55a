"""Today's models through the one pipeline: `attncli self` and `attncli run` against transformers.

The whole-layer cases of test_modern_reference.py (tiny random HF modules, eager attention,
``output_attentions=True``) are pointed at the command line: each module's weights are saved in
the textbook layout (W_q = q_proj.weight.T, ...) with its q_norm/k_norm/sinks as an .npz, the
module's own input is the X of ``attncli self``, and the weights and output the CLI prints
(--format json) or saves (--save npz) must equal the module's. ``run`` gets Q, K, V computed by
the module's own projections (and norms), 4-D (B, H, T, d) with fewer K/V heads. Every expected
number comes from transformers or torch; nothing is computed by attncli on the reference side.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from test_modern_reference import F64_TOL, LAYER_CASES, build, host, run_hf  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attncli import attend  # noqa: E402
from attncli.cli import app  # noqa: E402
from attncli.core.problem import Problem  # noqa: E402

runner = CliRunner()
F = torch.nn.functional


def err(a: Any, b: Any) -> float:
    return float(np.max(np.abs(host(a).astype(np.float64) - host(b).astype(np.float64))))


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {case: build(case) for case in LAYER_CASES}


def flags(case: str, cfg: Any, p: Any) -> list[str]:
    """The command-line options that say what the HF module does (from its config, as a user would)."""
    out = ["--heads", str(p.heads), "--kv-heads", str(p.kv_heads), "--causal"]
    if p.rope is not None:
        out += ["--rope", p.rope, "--rope-base", repr(float(p.rope_base))]
        if p.rotary_dim is not None and p.rotary_dim != p.head_dim:
            out += ["--rotary-dim", str(p.rotary_dim)]
        if p.rope_scaling and p.rope_scaling.get("rope_type", "default") != "default":
            out += ["--rope-scaling", json.dumps({**p.rope_scaling, "max_position_embeddings": p.max_positions})]
    if p.scaling is not None:
        out += ["--scale", repr(p.scaling)]
    if p.softcap is not None:
        out += ["--softcap", repr(p.softcap)]
    if p.window is not None:
        out += ["--window", str(p.window)]
    if p.alibi:
        out += ["--alibi"]
    if p.qk_norm is not None:
        out += ["--qk-norm", "rms1p" if p.qk_norm[3] else "rms", "--norm-eps", repr(p.qk_norm[2])]
    return out


def textbook(p: Any, path: Path, dtype: str = "float32") -> Path:
    """The layer's weights in the textbook layout Q = X @ W_q (nn.Linear weights transposed)."""
    w = {"W_q": p.wq.T, "W_k": p.wk.T, "W_v": p.wv.T, "W_o": p.wo.T}
    for n, b in (("b_q", p.bq), ("b_k", p.bk), ("b_v", p.bv), ("b_o", p.bo)):
        if b is not None:
            w[n] = b
    if p.qk_norm is not None:
        w["q_norm"], w["k_norm"] = p.qk_norm[0], p.qk_norm[1]
    if p.sinks is not None:
        w["sinks"] = p.sinks
    np.savez(path, **{n: np.asarray(a, dtype=dtype) for n, a in w.items()})
    return path


# No HF module here runs wholly in float64 (float32 cos/sin tables and softmax): measured within 6e-8.
TOL = {"float32": 1e-5, "float64": F64_TOL}


@pytest.mark.parametrize("how,dtype", [("json", "float32"), ("npz", "float32"), ("json", "float64")])
@pytest.mark.parametrize("case", LAYER_CASES)
def test_self_equals_hf_module(models: dict[str, Any], case: str, how: str, dtype: str, tmp_path: Path) -> None:
    model, attn, make = models[case]
    x = np.random.default_rng(10).normal(size=(2, 7, model.config.hidden_size))
    hx, out, w, seen = run_hf(model, attn, x, dtype)
    model.float()
    p = make()
    np.save(tmp_path / "x.npy", hx.astype(dtype))
    args = ["self", str(tmp_path / "x.npy"), "--weights", str(textbook(p, tmp_path / "w.npz", dtype)),
            *flags(case, model.config, p)]
    if how == "json":
        res = runner.invoke(app, [*args, "--format", "json"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        ow, oo = np.asarray(data["weights"]), np.asarray(data["output"])
        names = [s["name"] for s in data["steps"]]
    else:
        res = runner.invoke(app, [*args, "--save", str(tmp_path / "run.npz"), "--quiet"])
        assert res.exit_code == 0, res.output
        z = np.load(tmp_path / "run.npz")
        ow, oo, names = z["weights"], z["output"], list(z.keys())
    if p.residual:  # Bloom adds the residual inside its attention module
        oo = oo + host(seen["residual"])
    assert err(ow, w) < TOL[dtype], f"weights differ by {err(ow, w):.2e}"
    assert err(oo, out) < TOL[dtype], f"output differs by {err(oo, out):.2e}"
    # each variant is a named step
    want = {"q_rot": p.rope is not None, "capped": p.softcap is not None, "alibi": p.alibi,
            "sink": p.sinks is not None, "q_norm": p.qk_norm is not None, "masked": True}
    for name, present in want.items():
        assert (name in names) == present, (name, names)


def hf_qkv(case: str, attn: Any, hx: np.ndarray, p: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q (B, H, T, d), K, V (B, G, T, d) from the module's own projections (and Qwen3's own norms)."""
    t = torch.from_numpy(hx.astype(np.float32))
    B, T, _ = hx.shape
    with torch.no_grad():
        if case.startswith(("bloom", "neox")):
            name = "query_key_value"
            qkv = getattr(attn, name)(t).view(B, T, p.heads, 3, p.head_dim)  # fused, (H, 3, d) per token
            q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        else:
            q = attn.q_proj(t).view(B, T, p.heads, p.head_dim)
            k = attn.k_proj(t).view(B, T, p.kv_heads, p.head_dim)
            v = attn.v_proj(t).view(B, T, p.kv_heads, p.head_dim)
        if case.startswith("qwen3"):
            q, k = attn.q_norm(q), attn.k_norm(k)
    return tuple(a.transpose(1, 2).numpy() for a in (q, k, v))  # type: ignore[return-value]


@pytest.mark.parametrize("case", [c for c in LAYER_CASES if not c.startswith("bloom")] + ["bloom-alibi"])
def test_run_with_4d_heads_equals_hf_weights(models: dict[str, Any], case: str, tmp_path: Path) -> None:
    model, attn, make = models[case]
    x = np.random.default_rng(10).normal(size=(2, 7, model.config.hidden_size))
    hx, out, w, _ = run_hf(model.float(), attn, x, "float32")
    p = make()
    q, k, v = hf_qkv(case, attn, hx, p)
    for n, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{n}.npy", a)
    opts = [f for f in flags(case, model.config, p) if f not in ("--heads", "--kv-heads", str(p.heads), str(p.kv_heads))]
    opts = [o for o in opts if o not in ("--qk-norm", "rms", "--norm-eps", repr(p.qk_norm[2]) if p.qk_norm else "")]
    if p.sinks is not None:
        np.save(tmp_path / "sinks.npy", p.sinks.astype(np.float32))
        opts += ["--sinks", str(tmp_path / "sinks.npy")]
    res = runner.invoke(app, ["run", *(str(tmp_path / f"{n}.npy") for n in "qkv"), *opts,
                              "--save", str(tmp_path / "run.npz"), "--quiet"])
    assert res.exit_code == 0, res.output
    z = np.load(tmp_path / "run.npz")
    assert z["weights"].shape == (2, p.heads, 7, 7)
    assert err(z["weights"], w) < 1e-5


# ---- the output-only path equals the explicit path, every variant and combination ------------------

COMBOS: dict[str, dict[str, Any]] = {
    "gqa": {},
    "rope-half": {"rope": "half"},
    "rope-interleaved-partial": {"rope": "interleaved", "rotary_dim": 4},
    "rope-yarn-offset": {"rope": "half", "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 8}, "q_offset": 5},
    "alibi": {"alibi": True, "causal": True},
    "window": {"window": 3},
    "window-bottom-right": {"window": 2, "causal_align": "bottom-right"},
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": True},
    "qk-norm": {"qk_norm": "rms"},
    "gemma2": {"window": 3, "softcap": 2.0, "rope": "half", "scale": 24 ** -0.5},
    "gpt-oss": {"window": 3, "sinks": True, "rope": "half"},
    "everything": {"window": 4, "sinks": True, "rope": "interleaved", "alibi": True, "softcap": 3.0, "qk_norm": "rms1p"},
}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name", list(COMBOS))
def test_output_only_equals_explicit(name: str, backend: str) -> None:
    rng = np.random.default_rng(20)
    q, k, v = rng.normal(size=(2, 6, 9, 8)), rng.normal(size=(2, 2, 12, 8)), rng.normal(size=(2, 2, 12, 5))
    kw = dict(COMBOS[name])
    if kw.pop("sinks", False):
        kw["sinks"] = rng.normal(size=6)
    vl = np.array([[12] * 9, [7] * 9])  # (B, m): the second batch entry sees 7 keys
    full = attend(q, k, v, valid_lens=vl, backend=backend, **kw)
    fast = attend(q, k, v, valid_lens=vl, backend=backend, keep_weights=False, **kw)
    assert fast.meta.path in ("blocked", "sdpa")
    assert err(full.output, fast.output) < 1e-12
    # GQA: the explicit path equals attention with K/V repeated as HF repeat_kv (the reference's own)
    from transformers.models.llama.modeling_llama import repeat_kv

    kk = repeat_kv(torch.from_numpy(k), 3).numpy()
    vv = repeat_kv(torch.from_numpy(v), 3).numpy()
    if not any(x in kw for x in ("rope", "alibi", "softcap", "sinks", "qk_norm", "window")) and "scale" not in kw:
        keep = np.arange(12) < vl[:, None, :, None]  # (B, 1, m, n)
        ref = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, kk, vv)),
                                             attn_mask=torch.from_numpy(keep))
        assert err(full.output, ref) < 1e-12


def test_sdpa_enable_gqa_parity_and_the_fused_path() -> None:
    rng = np.random.default_rng(21)
    q, k, v = rng.normal(size=(1, 8, 40, 16)), rng.normal(size=(1, 2, 40, 16)), rng.normal(size=(1, 2, 40, 16))
    ref = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True, enable_gqa=True)
    for backend in ("numpy", "torch"):
        for keep in (True, False):
            t = attend(q, k, v, causal=True, backend=backend, keep_weights=keep)
            assert err(t.output, ref) < 1e-12
    assert attend(q, k, v, causal=True, backend="torch", keep_weights=False).meta.path == "sdpa"
    assert attend(q, k, v, causal=True, backend="torch", keep_weights=False, softcap=5.0).meta.path == "blocked"


def test_kv_cache_step_equals_the_full_sequence_rows(models: dict[str, Any], tmp_path: Path) -> None:
    """HF generation with past_key_values (gpt-oss: window + sinks + GQA + RoPE): the new queries' weights,
    and `run --q-offset P` on the new queries over every key gives the full run's last rows."""
    model, attn, make = models["gpt-oss"]
    x = np.random.default_rng(11).normal(size=(1, 9, model.config.hidden_size)).astype(np.float32)
    past = 6
    with torch.no_grad():
        first = model.float()(inputs_embeds=torch.from_numpy(x[:, :past]), use_cache=True)
        step = model(inputs_embeds=torch.from_numpy(x[:, past:]), past_key_values=first.past_key_values,
                     output_attentions=True)
    ref = step.attentions[0]  # (1, H, 3, kept keys): the sliding layer keeps the last keys only
    kept = int(ref.shape[-1])
    hx, _, w_full, _ = run_hf(model, attn, x, "float32")
    p = make()
    q, k, v = hf_qkv("gpt-oss", attn, hx, p)
    np.save(tmp_path / "q.npy", q[:, :, past:])
    np.save(tmp_path / "k.npy", k)
    np.save(tmp_path / "v.npy", v)
    np.save(tmp_path / "sinks.npy", p.sinks.astype(np.float32))
    opts = flags("gpt-oss", model.config, p)[5:]  # RoPE (yarn), window; not --heads, --kv-heads, --causal
    base = ["run", *(str(tmp_path / f"{n}.npy") for n in "qkv"), *opts, "--sinks", str(tmp_path / "sinks.npy"),
            "--save", str(tmp_path / "run.npz"), "--quiet"]
    for extra in (["--q-offset", str(past)], ["--causal", "--causal-align", "bottom-right"]):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 0, res.output
        wz = np.load(tmp_path / "run.npz")["weights"]
        assert wz.shape == (1, p.heads, 3, 9)
        assert err(wz[..., 9 - kept:], ref) < 1e-5 and not wz[..., :9 - kept].any()
        assert err(wz, w_full[:, :, past:]) < 1e-5


# ---- properties through the pipeline --------------------------------------------------------------


def test_rope_through_run_depends_on_i_minus_j_only() -> None:
    rng = np.random.default_rng(22)
    q, k = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    a = attend(q, k, k, rope="half", score="dot")
    b = attend(q, k, k, rope="half", score="dot", q_offset=7)  # queries moved by 7: i - j changes
    qk = np.concatenate([np.zeros((7, 8)), k])  # keys moved by 7 as well: i - j as before
    c = attend(q, qk, qk, rope="half", score="dot", q_offset=7)
    assert err(a["scores"], c["scores"][:, 7:]) < 1e-12
    assert err(a["scores"], b["scores"]) > 1e-3
    assert err(np.linalg.norm(a["q_rot"], axis=-1), np.linalg.norm(q, axis=-1)) < 1e-12


def test_alibi_weights_shift_invariant_and_window_n_is_causal() -> None:
    rng = np.random.default_rng(23)
    q, k = rng.normal(size=(3, 6, 4)), rng.normal(size=(3, 6, 4))
    a = attend(q, k, k, alibi=True)
    b = attend(q, k, k, alibi=True, q_offset=4)  # every bias of a row shifted by the same slope·4
    assert err(a.weights, b.weights) < 1e-12
    assert err(attend(q, k, k, window=6).weights, attend(q, k, k, causal=True).weights) == 0.0


def test_sink_share_is_one_minus_the_row_sum_and_as_gpt_oss() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    rng = np.random.default_rng(24)
    q, k, v = rng.normal(size=(1, 4, 5, 8)), rng.normal(size=(1, 2, 5, 8)), rng.normal(size=(1, 2, 5, 3))
    sinks = np.array([0.5, -1.0, 2.0, 0.0])

    class Stub:
        num_key_value_groups, head_dim, training = 2, 8, False

    stub = Stub()
    stub.sinks = torch.from_numpy(sinks)  # type: ignore[attr-defined]
    _, w = eager_attention_forward(stub, *(torch.from_numpy(a) for a in (q, k, v)), None, scaling=8 ** -0.5)
    t = attend(q, k, v, sinks=sinks)
    assert err(t.weights, w) < 1e-12
    assert err(t["sink"][..., 0], 1 - w.sum(-1)) < 1e-12


# ---- the command line: explanations and bad input --------------------------------------------------


def test_explain_names_each_stage(tmp_path: Path) -> None:
    rng = np.random.default_rng(25)
    np.save(tmp_path / "q.npy", rng.normal(size=(1, 4, 4, 4)))
    np.save(tmp_path / "k.npy", rng.normal(size=(1, 2, 4, 4)))
    np.save(tmp_path / "s.npy", np.array([0.3, -0.2, 0.1, 0.0]))
    res = runner.invoke(app, ["run", str(tmp_path / "q.npy"), str(tmp_path / "k.npy"), "--rope", "half", "--alibi",
                              "--softcap", "2", "--window", "2", "--sinks", str(tmp_path / "s.npy"),
                              "--explain", "0,3:3,2", "--explain-row", "0,3:3", "--format", "json"])
    assert res.exit_code == 0, res.output
    text = json.dumps(json.loads(res.stdout)["explanations"])
    for word in ("q_rot", "tanh", "slope", "sink", "query head 3 reads K/V head 1"):
        assert word in text, word


@pytest.mark.parametrize("args,option", [
    (["--kv-heads", "3"], "--kv-heads"),
    (["--rope", "half", "--rotary-dim", "10"], "--rotary-dim"),
    (["--rope", "half", "--rotary-dim", "3"], "--rotary-dim"),
    (["--window", "0"], "--window"),
    (["--softcap", "0"], "--softcap"),
    (["--softcap", "-2"], "--softcap"),
    (["--q-offset", "-1"], "--q-offset"),
    (["--rope", "half", "--score", "additive"], "--rope"),
    (["--alibi", "--score", "location"], "--alibi"),
    (["--rotary-dim", "4"], "--rotary-dim"),
    (["--rope", "half", "--rope-scaling", '{"rope_type": "linear"}'], "--rope-scaling"),
    (["--rope", "half", "--rope-scaling", "[1"], "--rope-scaling"),
])
def test_bad_options_one_line_exit_2(args: list[str], option: str, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(5, 16)))
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--heads", "4", *args])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and len(line) < 300 and option in line, line


def test_bad_heads_and_sinks_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "q.npy", rng.normal(size=(1, 4, 5, 8)))
    np.save(tmp_path / "k3.npy", rng.normal(size=(1, 3, 5, 8)))
    np.save(tmp_path / "q7.npy", rng.normal(size=(1, 4, 5, 7)))
    np.save(tmp_path / "s3.npy", np.zeros(3))
    for args, word in ((["q.npy", "k3.npy"], "do not divide"), (["q7.npy", "--rope", "half"], "odd"),
                       (["q.npy", "--sinks", "s3.npy"], "one logit per head")):
        res = runner.invoke(app, ["run", *(str(tmp_path / a) if a.endswith(".npy") else a for a in args)])
        assert res.exit_code == 2 and word in res.stderr and "\n" not in res.stderr.strip(), res.output


def test_window_works_with_masks_valid_lengths_and_batches() -> None:
    """A window, valid lengths and a boolean mask together: the weights equal a float64 loop over each row."""
    rng = np.random.default_rng(26)
    q, k, v = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 7, 3)), rng.normal(size=(2, 7, 2))
    mask = rng.random((2, 5, 7)) > 0.2
    vl = np.array([7, 4])
    t = attend(q, k, v, window=3, valid_lens=vl, mask=mask, causal_align="bottom-right", causal=True)
    for b in range(2):
        for i in range(5):
            pos = 2 + i  # bottom-right: query i at n - m + i
            keys = [j for j in range(7) if pos - 3 < j <= pos and j < vl[b] and mask[b, i, j]]
            s = np.array([q[b, i] @ k[b, j] / math.sqrt(3) for j in keys])
            w = np.zeros(7)
            if keys:
                w[keys] = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            assert err(t.weights[b, i], w) < 1e-12


@pytest.mark.parametrize("kw", [{"window": 7, "rope": "half"}, {"causal": True, "alibi": True},
                                {"window": 5, "causal_align": "bottom-right", "sinks": True, "softcap": 4.0},
                                {"window": 9, "q_offset": 30, "rope": "interleaved"}])
def test_blocks_and_key_chunks_skip_only_invisible_keys(kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Many blocks of queries and chunks of keys (small blocks forced), keys outside the window skipped:
    the same output as the explicit path, to 1e-12 in float64."""
    from attncli.core import blocked

    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", 2048)
    rng = np.random.default_rng(27)
    q, k, v = rng.normal(size=(1, 4, 70, 8)), rng.normal(size=(1, 2, 90, 8)), rng.normal(size=(1, 2, 90, 3))
    kw = dict(kw)
    if kw.pop("sinks", False):
        kw["sinks"] = rng.normal(size=4)
    full = attend(q, k, v, **kw)
    fast_t = attend(q, k, v, keep_weights=False, **kw)
    problem = Problem.build(q, k, v)
    assert blocked.block_rows(problem) < 70 and blocked.key_chunk(problem, blocked.block_rows(problem)) < 90  # blocks, chunks
    assert err(full.output, fast_t.output) < 1e-12


# ---- check: the classic mistakes of today's models, each computed by its reference ----------------


def _sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray, **kw: Any) -> np.ndarray:
    t = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch.from_numpy(keep), **kw)
    return t.numpy()


@pytest.mark.parametrize("mistake", ["kv-heads-tiled", "window-off-by-one", "window-one-short", "sinks-missing",
                                     "rope-other-convention", "rope-missing", "softcap-missing", "q-offset-missing"])
def test_check_names_the_mistake(mistake: str, tmp_path: Path) -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    rng = np.random.default_rng(28)
    H, G, T, d, W = 4, 2, 6, 8, 3
    q, k, v = rng.normal(size=(1, H, T, d)), rng.normal(size=(1, G, T, d)), rng.normal(size=(1, G, T, 3))
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    args = ["--window", str(W)]
    if mistake == "kv-heads-tiled":  # torch .repeat: head h reads h % G
        kt, vt = (torch.from_numpy(a).repeat(1, H // G, 1, 1).numpy() for a in (k, v))
        expected = _sdpa(q, kt, vt, (j <= i) & (j > i - W))
    elif mistake == "window-off-by-one":  # attention-gym's sliding window: i - j <= W keeps W + 1 keys
        expected = _sdpa(q, k, v, (j <= i) & (i - j <= W), enable_gqa=True)
    elif mistake == "window-one-short":
        expected = _sdpa(q, k, v, (j <= i) & (i - j < W - 1), enable_gqa=True)
    elif mistake in ("rope-missing", "softcap-missing"):  # plain SDPA: the stage the run names was left out
        args += ["--rope", "half"] if mistake == "rope-missing" else ["--softcap", "0.5"]
        expected = _sdpa(q, k, v, (j <= i) & (j > i - W), enable_gqa=True)
    elif mistake == "q-offset-missing":  # the queries at 0..T-1 though the run puts them at 4..4+T-1 over more keys
        args += ["--q-offset", "4"]
        k, v = np.concatenate([k, rng.normal(size=(1, G, 4, d))], -2), np.concatenate([v, rng.normal(size=(1, G, 4, 3))], -2)
        jj = np.arange(T + 4)[None, :]
        expected = _sdpa(q, k, v, (jj <= i) & (jj > i - W), enable_gqa=True)
    elif mistake == "sinks-missing":
        sinks = np.array([1.0, -0.5, 0.3, 2.0])
        np.save(tmp_path / "sinks.npy", sinks)
        args += ["--sinks", str(tmp_path / "sinks.npy")]
        expected = _sdpa(q, k, v, (j <= i) & (j > i - W), enable_gqa=True)
        stub = type("Stub", (), {"num_key_value_groups": H // G, "head_dim": d, "training": False,
                                 "sinks": torch.from_numpy(sinks)})()
        add = torch.from_numpy(np.where((j <= i) & (j > i - W), 0.0, -np.inf))
        right, _ = eager_attention_forward(stub, *(torch.from_numpy(a) for a in (q, k, v)), add, scaling=d ** -0.5)
        assert err(right.transpose(1, 2), expected) > 1e-3  # the sinks matter here
    else:  # GPT-J rotates pairs (2k, 2k+1); the run says half
        args += ["--rope", "half"]
        sincos = create_sinusoidal_positions(T, d)[torch.arange(T)][None]  # (1, T, d)
        sin, cos = torch.split(sincos, d // 2, dim=-1)
        qr, kr = (apply_rotary_pos_emb(torch.from_numpy(a).transpose(1, 2), sin.double(), cos.double()).transpose(1, 2)
                  .numpy() for a in (q, k))
        expected = _sdpa(qr, kr, v, (j <= i) & (j > i - W), enable_gqa=True)
    for n, a in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{n}.npy", a)
    np.save(tmp_path / "expected.npy", expected)
    res = runner.invoke(app, ["check", "-e", str(tmp_path / "expected.npy"), *(str(tmp_path / f"{n}.npy") for n in "qkv"),
                              *args, "--what", "output", "--format", "json"])
    assert res.exit_code == 1, res.output
    verdict = json.loads(res.stdout)
    assert mistake in [e["name"] for e in verdict["explanations"]], res.stdout[:2000]


@pytest.mark.parametrize("case", ["neox-partial", "llama3-rope", "llama-yarn"])
def test_rope_from_a_config_json(models: dict[str, Any], case: str, tmp_path: Path) -> None:
    """--rope-scaling config.json: the model's rope_parameters (rope_theta, partial_rotary_factor, scaling) alone."""
    model, attn, make = models[case]
    x = np.random.default_rng(10).normal(size=(2, 7, model.config.hidden_size))
    hx, out, w, _ = run_hf(model, attn, x, "float32")
    p = make()
    np.save(tmp_path / "x.npy", hx.astype(np.float32))
    cfg = model.config.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rest = [f for f in flags(case, model.config, p)]
    keep = rest[:rest.index("--rope")] + ["--rope", p.rope]  # no --rope-base, --rotary-dim, --rope-scaling
    res = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(textbook(p, tmp_path / "w.npz")), *keep,
                              "--rope-scaling", str(tmp_path / "config.json"), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert err(np.asarray(json.loads(res.stdout)["weights"]), w) < 1e-5
    bad = runner.invoke(app, ["self", str(tmp_path / "x.npy"), "--weights", str(tmp_path / "w.npz"), *keep,
                              "--rope-scaling", str(tmp_path / "config.json"), "--rope-base", "123"])
    assert bad.exit_code == 2 and "rope_theta" in bad.stderr


def test_run_multi_query_one_kv_head_is_sdpa_enable_gqa() -> None:
    """Multi-query attention in `run`: 4-D K/V with one head serve every query head (SDPA enable_gqa), on the
    explicit and the output-only path, and the problem knows it is grouped (kv_heads 1)."""
    from attncli.core.engine import attend as attend_

    r = np.random.default_rng(21)
    q, k, v = r.standard_normal((2, 4, 5, 8)), r.standard_normal((2, 1, 5, 8)), r.standard_normal((2, 1, 5, 8))
    ref = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True,
                                                           enable_gqa=True).numpy()
    for keep in (True, False):
        t = attend_(q, k, v, causal=True, keep_weights=keep, rope="half")
        assert t.meta.kv_heads == 1
    t = attend_(q, k, v, causal=True)
    np.testing.assert_allclose(t.output, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(attend_(q, k, v, causal=True, keep_weights=False).output, ref, rtol=0, atol=1e-12)
