"""ALiBi's forms (--alibi-form, attncli.core.alibi) against transformers' Falcon and Bloom and a float64 plain loop.

transformers' ``build_alibi_tensor`` adds slope_h · j at key j's absolute position, not slope_h · (j - i): the same
weights in exact arithmetic, not after its rounding. Bloom multiplies in float32; Falcon rounds the slope, the
position and their product to bfloat16 and adds the result to q·k before the 1/sqrt(d) (FalconModel's SDPA path:
``alibi / math.sqrt(head_dim)`` in its mask). The references here are transformers' own functions and modules (the
SDPA path as the model runs by default, and the eager module on the plain causal mask for the weights: its eager
path adds ALiBi twice, see tests/test_families._plain_mask), and a plain loop whose roundings go through torch's
float32 and bfloat16 arithmetic (not attncli's).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_random import randomise  # noqa: E402
from test_layouts_fused import _plain_mask  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attncli import attend  # noqa: E402
from attncli.cli import app  # noqa: E402
from attncli.core import blocked, chain, engine  # noqa: E402
from attncli.core.backend import get_backend  # noqa: E402
from attncli.core.plan import Plan  # noqa: E402
from attncli.io.model import load_layer  # noqa: E402

transformers.utils.logging.set_verbosity_error()
runner = CliRunner()


# ---- the bias itself, bit for bit, against build_alibi_tensor -------------------------------------------


def _save(kind: str, heads: int, d: int, folder: Path, layers: int = 1, **kw: Any) -> Any:
    if kind == "falcon":
        cfg = transformers.FalconConfig(hidden_size=heads * d, num_attention_heads=heads, num_hidden_layers=layers,
                                        vocab_size=64, multi_query=False, alibi=True, bias=True, **kw)
        model = transformers.FalconForCausalLM(cfg)
    else:
        cfg = transformers.BloomConfig(hidden_size=heads * d, n_head=heads, n_layer=layers, vocab_size=64, **kw)
        model = transformers.BloomForCausalLM(cfg)
    model.save_pretrained(folder)
    return model


def _bias_used(folder: Path, n: int, rows: tuple[int, int]) -> np.ndarray:
    """The ALiBi term attncli adds (after its scale step) for the queries ``rows`` of a self-attention over n
    tokens: what both the explicit and the blocked path take from chain.block. -> (H, rows, n)"""
    la = load_layer(folder, 0)
    layer = la.problem(np.zeros((n, la.projections.W_q.shape[0]), np.float32))
    core = engine.prepare(layer).core
    b = chain.block(core, get_backend("numpy"), rows)
    return np.asarray(b.alibi, dtype=np.float64)


@pytest.mark.parametrize("heads,d", [(32, 8), (6, 12), (48, 16), (5, 64)])
def test_falcon_bias_is_build_alibi_tensor_over_sqrt_d(heads: int, d: int, tmp_path: Path) -> None:
    """FalconModel's own term (its SDPA path adds ``alibi / math.sqrt(head_dim)`` to q·k/sqrt(d)) at every key of
    T = 2048 (falcon-rw-1b's 32 heads; head widths whose sqrt float32 rounds, and 64's 8), for the first and the
    last query: equal wherever torch's float32 pow rounds the slope as the exact power rounds (bit for bit on
    this CPU), and within what a slope one unit off in the last place makes of it (torch's vectorised pow is
    the CPU's instruction set's) elsewhere."""
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    n = 2048
    _save("falcon", heads, d, tmp_path)
    alibi = build_alibi_tensor(torch.ones(1, n, dtype=torch.long), heads, torch.float32)  # (H, 1, n)
    hf = (alibi / math.sqrt(d))[:, 0].double().numpy()  # (H, n): as FalconModel.forward divides it
    for rows in ((0, 1), (n - 1, n)):
        ours = _bias_used(tmp_path, n, rows)[:, 0]
        assert _within_a_slope_unit(ours, hf, alibi[:, 0, 1].double().numpy(), math.sqrt(d)), (heads, d, rows)
    # the relative form (what attncli added before) is not it: its rounding moves keys by whole units
    rel = _hf_slopes(heads)[:, None] * np.arange(n) / math.sqrt(d)  # (H, n): slope·j, unrounded
    assert np.abs(hf - rel).max() > 0.1


def _within_a_slope_unit(ours: np.ndarray, hf: np.ndarray, slopes: np.ndarray, div: float = 1.0) -> bool:
    """ours (H, n) is HF's slope·j / div where HF's float32 slope (``slopes``, (H,)) is the correctly rounded power,
    bit for bit; and for a head whose slope torch's pow rounds one unit off, within that unit times j / div, plus a
    unit of the value for its rounding."""
    same = _hf_slopes_correctly_rounded(len(slopes)) == slopes.astype(np.float32)
    ulp = np.spacing(slopes.astype(np.float32)).astype(np.float64)[:, None] * np.arange(hf.shape[-1]) / div
    near = np.abs(ours - hf) <= ulp + np.spacing(np.abs(hf).astype(np.float32))
    return bool(np.array_equal(ours[same], hf[same]) and near.all())


def _hf_slopes_correctly_rounded(heads: int) -> np.ndarray:
    """The float32 powers of transformers' float32 base, rounded once (torch's pow may differ in the last bit)."""
    p2 = 2 ** math.floor(math.log2(heads))
    base = float(np.float32(2.0 ** (-8.0 / p2)))
    sl = [base ** k for k in range(1, p2 + 1)]
    if p2 != heads:
        extra = float(np.float32(2.0 ** (-4.0 / p2)))
        sl += [extra ** k for k in range(1, 2 * (heads - p2), 2)]
    return np.array(sl, dtype=np.float32)


@pytest.mark.parametrize("heads", [16, 12, 32])
def test_bloom_bias_is_build_alibi_tensor(heads: int, tmp_path: Path) -> None:
    """Bloom's float32 slope·j (build_alibi_tensor, added unscaled by baddbmm), bit for bit at T = 2048 for every
    head whose float32 slope torch's pow rounds as the exact power rounds; a head where torch's pow is one unit
    off in the last place (head 15 of 32 on this CPU; which heads depends on the CPU's instruction set) differs by
    at most that unit times j."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    n = 2048
    _save("bloom", heads, 8, tmp_path)
    hf = build_alibi_tensor(torch.ones(1, n, dtype=torch.long), heads, torch.float32)[:, 0].double().numpy()
    ours = _bias_used(tmp_path, n, (n - 1, n))[:, 0]
    assert _within_a_slope_unit(ours, hf, hf[:, 1])  # key 1: the slope itself


# ---- whole layers beyond the old limit (257 keys) against the modules ----------------------------------


def _run_model(kind: str, folder: Path, heads: int, d: int, n: int, impl: str) -> dict[str, np.ndarray]:
    """Layer 1 of a saved model run on n tokens: its attention input x, weights w (eager) and output y."""
    cls = transformers.FalconForCausalLM if kind == "falcon" else transformers.BloomForCausalLM
    model = cls.from_pretrained(folder, attn_implementation=impl).eval()
    attn = model.transformer.h[1].self_attention
    got: dict[str, Any] = {}

    def pre(m: Any, a: Any, k: Any) -> None:
        got.setdefault("x", a[0] if a else k["hidden_states"])

    def post(m: Any, a: Any, r: Any) -> None:
        if r[1] is not None:
            got.setdefault("w", r[1])

    def proj(m: Any, a: Any, r: Any) -> None:
        got.setdefault("y", r)

    hs = [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post),
          attn.dense.register_forward_hook(proj)]
    if kind == "falcon" and impl == "eager":  # every layer, so that layer 1's input is the model's too
        hs += [b.self_attention.register_forward_pre_hook(_plain_mask, with_kwargs=True) for b in model.transformer.h]
    ids = (torch.arange(n) * 7 + 3).remainder(60)[None] + 3
    with torch.no_grad():
        model(input_ids=ids, output_attentions=impl == "eager")
    for h in hs:
        h.remove()
    return {k: v[0].double().numpy() for k, v in got.items()}


@pytest.mark.parametrize("kind,heads,d,n", [("falcon", 8, 8, 400), ("falcon", 12, 16, 600), ("bloom", 16, 8, 512)])
def test_long_input_matches_the_module(kind: str, heads: int, d: int, n: int, tmp_path: Path) -> None:
    """Falcon-ALiBi and Bloom layers on inputs far beyond the 257 keys where bfloat16 rounding of slope·j starts
    (the length attncli used to refuse for Falcon): weights and output within 1e-5 of the module (float32), the
    output against the model's default path (SDPA for Falcon) and the weights against the eager module."""
    folder = tmp_path / "m"
    model = _save(kind, heads, d, folder, layers=2)
    randomise(model)
    model.save_pretrained(folder)
    la = load_layer(folder, 1)
    for impl in ("eager", "sdpa") if kind == "falcon" else ("eager",):
        ref = _run_model(kind, folder, heads, d, n, impl)
        tr = engine.run(la.problem(ref["x"].astype(np.float32)))
        y = np.asarray(tr.step("output").values, np.float64)
        assert np.abs(y - ref["y"]).max() < 1e-5 * max(1.0, np.abs(ref["y"]).max()), impl
        if "w" in ref:
            assert np.abs(np.asarray(tr.weights, np.float64) - ref["w"]).max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("kind,tol", [("falcon", 1e-5), ("bloom", 6e-5)])
def test_t2048_32_heads_matches_the_module(kind: str, tol: float, tmp_path: Path) -> None:
    """T = 2048, 32 heads of 64 (falcon-rw-1b's heads): the output of every query (blocked path) and the weights
    of 38 queries. Falcon before the absolute-bf16 form: 0.07 (output), 0.21 (weights). Bloom's weights stay within
    its own float32 rounding of alibi + q·k/sqrt(d): at |logit| ~ 1700 one unit in the last place is 1.2e-4, which
    any other order of the dot product's sum can flip (2.9e-5 here; 3.1e-5 with the relative form on layer 0,
    9.7e-6 with absolute-f32)."""
    n, heads, d = 2048, 32, 64
    folder = tmp_path / "m"
    model = _save(kind, heads, d, folder, layers=2)
    randomise(model)
    model.save_pretrained(folder)
    la = load_layer(folder, 1)
    rows = tuple(range(0, n, 97)) + tuple(range(n - 16, n))
    for impl in ("eager", "sdpa") if kind == "falcon" else ("eager",):
        ref = _run_model(kind, folder, heads, d, n, impl)
        tr = engine.run(la.problem(ref["x"].astype(np.float32)), Plan("blocked", rows=rows))
        y = np.asarray(tr.step("output").values, np.float64)
        assert np.abs(y - ref["y"]).max() < 1e-5 * max(1.0, np.abs(ref["y"]).max()), impl
        if "w" in ref:
            assert np.abs(np.asarray(tr.step("weights").values, np.float64) - ref["w"][:, list(rows)]).max() < tol


# ---- the forms on run, against a float64 plain loop --------------------------------------------------------


def _loop_bias(form: str, slope: float, i: int, j: int, r: float | None) -> float:
    """One cell's bias, rounded by torch's own float32 / bfloat16 arithmetic; divided by r when the model adds it
    before its scale 1/r (exactly for the relative form, as a float32 division for the absolute ones)."""
    if form == "relative":
        return slope * (j - i) / (r or 1.0)
    if form == "absolute-f32":
        b = torch.tensor(slope, dtype=torch.float32) * torch.tensor(j, dtype=torch.float32)
    else:
        b = (torch.tensor(slope, dtype=torch.float32).bfloat16() * torch.tensor(j, dtype=torch.long)).float()
    return float(b if r is None else b / torch.tensor(r, dtype=torch.float32))


def _loop(q: np.ndarray, k: np.ndarray, v: np.ndarray, slopes: np.ndarray, form: str, P: int,
          causal: bool, scaled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Causal scaled-dot attention with ALiBi, one cell at a time in float64. (H, m, d), (H, n, d) -> weights, out"""
    H, m, d = q.shape
    n = k.shape[1]
    r = math.sqrt(d) if scaled else None
    table = {(h, j): _loop_bias(form, float(slopes[h]), 0, j, r) for h in range(H) for j in range(n)}
    w = np.zeros((H, m, n))
    for h in range(H):
        for i in range(m):
            row = []
            for j in range(n):
                if causal and j > P + i:
                    row.append(-math.inf)
                    continue
                s = sum(float(q[h, i, t]) * float(k[h, j, t]) for t in range(d)) / math.sqrt(d)
                b = _loop_bias(form, float(slopes[h]), P + i, j, r) if form == "relative" else table[h, j]
                row.append(s + b)
            mx = max(row)
            e = [math.exp(x - mx) for x in row]
            w[h, i] = [x / sum(e) for x in e]
    return w, w @ v


def _hf_slopes(heads: int) -> np.ndarray:
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    return _get_alibi_slopes(heads, torch.device("cpu")).double().numpy()


@pytest.mark.parametrize("form,scaled", [("relative", False), ("relative", True), ("absolute-f32", False),
                                         ("absolute-bf16", True), ("absolute-bf16", False)])
def test_forms_match_a_plain_loop_on_every_path(form: str, scaled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KV-cache step (4 queries at positions 596..599 over 600 keys, 2 heads of 16) with each form: the explicit
    path's weights and output, and the blocked path in blocks of a few rows and chunks of keys (the bias computed
    per block), against the loop; --alibi-scaled divides the bias by sqrt(d) (Falcon adds it before its scale).
    The slopes are torch's build_alibi_tensor ones for 2 heads (powers of two, exact)."""
    g = np.random.default_rng(3)
    H, m, n, d = 2, 4, 600, 16
    q, k, v = g.standard_normal((H, m, d)), g.standard_normal((H, n, d)), g.standard_normal((H, n, d))
    slopes = _hf_slopes(H)
    P = n - m
    w_ref, y_ref = _loop(q, k, v, slopes, form, P, True, scaled)
    kw = dict(alibi=True, alibi_form=form, alibi_scaled=scaled, causal=True, causal_align="bottom-right")
    t = attend(q, k, v, **kw)
    assert np.abs(np.asarray(t.weights) - w_ref).max() < 1e-12
    assert np.abs(np.asarray(t.output) - y_ref).max() < 1e-12
    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", 256)  # blocks of rows, chunks of 128 keys: an online softmax
    monkeypatch.setattr(blocked, "MIN_BLOCK", 1)
    monkeypatch.setattr(blocked, "MIN_KEYS", 128)
    out = attend(q, k, v, keep_weights=False, backend="torch", **kw)
    assert out.meta.path == "blocked"  # the fused kernel refuses a bias (chain.STAGES)
    assert np.abs(np.asarray(out.output) - y_ref).max() < 1e-12


def test_absolute_forms_differ_from_relative_by_their_rounding_only() -> None:
    """The three forms give the same weights up to rounding (a constant per row is the softmax's), and the bf16
    form's rounding shows at long lengths: q = k = 0 leaves ALiBi alone in the scores."""
    H, n = 4, 1024
    z = np.zeros((H, n, 8))
    w = {f: np.asarray(attend(z, z, z, alibi=True, alibi_form=f, causal=True).weights) for f in
         ("relative", "absolute-f32", "absolute-bf16")}
    assert np.abs(w["absolute-f32"] - w["relative"]).max() < 1e-4
    assert np.abs(w["absolute-bf16"] - w["relative"]).max() > 1e-2  # bf16(slope·j) moves keys by whole units


# ---- the command line ----------------------------------------------------------------------------------


def test_cli_option_and_explain_show_the_bias(tmp_path: Path) -> None:
    """--alibi-form absolute-bf16 --alibi-scaled (Falcon's) on run: the JSON weights are the loop's, and --explain
    of a cell names the form and the value added (torch's bf16 product over sqrt(d), in float32)."""
    g = np.random.default_rng(5)
    H, n, d = 2, 300, 4
    q, k = g.standard_normal((H, n, d)), g.standard_normal((H, n, d))
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "k.npy", k)
    args = ["run", str(tmp_path / "q.npy"), str(tmp_path / "k.npy"), "--alibi", "--alibi-form", "absolute-bf16",
            "--alibi-scaled", "--causal"]
    res = runner.invoke(app, [*args, "--format", "json"])
    assert res.exit_code == 0, res.stderr
    w_ref, _ = _loop(q[:, -3:], k, k, _hf_slopes(H), "absolute-bf16", n - 3, True, scaled=True)
    assert np.abs(np.array(json.loads(res.stdout)["weights"])[:, -3:] - w_ref).max() < 1e-12
    res = runner.invoke(app, [*args, "--explain", "1:299,260"])  # head 1 (axis -3 of Q: the heads)
    assert res.exit_code == 0, res.stderr
    line = " ".join(res.stdout.split())
    b = _loop_bias("absolute-bf16", float(_hf_slopes(H)[1]), 299, 260, math.sqrt(d))
    assert "· bf16(260)) / 2) = " in line and f"+ {b!r} =" in line, line
    assert "absolute-bf16" in line


@pytest.mark.parametrize("extra,culprit", [
    (["--alibi-form", "absolute-bf16"], "--alibi-form"),  # without --alibi
    (["--alibi-scaled"], "--alibi-scaled"),  # without --alibi
    (["--alibi", "--alibi-scaled", "--scaling", "norm"], "--alibi-scaled"),  # a scale of the scores themselves
    (["--alibi", "--alibi-scaled", "--softcap", "3"], "--alibi-scaled"),  # the model's bias before the cap
])
def test_cli_refusals_are_one_line(extra: list[str], culprit: str, tmp_path: Path) -> None:
    np.save(tmp_path / "q.npy", np.ones((2, 5, 4)))
    res = runner.invoke(app, ["run", str(tmp_path / "q.npy"), *extra])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"attncli: error: {culprit}: "), res.stderr
    assert len(lines[0]) < 300


def test_cli_unknown_form_is_one_line_from_the_shell(tmp_path: Path) -> None:
    import subprocess
    import sys

    np.save(tmp_path / "q.npy", np.ones((2, 5, 4)))
    res = subprocess.run([sys.executable, "-m", "attncli", "run", "q.npy", "--alibi", "--alibi-form", "nope"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert "--alibi-form" in res.stderr and "absolute-bf16" in res.stderr


@pytest.mark.parametrize("given", [["--alibi"], ["--sinks", "SINKS"]])
def test_a_3d_input_with_per_head_options_names_its_first_axis_heads(given: list[str], tmp_path: Path) -> None:
    """Q (H, T, d) with ALiBi or sinks: axis -3 holds the heads whose slopes (sinks) apply, so the panels say
    "head h of H" (they said "batch [h]"), the JSON's batch_axes is ["head"]; head h's weights are the causal softmax
    of q·k/sqrt(d) + slope_h · j with Bloom's slopes for H heads (transformers' build_alibi_tensor), in float64."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    H, T, d = 3, 5, 8
    q = np.random.default_rng(4).standard_normal((H, T, d))
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "sinks.npy", np.array([0.5, -1.0, 2.0]))
    args = ["run", str(tmp_path / "q.npy"), "--causal", *[str(tmp_path / "sinks.npy") if a == "SINKS" else a
                                                           for a in given]]
    text = CliRunner().invoke(app, [*args, "--steps", "weights"])
    assert text.exit_code == 0, text.output
    assert [f"head {h} of {H}" in text.stdout for h in range(H)] == [True] * H and "batch [" not in text.stdout
    res = CliRunner().invoke(app, [*args, "--format", "json"])
    doc = json.loads(res.stdout)
    assert doc["batch_axes"] == ["head"] and doc["head_axis"] == 0
    s = np.einsum("htd,hsd->hts", q, q) / math.sqrt(d)
    if given == ["--alibi"]:
        s = s + build_alibi_tensor(torch.ones(1, T, dtype=torch.long), H, torch.float64).numpy()  # (H, 1, T)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    z = e.sum(-1, keepdims=True)
    if given != ["--alibi"]:  # gpt-oss's sinks: one more logit per head in the denominator
        z = z + np.exp(np.array([0.5, -1.0, 2.0])[:, None, None] - s.max(-1, keepdims=True))
    np.testing.assert_allclose(np.array(doc["weights"]), e / z, rtol=1e-12, atol=1e-15)
